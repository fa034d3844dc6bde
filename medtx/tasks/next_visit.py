"""Task `next_visit`: the diagnoses of a patient's next visit from the visits so far (BEHRT-style). Its record
and its SQL (`samples.next_visit`).

A patient's visits with at least one diagnosis, ordered by admittime (then hadm_id). For every visit that
has a following one: `visits` = the diagnosis lists up to and including it, `ages` = age at each visit
(whole years, capped at 90), and the BEHRT flattening `codes = [CLS] v1 [SEP] v2 [SEP] ...` with aligned
`segments` (visit k -> k % 2; [CLS] takes visit 0's), `ages_flat` and `positions` (visit number, from 0).
Each [SEP] belongs to the visit it closes. `label` = the next visit's diagnoses. Single-visit patients give
no sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import BuildContext, Clock, CohortExclusion, Samples, Scoring, Task, ehr_lineage
from medtx.tasks.history import HistoryRows

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

NAME = "next_visit"
TABLE = "samples.next_visit"
PREDICTION_TIME = "dischtime"

CLS, SEP, MASK = "[CLS]", "[SEP]", "[MASK]"

HAS_DX = "len(conditions) > 0"

# Each visit with diagnoses that has a following one, with that next visit (the label's).
NEXT_SQL = f"""
    SELECT * FROM (
        SELECT subject_id, hadm_id, lead(hadm_id) OVER w AS next_hadm_id, lead(conditions) OVER w AS label
        FROM _samples_visits WHERE {HAS_DX}
        WINDOW w AS (PARTITION BY subject_id ORDER BY admittime NULLS LAST, hadm_id)
    ) WHERE next_hadm_id IS NOT NULL"""

# Features from the history relation (medtx.samples.common.create_history: what the clock shows at the last
# visit's discharge); the label is the next visit's diagnoses.
NEXT_VISIT_SQL = f"""
    WITH hist AS (
        SELECT n.subject_id, n.hadm_id, n.next_hadm_id, n.label, h.prediction_time, h.conditions AS visits, h.ages
        FROM ({NEXT_SQL}) n JOIN _samples_history h USING (hadm_id)
    )
    SELECT $dataset AS dataset, subject_id, hadm_id, next_hadm_id, prediction_time, visits, ages,
           list_concat(['{CLS}'], flatten(list_transform(visits, lambda v: list_append(v, '{SEP}')))) AS codes,
           list_concat([0], flatten(list_transform(visits,
               lambda v, i: list_resize([]::INTEGER[], len(v) + 1, CAST((i - 1) % 2 AS INTEGER))))) AS segments,
           list_concat([ages[1]], flatten(list_transform(visits,
               lambda v, i: list_resize([]::INTEGER[], len(v) + 1, ages[i])))) AS ages_flat,
           list_concat([0], flatten(list_transform(visits,
               lambda v, i: list_resize([]::INTEGER[], len(v) + 1, CAST(i - 1 AS INTEGER))))) AS positions,
           label
    FROM hist"""

VOCAB = {
    "visits": "visits[-1]",          # every visit but each patient's last, once
    "codes": "visits[-1]",           # the same codes, with the BEHRT specials in front
    "label": "label",
}


ROWS = HistoryRows(
    task=NAME, table=TABLE, prediction_time=PREDICTION_TIME, index_sql=NEXT_SQL, visits_sql=HAS_DX,
    rows_sql=NEXT_VISIT_SQL, vocab=VOCAB, specials={"codes": (CLS, SEP, MASK)},
    figures={"mean_labels_per_visit": "avg(len(label))", "mean_history_visits": "avg(len(visits))"},
)


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite `samples.next_visit` (+ splits, vocab, summary) for one dataset from `_samples_visits`."""
    return ROWS.build(con, ctx, empty=lambda stats: (
        f"next_visit: no patient of dataset {ctx.dataset!r} has 2 or more visits with diagnoses "
        f"({stats['cohort_visits']} admissions of {stats['cohort_patients']} patients, "
        f"{stats['visits_with_conditions']} with diagnoses)"))


# The cohort flow, from the summary figures the builder stores: visits without diagnoses, then each patient's last
# visit with diagnoses (it has no next visit to predict)
EXCLUSIONS = (
    CohortExclusion("no_diagnoses", "visit without diagnoses", "len(conditions) = 0", counted="figures",
                    figures=("cohort_visits", "visits_with_conditions")),
    CohortExclusion("last_visit", "the patient's last visit with diagnoses (no next visit to predict)",
                    "no later visit with diagnoses", counted="figures", figures=("visits_with_conditions", "samples")),
)


TASK = Task(
    name=NAME,
    kind="multilabel",
    family="ehr",
    description="diagnoses of the next visit (multi-label) from all visits so far",
    order=20,
    clock=Clock(
        prediction_time=PREDICTION_TIME,
        words="at the discharge of the history's last visit (BEHRT convention)",
        observation_window="every visit with diagnoses up to and including the last one of the history",
        feature_sources=(("visits", "diagnosis"),),
        # No bound declared: the next visit is not the index admission the gate's clock reads (its diagnoses are
        # known at its own discharge, after this prediction time by construction).
        outcome="the next visit's diagnoses",
    ),
    samples=Samples(
        table=TABLE,
        columns=("dataset", "subject_id", "hadm_id", "next_hadm_id", "prediction_time", "visits", "ages", "codes",
                 "segments", "ages_flat", "positions", "label"),
        features=("visits",),
        label_column="label",
        label_feature="label",
        split_unit="patient",
    ),
    lineage=ehr_lineage(TABLE, build, exclusions=EXCLUSIONS),
    scoring=Scoring(
        metrics=("pr_auc_samples", "roc_auc_samples", "recall_at_10", "recall_at_20", "f1_samples"),
        monitor="pr_auc_samples",
        tune_metric="f1_samples",
        recall_ks=(10, 20),
        compared=(("pr_auc_samples", "visit"), ("f1_samples", "visit")),
    ),
    # models: every EHR model serving a multi-label task whose features it finds (the default; seq2seq needs
    # the visit's diagnoses and procedures as separate columns)
    model_defaults={
        # BEHRT: the copy gate from the current visit's diagnoses (recency 0), chosen on validation (issue #5); the
        # per-visit ages of the one visits column feed its age embedding.
        "behrt": {"copy_recencies": (0,), "visit_ages": "ages"},
        "copy_last": {"source": "visits"},  # the current visit's diagnoses, as the next visit's
        "oracle": {"code_column": "icd9_code"},  # the label column of raw.synth_oracle_next_visit
    },
)
