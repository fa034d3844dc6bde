"""Task `drug_rec`: the ATC-3 drugs of a visit from its diagnoses and procedures and the patient's history
(PyHealth drug_recommendation_mimic3_fn; builder and rule in medtx/samples/drug_rec.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import EHR_SAMPLE_EXTRAS, EHR_VISIT_READS, BuildContext, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    from medtx.samples.drug_rec import build_drug_rec

    return build_drug_rec(con, ctx.dataset, seed=ctx.seed, fractions=ctx.fractions, min_count=ctx.min_count)


# Both copy-gate defaults were chosen on validation (issue #5; medtx/models/transformer.py, behrt.py); the
# transformer's also apply to transformer_rope (medtx/models/registry.py).
TASK = Task(
    name="drug_rec",
    kind="multilabel",
    family="ehr",
    sample_table="samples.drug_rec",
    sample_columns=("dataset", "subject_id", "hadm_id", "visit_index", "admittime", "prediction_time", "conditions",
                    "procedures", "drugs_hist", "drugs"),
    features=("conditions", "procedures", "drugs_hist"),
    label_column="drugs",
    label_feature="drugs",
    split_unit="patient",
    metrics=("pr_auc_samples", "jaccard_samples", "f1_samples", "ddi_rate", "avg_pred_size"),
    monitor="pr_auc_samples",
    tune_metric="jaccard_samples",
    compared=(("pr_auc_samples", "visit"), ("jaccard_samples", "visit")),
    copy_source="drugs_hist",
    copy_skips_current=True,  # drugs_hist[-1] is the blanked current visit
    oracle_code_column="atc3",
    meds_split_rank=1,
    # models: every EHR model serving a multi-label task (the default)
    build=build,
    reads=EHR_VISIT_READS,
    writes=("samples.drug_rec", *EHR_SAMPLE_EXTRAS),
    train_reads=("ref.ddi_atc3",),  # the DDI rate of predicted drug sets
    model_defaults={
        # The last 2 visits, 64 codes per feature and no dropout on the attention weights: chosen on synth_10000
        # validation (2026-11-24, 8 epochs, batch 32, seeds 0/1; val PR-AUC 0.7738 / 0.7745 against the generic
        # defaults' 0.7732 / 0.7733) and 2x the training samples/s (issue #18; benchmarks/README.md). One attention
        # head: the same sweep, val PR-AUC 0.7741 / 0.7753 against 4 heads' 0.7738 / 0.7745 and 2 heads' 0.7736 /
        # 0.7748, and 3-4x less attention time (head width 32 instead of 8; benchmarks/README.md, round 3).
        # One joint sequence (all features' codes, one encoder; TransformerConfig.joint_sequence): synth_10000, 10
        # epochs, batch 32, seeds 0-7 paired, best val PR-AUC against one encoder per feature: higher in 8 of 8 seeds
        # for transformer (+0.0002 to +0.0023, mean +0.0011) and transformer_rope (+0.0001 to +0.0032, mean +0.0015);
        # a training step about 8 ms instead of 14 on one thread (issue #18; benchmarks/README.md, round 7).
        "transformer": {"copy_feature": "drugs_hist", "max_visits": 2, "max_codes": 64, "attention_dropout": 0.0,
                        "n_heads": 1, "joint_sequence": True},
        "behrt": {"copy_feature": "drugs_hist", "copy_recencies": (1,)},
    },
    # The transformer trains on length-bucketed batches (TrainConfig.length_buckets: pools of up to 16 batches, at
    # least 8 pools an epoch; issue #18): batches of similar history length, so less of each batch is padding. Same
    # samples, same model; only which samples share a batch changes, and small training sets keep the plain shuffle
    # bit for bit. synth_10000, seeds 0-5, paired by seed: best val PR-AUC -0.0006 to +0.0006 (mean +0.0001) against
    # the plain shuffle. Not transformer_rope: its mean moved -0.0003 (-0.0011 to +0.0005), so it was left alone
    # (benchmarks/README.md, round 5).
    train_defaults={"transformer": {"length_buckets": 16}},
    # The SafeDrug/PyHealth convention: the drugs of a visit are recommended once its diagnoses and procedures are
    # coded, i.e. at discharge; the current visit's own drugs (the label) are blanked from the features.
    prediction_time="dischtime",
    clock="at the current visit's discharge (SafeDrug/PyHealth convention)",
    observation_window="all kept visits up to and including the current one; the current visit's drugs blanked",
    feature_sources=(("conditions", "diagnosis"), ("procedures", "procedure"), ("drugs_hist", "drug")),
    order=10,
    description="ATC-3 drug set of a visit (multi-label), history of diagnoses, procedures and drugs",
)
