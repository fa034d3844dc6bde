"""Task labels in the MEDS label schema (subject_id, prediction_time, boolean_value), one spec per task.

A binary task plugs in with one `LabelSpec`: its sample table, the rows that are its own (a shared table
holds several tasks), and the prediction time — the moment by which everything the task's features use is
known under the export's time rule. Readmission: at discharge (features = the stay's codes, which MIMIC-III
only has at discharge). Mortality (medtx/tasks/mortality.py, when present): also at discharge, because its
features are the stay's own diagnoses; a MEDS tool must therefore cut data strictly before that time or it
sees the death itself (docs/MEDS.md says so).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import pyarrow as pa

LABEL_ARROW_SCHEMA = pa.schema([("subject_id", pa.int64()), ("prediction_time", pa.timestamp("us")),
                                ("boolean_value", pa.bool_())])


@dataclass(frozen=True)
class LabelSpec:
    table: str          # schema-qualified sample table
    where: str          # its rows for this task and `$dataset`
    time: str           # prediction time expression over the sample row `s` and its admission `a`
    label: str = "s.label"


SPECS = {
    "readmission": LabelSpec("samples.readmission", "s.dataset = $dataset", "s.dischtime"),
    "mortality": LabelSpec("samples.admission_outcome", "s.dataset = $dataset AND s.task = 'mortality'",
                           "a.dischtime"),
}


def _has_table(con: duckdb.DuckDBPyConnection, qualified: str) -> bool:
    schema, name = qualified.split(".")
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
                            [schema, name]).fetchall()[0][0])


def label_tasks(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The tasks whose labels this warehouse can export (their sample table exists)."""
    return [task for task, spec in SPECS.items() if _has_table(con, spec.table)]


def label_sql(con: duckdb.DuckDBPyConnection, task: str) -> str:
    """SELECT of the task's labels for `$dataset`, one row per sample, sorted by subject and time."""
    spec = SPECS[task]
    return f"""
        SELECT s.subject_id, CAST({spec.time} AS TIMESTAMP) AS prediction_time, {spec.label} AS boolean_value
        FROM {spec.table} s
        LEFT JOIN (SELECT hadm_id, any_value(dischtime) AS dischtime FROM raw.admissions
                   WHERE dataset = $dataset GROUP BY 1) a USING (hadm_id)
        WHERE {spec.where}
        ORDER BY 1, 2"""


def missing_time_count(con: duckdb.DuckDBPyConnection, task: str, dataset: str) -> int:
    """Samples of the task without a prediction time (they cannot be written; the export refuses them)."""
    return con.execute(f"SELECT count(*) FILTER (WHERE prediction_time IS NULL) FROM ({label_sql(con, task)})",
                       {"dataset": dataset}).fetchall()[0][0]
