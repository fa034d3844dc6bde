"""A run's test predictions in the meds-evaluation schema (meds_evaluation.schema.PredictionSchema, MEDS-DEV).

One row per test sample of a binary task: `subject_id`, `prediction_time` (the task's prediction time, as the
sample builder stored it - the same moment `medtx export meds --labels` writes), `boolean_value` (the label),
`predicted_boolean_value` (the probability at or above the run's decision threshold, as ml.predictions stores
it) and `predicted_boolean_probability` (float32, as the schema asks). meds-evaluation then computes AUROC and
AUPRC (average precision) from exactly the scores medtx scored itself (tests/test_meds_tools.py checks both to
1e-6 against ml.metrics).

Every stored prediction must meet exactly one sample of the task's sample table; otherwise nothing is written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from medtx.meds.export import ExportError, copy_parquet
from medtx.store.db import quote_table, sql_literal
from medtx.store.outputs import OutputRefused, Protected, check_output
from medtx.tasks import get_task

PREDICTION_ARROW_SCHEMA = pa.schema([
    ("subject_id", pa.int64()), ("prediction_time", pa.timestamp("us")), ("boolean_value", pa.bool_()),
    ("predicted_boolean_value", pa.bool_()), ("predicted_boolean_probability", pa.float32()),
])


@dataclass(frozen=True)
class PredictionsResult:
    run_id: str
    task: str
    dataset: str
    model: str
    out: Path
    rows: int
    positives: int


def export_predictions(con: duckdb.DuckDBPyConnection, run_id: str, out: Path, *, overwrite: bool = False,
                       protected: Protected | tuple[Path, ...] = ()) -> PredictionsResult:
    """Write run `run_id`'s test predictions to the parquet file `out` (refused: an existing file without
    `overwrite`, anything but a .parquet file, a protected path)."""
    out = _check_out_file(Path(out), overwrite, protected)
    found = con.execute("SELECT task, dataset, model, status FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()
    if not found:
        raise ExportError(f"--run {run_id}: no such run in ml.runs")
    task_name, dataset, model, status = found[0]
    if status != "completed":
        raise ExportError(f"--run {run_id}: run is {status}, only a completed run has test predictions")
    task = get_task(task_name)
    if not task.binary:
        raise ExportError(f"--run {run_id}: task {task_name} is {task.kind}; meds-evaluation's prediction schema "
                          "holds binary predictions only")
    owner = get_task(task.samples_task)  # the task whose builder fills the sample table
    table = owner.samples.table
    columns = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = ? "
                                         "AND table_name = ?", table.split(".")).fetchall()}
    if "prediction_time" not in columns:
        raise ExportError(f"--run {run_id}: {table} has no prediction_time column (samples built by an older medtx): "
                          "run `medtx build-samples` again")
    where_sql = "s.dataset = $dataset" + (f" AND s.task = {sql_literal(owner.name)}" if owner.samples.shared else "")
    select_sql = f"""
        SELECT p.subject_id AS p_subject, p.hadm_id, p.prob, p.y_true, p.predicted,
               s.subject_id, s.prediction_time, s.n_samples
        FROM (SELECT * FROM ml.predictions WHERE run_id = $run_id AND label = $label) p
        LEFT JOIN (SELECT s.hadm_id, any_value(s.subject_id) AS subject_id,
                          any_value(CAST(s.prediction_time AS TIMESTAMP)) AS prediction_time, count(*) AS n_samples
                   FROM {quote_table(table)} s WHERE {where_sql} GROUP BY 1) s USING (hadm_id)"""
    params = {"run_id": run_id, "label": task.samples.label_name, "dataset": dataset}
    n, bad, first = con.execute(f"""
        SELECT count(*), count(*) FILTER (WHERE ok IS NOT TRUE), min(hadm_id) FILTER (WHERE ok IS NOT TRUE)
        FROM (SELECT hadm_id, n_samples = 1 AND subject_id = p_subject AND prediction_time IS NOT NULL
                              AND y_true IS NOT NULL AND prob IS NOT NULL AS ok FROM ({select_sql}))""",
                                params).fetchall()[0]
    if not n:
        raise ExportError(f"--run {run_id}: no test predictions stored for label {task.samples.label_name!r}")
    if bad:
        raise ExportError(f"--run {run_id}: {bad} of {n} prediction(s) do not meet exactly one {table} sample of "
                          f"{dataset!r} with a prediction time and a label (first: hadm_id {first}); nothing was "
                          "written")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{uuid.uuid4().hex}.parquet"  # renamed into place once complete
    try:
        copy_parquet(con, f"""
            SELECT subject_id, prediction_time, y_true AS boolean_value, predicted AS predicted_boolean_value,
                   CAST(prob AS FLOAT) AS predicted_boolean_probability
            FROM ({select_sql}) ORDER BY subject_id, prediction_time, hadm_id""", tmp, PREDICTION_ARROW_SCHEMA, params)
        tmp.replace(out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    rows, positives = con.execute("SELECT count(*), count(*) FILTER (WHERE boolean_value) FROM read_parquet(?)",
                                  [str(out)]).fetchall()[0]
    return PredictionsResult(run_id, task_name, dataset, model, out, rows, positives)


def _check_out_file(out: Path, overwrite: bool, protected: Protected | tuple[Path, ...]) -> Path:
    """The real path the predictions go to (medtx.store.outputs.check_output), else ExportError (one line)."""
    if Path(out).suffix != ".parquet":
        raise ExportError(f"--out {out}: the predictions file must be named *.parquet")
    if not isinstance(protected, Protected):
        protected = Protected(tuple(Path(p) for p in protected))
    try:
        return check_output(out, protected, overwrite=overwrite)
    except OutputRefused as exc:
        raise ExportError(str(exc)) from None
