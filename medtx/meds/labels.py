"""Task labels in the MEDS label schema (subject_id, prediction_time, boolean_value), one spec per task.

Every binary EHR task of the registry (medtx/tasks/) is exported. A label's `prediction_time` is the task's own
prediction time, as its sample builder stored it (`prediction_time` column of the sample table, the task's
`Task.clock.prediction_time` over the index admission): readmission at discharge, mortality 48 hours after admission.
MEDS tools may use every event "up to and including" that time (the MEDS standard); the export makes that safe
by timing events with the task clock (medtx.meds.events) and by refusing labels that could see their own
outcome at or before their prediction time (`outcome_leak`).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa

from medtx.store.db import quote_ident, quote_table, sql_literal

LABEL_ARROW_SCHEMA = pa.schema([("subject_id", pa.int64()), ("prediction_time", pa.timestamp("us")),
                                ("boolean_value", pa.bool_())])


# What a label's own outcome is, as events of the export: a death of the subject (MEDS_DEATH), any event of a
# later stay of the subject (a readmission), and the index stay's discharge (its disposition: DIED or alive).
# A task predicting at discharge (prediction time `dischtime`) has its discharge as the moment of prediction, so
# only death and later stays are its outcome.
OUTCOME_KINDS = ("death", "later_stay", "index_discharge")


@dataclass(frozen=True)
class LabelSpec:
    """SQL fragments written from the task registry (code), never from user input: hence the `_sql` names."""
    table: str          # schema-qualified sample table
    where_sql: str      # its rows for this task and `$dataset`
    label_sql: str = "s.label"
    outcomes: tuple[str, ...] = OUTCOME_KINDS  # which OUTCOME_KINDS may not be visible at prediction time


def _specs() -> dict[str, LabelSpec]:
    """One spec per binary EHR task of the registry; a shared sample table keeps its rows by `task`."""
    from medtx.tasks import tasks_of_family

    def outcomes(prediction_time: str | None) -> tuple[str, ...]:
        at_discharge = (prediction_time or "").strip().lower() == "dischtime"
        return tuple(k for k in OUTCOME_KINDS if not (at_discharge and k == "index_discharge"))

    return {t.name: LabelSpec(t.samples.table,
                              "s.dataset = $dataset" + (f" AND s.task = {sql_literal(t.name)}" if t.samples.shared else ""),
                              f"s.{quote_ident(t.samples.label_column)}", outcomes(t.clock.prediction_time))
            for t in tasks_of_family("ehr") if t.kind == "binary"}


def _has_table(con: duckdb.DuckDBPyConnection, qualified: str) -> bool:
    schema, name = qualified.split(".")
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
                            [schema, name]).fetchall()[0][0])


def _has_column(con: duckdb.DuckDBPyConnection, qualified: str, column: str) -> bool:
    schema, name = qualified.split(".")
    return bool(con.execute("SELECT count(*) FROM information_schema.columns WHERE table_schema = ? AND table_name = ? "
                            "AND column_name = ?", [schema, name, column]).fetchall()[0][0])


def label_tasks(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The tasks whose labels this warehouse can export (their sample table exists)."""
    return [task for task, spec in _specs().items() if _has_table(con, spec.table)]


def label_sql(con: duckdb.DuckDBPyConnection, task: str) -> str:
    """SELECT of the task's labels for `$dataset`, one row per sample, sorted by subject and time; columns
    subject_id, prediction_time, boolean_value, hadm_id (the index stay, for the outcome check)."""
    spec = _specs()[task]
    if not _has_column(con, spec.table, "prediction_time"):
        raise ValueError(f"--labels {task}: {spec.table} has no prediction_time column (samples built by an older "
                         "medtx): run `medtx build-samples` again")
    return f"""
        SELECT s.subject_id, CAST(s.prediction_time AS TIMESTAMP) AS prediction_time,
               {spec.label_sql} AS boolean_value, s.hadm_id
        FROM {quote_table(spec.table)} s
        WHERE {spec.where_sql}
        ORDER BY 1, 2, 4"""


def missing_time_count(con: duckdb.DuckDBPyConnection, task: str, dataset: str) -> int:
    """Samples of the task without a prediction time (they cannot be written; the export refuses them)."""
    return con.execute(f"SELECT count(*) FILTER (WHERE prediction_time IS NULL) FROM ({label_sql(con, task)})",
                       {"dataset": dataset}).fetchall()[0][0]


def outcome_leak(con: duckdb.DuckDBPyConnection, task: str, labels: str, events: str) -> str | None:
    """None, or one line saying how many labels of `labels` (label_sql's columns) could see their own outcome
    in the export's events `events` (subject_id, time, code, hadm_id) at or before their prediction time, with
    the first one. `labels` and `events` are temp table names written by the export (code, not input).

    Set-based over per-stay aggregates (each stay's admission, first event and discharge; each subject's first
    death), so it costs one pass over the events, not labels x events."""
    kinds = _specs()[task].outcomes
    checks = {  # each: the outcome's time, and what it is, for one label row `l` (its index stay `i`)
        "death": ("d.first_death", "'MEDS_DEATH'"),
        "later_stay": ("nxt.first_time", "'events of later stay ' || nxt.hadm_id"),
        "index_discharge": ("i.discharge", "'its own stay''s HOSPITAL_DISCHARGE'"),
    }
    union_sql = " UNION ALL ".join(
        f"SELECT l.subject_id, l.prediction_time, {sql_literal(k)} AS kind, {at_sql} AS seen_at, {what_sql} AS what "
        f"FROM _l l LEFT JOIN _stays i ON i.hadm_id = l.hadm_id "
        f"LEFT JOIN _deaths d ON d.subject_id = l.subject_id "
        f"LEFT JOIN _stays nxt ON nxt.subject_id = l.subject_id AND nxt.hadm_id <> l.hadm_id "
        f"AND nxt.admittime >= i.admittime "
        f"WHERE {at_sql} <= l.prediction_time"
        for k, (at_sql, what_sql) in ((k, checks[k]) for k in kinds))
    row = con.sql(f"""
        WITH _l AS (SELECT subject_id, prediction_time, hadm_id FROM {quote_table(labels)}),
        _stays AS (
            SELECT hadm_id, any_value(subject_id) AS subject_id,
                   min(time) FILTER (WHERE starts_with(code, 'HOSPITAL_ADMISSION//')) AS admittime,
                   min(time) AS first_time,
                   min(time) FILTER (WHERE starts_with(code, 'HOSPITAL_DISCHARGE//')) AS discharge
            FROM {quote_table(events)} WHERE hadm_id IS NOT NULL GROUP BY 1),
        _deaths AS (SELECT subject_id, min(time) AS first_death FROM {quote_table(events)}
                    WHERE code = 'MEDS_DEATH' GROUP BY 1),
        seen AS ({union_sql})
        SELECT count(DISTINCT (subject_id, prediction_time)),
               arg_min([CAST(subject_id AS VARCHAR), CAST(prediction_time AS VARCHAR), what, CAST(seen_at AS VARCHAR)],
                       (subject_id, prediction_time, seen_at))
        FROM seen""").fetchall()[0]
    if not row[0]:
        return None
    subject, at, what, when = row[1]
    return (f"{row[0]} label(s) could see their own outcome ({', '.join(kinds)}) at or before their prediction_time "
            f"(first: subject {subject}, prediction_time {at}, sees {what} at {when})")
