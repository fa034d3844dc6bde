"""`samples.next_visit`: BEHRT-style next-visit diagnosis prediction.

A patient's visits with at least one diagnosis, ordered by admittime (then hadm_id). For every visit that
has a following one: `visits` = the diagnosis lists up to and including it, `ages` = age at each visit
(whole years, capped at 90), and the BEHRT flattening `codes = [CLS] v1 [SEP] v2 [SEP] ...` with aligned
`segments` (visit k -> k % 2; [CLS] takes visit 0's), `ages_flat` and `positions` (visit number, from 0).
Each [SEP] belongs to the visit it closes. `label` = the next visit's diagnoses. Single-visit patients give
no sample.
"""

from __future__ import annotations

import duckdb

from medtx.samples.common import (
    HISTORY_TABLE, VISITS_TABLE, EmptyCohortError, create_history, drop_history, store_task, unknown_code_counts,
    visit_stats,
)

TASK = "next_visit"
CLS, SEP, MASK = "[CLS]", "[SEP]", "[MASK]"

HAS_DX = "len(conditions) > 0"

# Each visit with diagnoses that has a following one, with that next visit (the label's).
NEXT_SQL = f"""
    SELECT * FROM (
        SELECT subject_id, hadm_id, lead(hadm_id) OVER w AS next_hadm_id, lead(conditions) OVER w AS label
        FROM {VISITS_TABLE} WHERE {HAS_DX}
        WINDOW w AS (PARTITION BY subject_id ORDER BY admittime NULLS LAST, hadm_id)
    ) WHERE next_hadm_id IS NOT NULL"""

# Features from the history relation (medtx.samples.common.create_history: what the clock shows at the last
# visit's discharge); the label is the next visit's diagnoses.
NEXT_VISIT_SQL = f"""
    WITH hist AS (
        SELECT n.subject_id, n.hadm_id, n.next_hadm_id, n.label, h.prediction_time, h.conditions AS visits, h.ages
        FROM ({NEXT_SQL}) n JOIN {HISTORY_TABLE} h USING (hadm_id)
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


def build_next_visit(con: duckdb.DuckDBPyConnection, dataset: str, *, seed: int, fractions, min_count: int) -> int:
    """Rewrite `samples.next_visit` (+ splits, vocab, summary) for one dataset from `_samples_visits`."""
    from medtx.tasks import get_task

    create_history(con, dataset, get_task(TASK).prediction_time, NEXT_SQL, visits_sql=HAS_DX)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _samples_next_visit AS {NEXT_VISIT_SQL}", {"dataset": dataset})
    drop_history(con)
    stats = visit_stats(con)
    n, patients, mean_labels, mean_visits = con.sql(
        "SELECT count(*), count(DISTINCT subject_id), avg(len(label)), avg(len(visits)) FROM _samples_next_visit"
    ).fetchall()[0]
    if n == 0:
        raise EmptyCohortError(
            f"next_visit: no patient of dataset {dataset!r} has 2 or more visits with diagnoses "
            f"({stats['cohort_visits']} admissions of {stats['cohort_patients']} patients, {stats['visits_with_conditions']} with diagnoses)"
        )
    figures = {
        "samples": n, "patients": patients, "mean_labels_per_visit": mean_labels,
        "mean_history_visits": mean_visits, **stats, **unknown_code_counts(con),
    }
    store_task(
        con, dataset=dataset, task=TASK, source="_samples_next_visit", target="samples.next_visit",
        seed=seed, fractions=fractions, min_count=min_count, vocab=VOCAB, figures=figures,
        specials={"codes": (CLS, SEP, MASK)},
    )
    return n
