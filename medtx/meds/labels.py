"""Task labels in the MEDS label schema (subject_id, prediction_time, boolean_value), one spec per task.

A binary task plugs in with one `LabelSpec`: its sample table, the rows that are its own (a shared table
holds several tasks), and the prediction time — the moment by which everything the task's features use is
known under the export's time rule. Every binary EHR task of the registry (medtx/tasks/) is exported, at
discharge: its features are the stay's codes, which MIMIC-III only has at discharge. For an in-hospital outcome
a MEDS tool must therefore cut data strictly before that time or it sees the outcome itself (docs/MEDS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa

from medtx.store.db import quote_ident, quote_table, sql_literal

LABEL_ARROW_SCHEMA = pa.schema([("subject_id", pa.int64()), ("prediction_time", pa.timestamp("us")),
                                ("boolean_value", pa.bool_())])


@dataclass(frozen=True)
class LabelSpec:
    """SQL fragments written from the task registry (code), never from user input: hence the `_sql` names."""
    table: str          # schema-qualified sample table
    where_sql: str      # its rows for this task and `$dataset`
    time_sql: str       # prediction time expression over the sample row `s` and its admission `a`
    label_sql: str = "s.label"


def _specs() -> dict[str, LabelSpec]:
    """One spec per binary EHR task of the registry; a shared sample table keeps its rows by `task`."""
    from medtx.tasks import tasks_of_family

    return {t.name: LabelSpec(t.sample_table,
                              "s.dataset = $dataset" + (f" AND s.task = {sql_literal(t.name)}" if t.shared_table else ""),
                              "a.dischtime", f"s.{quote_ident(t.label_column)}")
            for t in tasks_of_family("ehr") if t.kind == "binary"}


def _has_table(con: duckdb.DuckDBPyConnection, qualified: str) -> bool:
    schema, name = qualified.split(".")
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
                            [schema, name]).fetchall()[0][0])


def label_tasks(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The tasks whose labels this warehouse can export (their sample table exists)."""
    return [task for task, spec in _specs().items() if _has_table(con, spec.table)]


def label_sql(con: duckdb.DuckDBPyConnection, task: str) -> str:
    """SELECT of the task's labels for `$dataset`, one row per sample, sorted by subject and time."""
    spec = _specs()[task]
    return f"""
        SELECT s.subject_id, CAST({spec.time_sql} AS TIMESTAMP) AS prediction_time, {spec.label_sql} AS boolean_value
        FROM {quote_table(spec.table)} s
        LEFT JOIN (SELECT hadm_id, any_value(dischtime) AS dischtime FROM raw.admissions
                   WHERE dataset = $dataset GROUP BY 1) a USING (hadm_id)
        WHERE {spec.where_sql}
        ORDER BY 1, 2"""


def missing_time_count(con: duckdb.DuckDBPyConnection, task: str, dataset: str) -> int:
    """Samples of the task without a prediction time (they cannot be written; the export refuses them)."""
    return con.execute(f"SELECT count(*) FILTER (WHERE prediction_time IS NULL) FROM ({label_sql(con, task)})",
                       {"dataset": dataset}).fetchall()[0][0]
