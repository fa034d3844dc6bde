"""Pieces every EHR sample builder shares: per-visit code lists, empty-cohort errors, the summary table.

Visits are the dataset's admissions (one row per hadm_id) with their distinct diagnosis and procedure codes
(ordered by first seq_num, then code) and their distinct mapped ATC-3 codes (sorted). Codes found in no
dictionary are kept as they are: the builders count them in `samples.task_summary`, they never drop them.
"""

from __future__ import annotations

import logging

import duckdb

from medtx.store.db import quote_ident, quote_table

log = logging.getLogger("medtx.samples")

# MIMIC-III shifts the date of birth of patients older than 89 so that they appear ~300 years old.
AGE_CAP = 90
VISITS_TABLE = "_samples_visits"


class EmptyCohortError(ValueError):
    """A builder found nothing to build from; the message says what was missing."""


def ehr_datasets(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every dataset present in raw.admissions, sorted."""
    return [r[0] for r in con.sql("SELECT DISTINCT dataset FROM raw.admissions ORDER BY 1").fetchall()]


def _code_lists_sql(table: str) -> str:
    """hadm_id -> distinct, trimmed ICD-9 codes of `raw.<table>` in first-seq_num order."""
    return f"""
        SELECT hadm_id, list(code ORDER BY first_seq NULLS LAST, code) AS codes FROM (
            SELECT hadm_id, trim(icd9_code) AS code, min(seq_num) AS first_seq
            FROM {quote_table('raw.' + table)}
            WHERE dataset = $dataset AND hadm_id IS NOT NULL AND nullif(trim(icd9_code), '') IS NOT NULL
            GROUP BY ALL
        ) GROUP BY hadm_id"""


def create_visits(con: duckdb.DuckDBPyConnection, dataset: str) -> int:
    """(Re)create the temp table `_samples_visits` for one dataset; returns its row count.

    Columns: subject_id, hadm_id, admittime, dischtime, deathtime, admission_type (upper case),
    hospital_expire_flag, age (whole years at admission, capped at AGE_CAP), conditions, procedures, drugs (the
    stay's ATC-3 codes without the prescriptions dated after its discharge: medtx.samples.clock drops them),
    prescriptions_after_discharge (how many prescription rows of the stay were so dropped).
    """
    from medtx.samples.clock import drug_after_discharge_sql

    n_adm = con.execute(
        "SELECT count(*) FROM raw.admissions WHERE dataset = $dataset", {"dataset": dataset}
    ).fetchall()[0][0]
    if n_adm == 0:
        known = ", ".join(ehr_datasets(con)) or "none"
        raise EmptyCohortError(
            f"dataset {dataset!r} has no rows in raw.admissions (datasets present: {known}); "
            f"run `medtx ingest mimic3 --source FOLDER --dataset {dataset}` first"
        )
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {VISITS_TABLE} AS
        WITH adm AS (   -- raw keeps duplicates: one row per hadm_id
            SELECT subject_id, hadm_id, admittime, dischtime, deathtime,
                   upper(trim(admission_type)) AS admission_type, hospital_expire_flag
            FROM raw.admissions
            WHERE dataset = $dataset AND hadm_id IS NOT NULL AND subject_id IS NOT NULL
            QUALIFY row_number() OVER (PARTITION BY hadm_id ORDER BY row_id NULLS LAST, admittime) = 1
        ), dob AS (
            SELECT subject_id, min(dob) AS dob FROM raw.patients WHERE dataset = $dataset GROUP BY 1
        ), dx AS ({_code_lists_sql('diagnoses_icd')}),
        px AS ({_code_lists_sql('procedures_icd')}),
        rx AS (   -- a prescription dated after its stay's discharge is dropped (medtx.samples.clock), counted
            SELECT r.hadm_id,
                   list_sort(list(DISTINCT r.atc3) FILTER (WHERE NOT {drug_after_discharge_sql('r.startdate', 'a.dischtime')}))
                       AS codes,
                   count(*) FILTER (WHERE {drug_after_discharge_sql('r.startdate', 'a.dischtime')}) AS late
            FROM core.prescriptions_atc3 r JOIN adm a USING (hadm_id) WHERE r.dataset = $dataset GROUP BY 1
        )
        SELECT adm.*,
               CAST(least({AGE_CAP}, greatest(0, date_part('year', age(adm.admittime, dob.dob)))) AS INTEGER)
                   AS age,
               coalesce(dx.codes, []::VARCHAR[]) AS conditions,
               coalesce(px.codes, []::VARCHAR[]) AS procedures,
               coalesce(rx.codes, []::VARCHAR[]) AS drugs,
               coalesce(rx.late, 0) AS prescriptions_after_discharge
        FROM adm
        LEFT JOIN dob USING (subject_id)
        LEFT JOIN dx USING (hadm_id) LEFT JOIN px USING (hadm_id) LEFT JOIN rx USING (hadm_id)""",
        {"dataset": dataset},
    )
    return n_adm


INDEX_TABLE = "_samples_index"
HISTORY_TABLE = "_samples_history"
EVENTS_TABLE = "_events"


def create_history(con: duckdb.DuckDBPyConnection, dataset: str, prediction_time_sql: str, index_sql: str, *,
                   visits_sql: str = "TRUE") -> int:
    """(Re)create `_samples_history`: the one relation a builder reads its features from. Returns its rows.

    `index_sql` selects the samples' index admissions (`subject_id, hadm_id`, one row per sample) from
    `_samples_visits`; `prediction_time_sql` is the task's clock (`Task.clock.prediction_time`, over the index admission's
    `admittime` and `dischtime`); `visits_sql` is a predicate over `_samples_visits` choosing which admissions enter a
    history (the index admission must pass it). Columns, one row per sample: subject_id, hadm_id (the index
    admission), prediction_time, and per-visit lists over the patient's chosen admissions up to and including the
    index one (by admittime, then hadm_id): conditions, procedures, drugs (VARCHAR[][]), ages (INTEGER[], age at
    each visit, 0 when unknown), n_visits. Of each admission a list holds only the codes that the event table
    (medtx.samples.clock, `_events`) shows at or before the sample's prediction time, in `_samples_visits`' order;
    a code known later is absent, however the builder reads the history. Labels are not features: a builder
    still reads them from `_samples_visits`.
    """
    from medtx.samples.clock import create_event_view

    create_event_view(con, dataset, EVENTS_TABLE)
    # `$dataset` may appear in the clock or the index (an ACES task's clock reads samples.aces_labels)
    bound = {"dataset": dataset} if "$dataset" in f"{prediction_time_sql} {index_sql}" else None
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {INDEX_TABLE} AS
        SELECT i.subject_id, i.hadm_id, CAST(({prediction_time_sql}) AS TIMESTAMP) AS prediction_time
        FROM (SELECT subject_id, hadm_id FROM ({index_sql})) i JOIN {VISITS_TABLE} v USING (hadm_id)""", bound)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {HISTORY_TABLE} AS
        WITH ranked AS (
            SELECT *, row_number() OVER (PARTITION BY subject_id ORDER BY admittime NULLS LAST, hadm_id) AS visit_rank
            FROM {VISITS_TABLE} WHERE {visits_sql}
        ), pairs AS (   -- (sample, admission of its history)
            SELECT i.hadm_id AS sample_hadm_id, i.subject_id, i.prediction_time, r.*
            FROM {INDEX_TABLE} i
            JOIN ranked ri ON ri.hadm_id = i.hadm_id
            JOIN ranked r ON r.subject_id = i.subject_id AND r.visit_rank <= ri.visit_rank
        ), seen AS (    -- what the clock shows each sample of each admission
            SELECT p.sample_hadm_id, p.hadm_id, e.source, list(DISTINCT e.code) AS codes
            FROM pairs p JOIN {EVENTS_TABLE} e ON e.hadm_id = p.hadm_id AND e.time <= p.prediction_time
            WHERE e.source IN ('diagnosis', 'procedure', 'drug')
            GROUP BY ALL
        ), visible AS (
            SELECT p.sample_hadm_id, p.subject_id, p.prediction_time, p.visit_rank, p.admittime, p.hadm_id, p.age,
                   list_filter(p.conditions, lambda c: list_contains(coalesce(dx.codes, []), c)) AS conditions,
                   list_filter(p.procedures, lambda c: list_contains(coalesce(px.codes, []), c)) AS procedures,
                   list_filter(p.drugs, lambda c: list_contains(coalesce(rx.codes, []), c)) AS drugs
            FROM pairs p
            LEFT JOIN seen dx ON dx.sample_hadm_id = p.sample_hadm_id AND dx.hadm_id = p.hadm_id AND dx.source = 'diagnosis'
            LEFT JOIN seen px ON px.sample_hadm_id = p.sample_hadm_id AND px.hadm_id = p.hadm_id AND px.source = 'procedure'
            LEFT JOIN seen rx ON rx.sample_hadm_id = p.sample_hadm_id AND rx.hadm_id = p.hadm_id AND rx.source = 'drug'
        )
        SELECT sample_hadm_id AS hadm_id, any_value(subject_id) AS subject_id,
               any_value(prediction_time) AS prediction_time,
               list(conditions ORDER BY visit_rank) AS conditions,
               list(procedures ORDER BY visit_rank) AS procedures,
               list(drugs ORDER BY visit_rank) AS drugs,
               list(coalesce(age, 0) ORDER BY visit_rank) AS ages,
               count(*) AS n_visits
        FROM visible GROUP BY sample_hadm_id""")
    return con.sql(f"SELECT count(*) FROM {HISTORY_TABLE}").fetchall()[0][0]


def drop_history(con: duckdb.DuckDBPyConnection) -> None:
    """Drop the temp tables `create_history` made (the events table stays for the dataset's other tasks)."""
    con.execute(f"DROP TABLE IF EXISTS {HISTORY_TABLE}")
    con.execute(f"DROP TABLE IF EXISTS {INDEX_TABLE}")


def visit_stats(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """What the visits table holds, for error messages and summaries."""
    row = con.sql(
        f"""SELECT count(*), count(DISTINCT subject_id),
                   count(*) FILTER (WHERE len(conditions) > 0),
                   count(*) FILTER (WHERE len(procedures) > 0),
                   count(*) FILTER (WHERE len(drugs) > 0),
                   count(*) FILTER (WHERE len(conditions) > 0 AND len(procedures) > 0 AND len(drugs) > 0),
                   coalesce(sum(prescriptions_after_discharge), 0)
            FROM {VISITS_TABLE}"""
    ).fetchall()[0]
    keys = ("cohort_visits", "cohort_patients", "visits_with_conditions", "visits_with_procedures", "visits_with_drugs",
            "visits_with_all_three", "prescriptions_after_discharge")
    return dict(zip(keys, row, strict=True))


def unknown_code_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Distinct diagnosis/procedure codes of the visits that no ICD-9 dictionary knows (kept, only counted)."""
    out = {}
    for column, ref in (("conditions", "icd9_diagnoses"), ("procedures", "icd9_procedures")):
        out[f"{column}_codes_not_in_dictionary"] = con.sql(
            f"""SELECT count(DISTINCT code) FROM (SELECT unnest({quote_ident(column)}) AS code FROM {VISITS_TABLE})
                WHERE code NOT IN (SELECT icd9_code FROM {quote_table('ref.' + ref)})"""
        ).fetchall()[0][0]
    return out


def write_summary(con: duckdb.DuckDBPyConnection, dataset: str, task: str, figures: dict[str, float]) -> None:
    """Replace the task's rows of `samples.task_summary` (call inside the builder's transaction)."""
    con.execute("DELETE FROM samples.task_summary WHERE dataset = $d AND task = $t", {"d": dataset, "t": task})
    con.executemany(
        "INSERT INTO samples.task_summary VALUES (?, ?, ?, ?)",
        [[dataset, task, metric, None if value is None else float(value)] for metric, value in figures.items()],
    )


def store_task(
    con: duckdb.DuckDBPyConnection, *, dataset: str, task: str, source: str, target: str,
    seed: int, fractions, min_count: int, vocab: dict[str, str], figures: dict[str, float],
    specials: dict[str, tuple[str, ...]] | None = None, shared: bool = False,
) -> dict[int, str]:
    """Write a patient-level task in one transaction: samples (from temp table `source` into `target`),
    its split (the dataset's one patient split, medtx.samples.splits.write_task_splits), its vocabularies (`feature -> list expression` over a sample row, training patients only)
    and its summary. Returns the split assignment. `shared`: `target` holds several tasks' rows (a `task`
    column), so only this task's rows of the dataset are replaced."""
    from medtx.store.db import transaction
    from medtx.samples.splits import split_counts, tasks_off_patient_split, write_task_splits
    from medtx.samples.vocab import write_vocab

    units = [r[0] for r in con.sql(f"SELECT DISTINCT subject_id FROM {quote_table(source)}").fetchall()]
    with transaction(con):
        if shared:
            con.execute(f"DELETE FROM {quote_table(target)} WHERE dataset = $dataset AND task = $task",
                        {"dataset": dataset, "task": task})
        else:
            con.execute(f"DELETE FROM {quote_table(target)} WHERE dataset = $dataset", {"dataset": dataset})
        con.execute(f"INSERT INTO {quote_table(target)} BY NAME SELECT * FROM {quote_table(source)}")
        assignment = write_task_splits(con, dataset, task, units, seed, fractions)
        for feature, expr_sql in vocab.items():  # list expressions written in code by each task's builder
            write_vocab(
                con, dataset, task, feature,
                f"""SELECT unnest({expr_sql}) AS token FROM {quote_table(source)} s
                    JOIN samples.splits p ON p.dataset = $d AND p.task = $t AND p.subject_id = s.subject_id
                    WHERE p.split = 'train'""",
                specials=(specials or {}).get(feature, ()), min_count=min_count,
            )
        write_summary(con, dataset, task, {**figures, **split_counts(assignment)})
    con.execute(f"DROP TABLE IF EXISTS {quote_table(source)}")
    counts = split_counts(assignment)
    log.info("%s [%s]: %d samples, splits %s", task, dataset, figures.get("samples", -1), counts)
    if len(assignment) >= 3 and not (counts["val_units"] and counts["test_units"]):
        log.warning("%s [%s]: the dataset's patient split leaves this task's %d patients without validation or test "
                    "patients (%s); its trainings will refuse to start", task, dataset, len(assignment), counts)
    off = tasks_off_patient_split(con, dataset)
    if off:
        log.warning("%s [%s]: task(s) %s hold patients in another split than the dataset's patient split (seed %d); "
                    "rebuild them so every task shares it", task, dataset, off, seed)
    return assignment
