"""Task `drug_rec`: the ATC-3 drugs of a visit from its diagnoses and procedures and the patient's history
(PyHealth's `drug_recommendation_mimic3_fn`, set-based). Its record and its SQL (`samples.drug_rec`).

Per admission: conditions = ICD-9 diagnoses, procedures = ICD-9 procedures, drugs = mapped ATC-3 codes.
Visits lacking any of the three are skipped; patients left with fewer than 2 visits are dropped. Visits are
ordered by admittime (then hadm_id). Each sample's conditions/procedures/drugs_hist are the per-visit lists
of all kept visits up to and including the current one, with the current visit's drugs blanked in
drugs_hist (`drugs_hist[-1] = []`); the label `drugs` is the current visit's ATC-3 set (sorted).
`medtx.samples.reference.drug_rec_reference` is the same definition as a plain per-patient loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import (EHR_VISIT_READS, BuildContext, Clock, CohortExclusion, Samples, Scoring, Task,
                              ehr_lineage)
from medtx.tasks.history import HistoryRows

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

NAME = "drug_rec"
TABLE = "samples.drug_rec"
# The SafeDrug/PyHealth convention: the drugs of a visit are recommended once its diagnoses and procedures are
# coded, i.e. at discharge; the current visit's own drugs (the label) are blanked from the features.
PREDICTION_TIME = "dischtime"

KEPT = "len(conditions) > 0 AND len(procedures) > 0 AND len(drugs) > 0"

# The samples' index admissions: every kept visit of a patient with 2 or more kept visits.
INDEX_SQL = f"""
    SELECT subject_id, hadm_id FROM (
        SELECT subject_id, hadm_id, count(*) OVER (PARTITION BY subject_id) AS n_kept
        FROM _samples_visits WHERE {KEPT}
    ) WHERE n_kept >= 2"""

# Features come from the history relation (medtx.samples.common.create_history: only what the clock shows at
# the prediction time, the current visit's discharge); the label is the current visit's drugs.
DRUG_REC_SQL = """
    SELECT $dataset AS dataset, h.subject_id, h.hadm_id, CAST(h.n_visits - 1 AS INTEGER) AS visit_index,
           v.admittime, h.prediction_time, h.conditions, h.procedures,
           list_concat(h.drugs[1:len(h.drugs) - 1], [[]::VARCHAR[]]) AS drugs_hist,
           v.drugs
    FROM _samples_history h JOIN _samples_visits v USING (hadm_id)"""

# Each kept visit is the last history element of exactly one sample, so these count every visit once.
VOCAB = {
    "conditions": "conditions[-1]",
    "procedures": "procedures[-1]",
    "drugs_hist": "drugs",  # history drugs are earlier visits' labels: the same ATC-3 space
    "drugs": "drugs",
}


ROWS = HistoryRows(
    task=NAME, table=TABLE, prediction_time=PREDICTION_TIME, index_sql=INDEX_SQL, visits_sql=KEPT,
    rows_sql=DRUG_REC_SQL, vocab=VOCAB,
    figures={"mean_labels_per_visit": "avg(len(drugs))",
             "distinct_labels": f"(SELECT count(DISTINCT d) FROM (SELECT unnest(drugs) AS d FROM _samples_{NAME}))"},
)


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite `samples.drug_rec` (+ splits, vocab, summary) for one dataset from `_samples_visits`."""
    return ROWS.build(con, ctx, empty=lambda stats: _empty_cohort(con, ctx.dataset, stats))


def _empty_cohort(con: duckdb.DuckDBPyConnection, dataset: str | None, stats: dict[str, int]) -> str:
    """Why the dataset has no sample, with the step to run when the drugs were never mapped."""
    params = {"dataset": dataset}
    mapped = con.execute("SELECT count(*) FROM core.prescriptions_atc3 WHERE dataset = $dataset", params
                         ).fetchall()[0][0]
    # map-codes writes its coverage rows even when it maps nothing: that is how we know it has run
    coverage = dict(con.execute(
        "SELECT route, n_rows FROM core.mapping_coverage WHERE dataset = $dataset AND kind = 'route'", params
    ).fetchall())
    if not coverage:
        hint = f" - run `medtx map-codes --dataset {dataset}` first"
    elif not mapped:
        hint = (f"; map-codes has run and mapped none of its prescriptions ({coverage.get('no_ndc', 0)} rows "
                f"without an NDC, {coverage.get('unmapped', 0)} with an NDC no map knows): see the drug routes "
                "in docs/MEDS.md")
    else:
        hint = ""
    return (f"drug_rec: no patient of dataset {dataset!r} has 2 or more visits with diagnoses, procedures and "
            f"mapped drugs ({stats['cohort_visits']} admissions, {stats['visits_with_all_three']} with all three code "
            f"types; core.prescriptions_atc3 holds {mapped} rows for it{hint})")


# The cohort flow, from the summary figures the builder stores (ROWS): incomplete visits, then the kept visits of
# patients with fewer than two
EXCLUSIONS = (
    CohortExclusion("incomplete_visit", "visit lacking diagnoses, procedures or mapped drugs",
                    "len(conditions) = 0 OR len(procedures) = 0 OR len(drugs) = 0", counted="figures",
                    figures=("cohort_visits", "visits_with_all_three")),
    CohortExclusion("fewer_than_2_visits", "the patient has fewer than 2 kept visits",
                    "count(kept visits of the patient) < 2", counted="figures",
                    figures=("visits_with_all_three", "samples")),
)


# Both copy-gate defaults were chosen on validation (issue #5; medtx/models/transformer.py, behrt.py); the
# transformer's also apply to transformer_rope (medtx/models/registry.py).
TASK = Task(
    name=NAME,
    kind="multilabel",
    family="ehr",
    description="ATC-3 drug set of a visit (multi-label), history of diagnoses, procedures and drugs",
    order=10,
    clock=Clock(
        prediction_time=PREDICTION_TIME,
        words="at the current visit's discharge (SafeDrug/PyHealth convention)",
        observation_window="all kept visits up to and including the current one; the current visit's drugs blanked",
        feature_sources=(("conditions", "diagnosis"), ("procedures", "procedure"), ("drugs_hist", "drug")),
        # No bound: the label's drugs are prescribed during the stay, before its discharge (the convention
        # recommends a stay's drug set in retrospect; docs/TASKS.md).
        outcome="the ATC-3 drugs prescribed during the current visit",
    ),
    samples=Samples(
        table=TABLE,
        columns=("dataset", "subject_id", "hadm_id", "visit_index", "admittime", "prediction_time", "conditions",
                 "procedures", "drugs_hist", "drugs"),
        features=("conditions", "procedures", "drugs_hist"),
        label_column="drugs",
        label_feature="drugs",
        split_unit="patient",
    ),
    lineage=ehr_lineage(TABLE, build,
                        reads=(*EHR_VISIT_READS, "core.mapping_coverage"),  # the empty-cohort hint: has map-codes run?
                        train_reads=("ref.ddi_atc3",),  # the DDI rate of predicted drug sets
                        exclusions=EXCLUSIONS),
    scoring=Scoring(
        metrics=("pr_auc_samples", "jaccard_samples", "f1_samples", "ddi_rate", "avg_pred_size"),
        monitor="pr_auc_samples",
        tune_metric="jaccard_samples",
        compared=(("pr_auc_samples", "visit"), ("jaccard_samples", "visit")),
    ),
    # models: every EHR model serving a multi-label task (the default)
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
        # copy_last copies the last drug set of the history; drugs_hist[-1] is the blanked current visit
        "copy_last": {"source": "drugs_hist", "skips_current": True},
        "oracle": {"code_column": "atc3"},  # the label column of raw.synth_oracle_drug_rec
    },
    # The transformer trains on length-bucketed batches (TrainConfig.length_buckets: pools of up to 16 batches, at
    # least 8 pools an epoch; issue #18): batches of similar history length, so less of each batch is padding. Same
    # samples, same model; only which samples share a batch changes, and small training sets keep the plain shuffle
    # bit for bit. synth_10000, seeds 0-5, paired by seed: best val PR-AUC -0.0006 to +0.0006 (mean +0.0001) against
    # the plain shuffle. Not transformer_rope: its mean moved -0.0003 (-0.0011 to +0.0005), so it was left alone
    # (benchmarks/README.md, round 5).
    train_defaults={"transformer": {"length_buckets": 16}},
)
