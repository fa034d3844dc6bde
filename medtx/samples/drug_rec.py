"""`samples.drug_rec`: PyHealth's `drug_recommendation_mimic3_fn`, set-based.

Per admission: conditions = ICD-9 diagnoses, procedures = ICD-9 procedures, drugs = mapped ATC-3 codes.
Visits lacking any of the three are skipped; patients left with fewer than 2 visits are dropped. Visits are
ordered by admittime (then hadm_id). Each sample's conditions/procedures/drugs_hist are the per-visit lists
of all kept visits up to and including the current one, with the current visit's drugs blanked in
drugs_hist (`drugs_hist[-1] = []`); the label `drugs` is the current visit's ATC-3 set (sorted).
`medtx.samples.reference.drug_rec_reference` is the same definition as a plain per-patient loop.
"""

from __future__ import annotations

import duckdb

from medtx.samples.common import (
    HISTORY_TABLE, VISITS_TABLE, EmptyCohortError, create_history, drop_history, store_task, unknown_code_counts,
    visit_stats,
)

TASK = "drug_rec"

KEPT = "len(conditions) > 0 AND len(procedures) > 0 AND len(drugs) > 0"

# The samples' index admissions: every kept visit of a patient with 2 or more kept visits.
INDEX_SQL = f"""
    SELECT subject_id, hadm_id FROM (
        SELECT subject_id, hadm_id, count(*) OVER (PARTITION BY subject_id) AS n_kept
        FROM {VISITS_TABLE} WHERE {KEPT}
    ) WHERE n_kept >= 2"""

# Features come from the history relation (medtx.samples.common.create_history: only what the clock shows at
# the prediction time, the current visit's discharge); the label is the current visit's drugs.
DRUG_REC_SQL = f"""
    SELECT $dataset AS dataset, h.subject_id, h.hadm_id, CAST(h.n_visits - 1 AS INTEGER) AS visit_index,
           v.admittime, h.prediction_time, h.conditions, h.procedures,
           list_concat(h.drugs[1:len(h.drugs) - 1], [[]::VARCHAR[]]) AS drugs_hist,
           v.drugs
    FROM {HISTORY_TABLE} h JOIN {VISITS_TABLE} v USING (hadm_id)"""

# Each kept visit is the last history element of exactly one sample, so these count every visit once.
VOCAB = {
    "conditions": "conditions[-1]",
    "procedures": "procedures[-1]",
    "drugs_hist": "drugs",  # history drugs are earlier visits' labels: the same ATC-3 space
    "drugs": "drugs",
}


def build_drug_rec(con: duckdb.DuckDBPyConnection, dataset: str, *, seed: int, fractions, min_count: int) -> int:
    """Rewrite `samples.drug_rec` (+ splits, vocab, summary) for one dataset from `_samples_visits`."""
    from medtx.tasks import get_task

    params = {"dataset": dataset}
    create_history(con, dataset, get_task(TASK).prediction_time, INDEX_SQL, visits_sql=KEPT)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _samples_drug_rec AS {DRUG_REC_SQL}", params)
    drop_history(con)
    stats = visit_stats(con)
    n, patients, mean_labels, distinct_labels = con.sql(
        """SELECT count(*), count(DISTINCT subject_id), avg(len(drugs)),
                  (SELECT count(DISTINCT d) FROM (SELECT unnest(drugs) AS d FROM _samples_drug_rec))
           FROM _samples_drug_rec"""
    ).fetchall()[0]
    if n == 0:
        mapped = con.execute(
            "SELECT count(*) FROM core.prescriptions_atc3 WHERE dataset = $dataset", params
        ).fetchall()[0][0]
        hint = f" - run `medtx map-codes --dataset {dataset}` first" if not mapped else ""
        raise EmptyCohortError(
            f"drug_rec: no patient of dataset {dataset!r} has 2 or more visits with diagnoses, procedures and "
            f"mapped drugs ({stats['cohort_visits']} admissions, {stats['visits_with_all_three']} with all three code types; "
            f"core.prescriptions_atc3 holds {mapped} rows for it{hint})"
        )
    figures = {
        "samples": n, "patients": patients, "mean_labels_per_visit": mean_labels,
        "distinct_labels": distinct_labels, **stats, **unknown_code_counts(con),
    }
    store_task(
        con, dataset=dataset, task=TASK, source="_samples_drug_rec", target="samples.drug_rec",
        seed=seed, fractions=fractions, min_count=min_count, vocab=VOCAB, figures=figures,
    )
    return n
