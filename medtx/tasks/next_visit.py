"""Task `next_visit`: the diagnoses of a patient's next visit from the visits so far (BEHRT-style; builder
and rule in medtx/samples/next_visit.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import EHR_SAMPLE_EXTRAS, EHR_VISIT_READS, BuildContext, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    from medtx.samples.next_visit import build_next_visit

    return build_next_visit(con, ctx.dataset, seed=ctx.seed, fractions=ctx.fractions, min_count=ctx.min_count)


TASK = Task(
    name="next_visit",
    kind="multilabel",
    family="ehr",
    sample_table="samples.next_visit",
    sample_columns=("dataset", "subject_id", "hadm_id", "next_hadm_id", "prediction_time", "visits", "ages", "codes",
                    "segments",
                    "ages_flat", "positions", "label"),
    features=("visits",),
    label_column="label",
    label_feature="label",
    split_unit="patient",
    metrics=("pr_auc_samples", "roc_auc_samples", "recall_at_10", "recall_at_20", "f1_samples"),
    monitor="pr_auc_samples",
    tune_metric="f1_samples",
    recall_ks=(10, 20),
    compared=(("pr_auc_samples", "visit"), ("f1_samples", "visit")),
    copy_source="visits",  # the current visit's diagnoses
    oracle_code_column="icd9_code",
    visit_ages="ages",
    meds_split_rank=2,
    # models: every EHR model serving a multi-label task whose features it finds (the default; seq2seq needs
    # the visit's diagnoses and procedures as separate columns)
    build=build,
    reads=EHR_VISIT_READS,
    writes=("samples.next_visit", *EHR_SAMPLE_EXTRAS),
    # BEHRT: the copy gate from the current visit's diagnoses (recency 0), chosen on validation (issue #5).
    model_defaults={"behrt": {"copy_recencies": (0,)}},
    prediction_time="dischtime",
    clock="at the discharge of the history's last visit (BEHRT convention)",
    observation_window="every visit with diagnoses up to and including the last one of the history",
    feature_sources=(("visits", "diagnosis"),),
    order=20,
    description="diagnoses of the next visit (multi-label) from all visits so far",
)
