"""`medtx import predictions`: a model trained outside medtx (MEDS-Tab, a foundation model, another group's code)
joins the leaderboard from its test predictions in meds-evaluation's `PredictionSchema` - the file `medtx export
predictions` writes (medtx.meds.predictions), MEDS-Tab and MEDS-DEV write.

The file must hold exactly the held-out labels of the task on the dataset: one row per test-split sample
(samples.splits), matched on (`subject_id`, `prediction_time`) - the label's prediction time as `medtx export meds
--labels` writes it - with the sample's own label in `boolean_value`. Anything else is refused before anything is
written, with one line naming the first bad row (its 1-based position in the file): a subject or time that is no
sample of the task, a train or validation sample, a label that differs, a row repeated, a probability that is
missing, NaN or outside [0, 1]; then a held-out sample without a row. Extra columns are ignored.

The run is recorded like a trained one (medtx.training.records: ml.runs, ml.predictions, ml.metrics, then the
patient-bootstrap intervals, the paired verdict against the reference baseline on the same test patients, the
subgroups and calibration: medtx.evaluation.analysis), under the task's data fingerprint, and marked "trained
outside medtx" in its config (`origin`), which the leaderboard and the model card show. It has no validation
predictions, so it gets no recalibration and no operating points (its card says so), and its model name may not
be one of medtx's own models (an import must never pass for, or become, the reference baseline).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from medtx.meds.export import ExportError
from medtx.store.db import quote_ident, quote_table, sql_literal
from medtx.tasks import Task

ORIGIN = "trained outside medtx"  # ml.runs.config.origin of an imported run: what the leaderboard and card show
MODEL_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
REQUIRED = ("subject_id", "prediction_time", "boolean_value", "predicted_boolean_probability")


class PredictionsImportError(ExportError):
    """The predictions file is refused (one line naming the file, column or first bad row); nothing was written."""


@dataclass(frozen=True)
class ImportedRun:
    run_id: str
    task: str
    dataset: str
    model: str
    rows: int
    positives: int
    n_patients: int
    threshold_source: str


def _fail(path: Path, why: str) -> PredictionsImportError:
    return PredictionsImportError(f"{path}: {why}; nothing was imported")


def check_schema(path: Path) -> bool:
    """The file's columns against PredictionSchema; returns whether it gives `predicted_boolean_value`."""
    if not path.is_file():
        raise PredictionsImportError(f"{path}: no such file")
    if path.suffix != ".parquet":
        raise PredictionsImportError(f"{path}: a predictions file is Parquet (*.parquet)")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise PredictionsImportError(f"{path}: not a readable Parquet file ({exc})") from None
    types = {f.name: f.type for f in schema}
    missing = [c for c in REQUIRED if c not in types]
    if missing:
        raise _fail(path, f"column {missing[0]} is missing (meds-evaluation's PredictionSchema: subject_id int64, "
                          "prediction_time timestamp, boolean_value bool, predicted_boolean_value bool, "
                          "predicted_boolean_probability float)")
    expect = {"subject_id": (pa.types.is_integer, "an integer (int64)"),
              "prediction_time": (lambda t: pa.types.is_timestamp(t) and t.tz is None, "a timestamp without a time "
                                  "zone (timestamp[us])"),
              "boolean_value": (pa.types.is_boolean, "bool"),
              "predicted_boolean_value": (pa.types.is_boolean, "bool"),
              "predicted_boolean_probability": (pa.types.is_floating, "a float (float32 or float64)")}
    for column, (ok, words) in expect.items():
        if column in types and not (ok(types[column]) or pa.types.is_null(types[column])):
            raise _fail(path, f"column {column} is {types[column]}, PredictionSchema expects {words}")
    return "predicted_boolean_value" in types and not pa.types.is_null(types["predicted_boolean_value"])


def _samples_sql(task: Task) -> str:
    """The task's samples of `$dataset` with their split (NULL: no split row), one row per sample."""
    where_sql = "s.dataset = $dataset" + (f" AND s.task = {sql_literal(task.name)}" if task.samples.shared else "")
    return f"""
        SELECT s.subject_id, s.hadm_id, CAST(s.prediction_time AS TIMESTAMP) AS prediction_time,
               CAST(s.{quote_ident(task.samples.label_column)} AS BOOLEAN) AS label, sp.split
        FROM {quote_table(task.samples.table)} s
        LEFT JOIN samples.splits sp ON sp.dataset = s.dataset AND sp.task = $task AND sp.subject_id = s.subject_id
        WHERE {where_sql}"""


def check_rows(con: duckdb.DuckDBPyConnection, path: Path, task: Task, dataset: str, has_predicted: bool) -> None:
    """Every row a held-out label of the task on the dataset, every held-out label a row (see the module doc)."""
    params = {"dataset": dataset, "task": task.name}
    predicted_sql = "predicted_boolean_value" if has_predicted else "NULL::BOOLEAN"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _medtx_import AS
        SELECT file_row_number + 1 AS row_no, CAST(subject_id AS BIGINT) AS subject_id,
               CAST(prediction_time AS TIMESTAMP) AS prediction_time, boolean_value,
               {predicted_sql} AS predicted, CAST(predicted_boolean_probability AS DOUBLE) AS prob
        FROM read_parquet($file, file_row_number = true)""", {"file": str(path)})
    con.execute(f"CREATE OR REPLACE TEMP TABLE _medtx_samples AS {_samples_sql(task)}",
                {"dataset": dataset, "task": task.name})
    if not con.execute("SELECT count(*) FROM _medtx_import").fetchall()[0][0]:
        raise _fail(path, "the file has no rows")
    n_test = con.execute("SELECT count(*) FROM _medtx_samples WHERE split = 'test'").fetchall()[0][0]
    if not n_test:
        raise _fail(path, f"task {task.name} has no held-out (test) samples on dataset {dataset!r}: run "
                          f"`medtx build-samples --task {task.samples_task} --dataset {dataset}` first")
    # Each row's first problem, in the order a reader fixes them; the first row (in file order) with one is shown.
    bad = con.execute("""
        WITH f AS (
            SELECT f.*, min(row_no) OVER (PARTITION BY subject_id, prediction_time) AS first_row,
                   count(*) OVER (PARTITION BY subject_id, prediction_time) AS n_same
            FROM _medtx_import f),
        m AS (
            SELECT f.row_no, f.subject_id, f.prediction_time, f.boolean_value, f.prob, f.first_row, f.n_same,
                   f.predicted, count(s.hadm_id) AS n_samples, any_value(s.split) AS split, any_value(s.label) AS label
            FROM f LEFT JOIN _medtx_samples s ON s.subject_id = f.subject_id AND s.prediction_time = f.prediction_time
            GROUP BY ALL)
        SELECT row_no, CASE
            WHEN subject_id IS NULL THEN 'subject_id is null'
            WHEN prediction_time IS NULL THEN 'prediction_time is null'
            WHEN boolean_value IS NULL THEN 'boolean_value is null'
            WHEN prob IS NULL THEN 'predicted_boolean_probability is null'
            WHEN isnan(prob) THEN 'predicted_boolean_probability is NaN'
            WHEN prob < 0 OR prob > 1 OR isinf(prob) THEN 'predicted_boolean_probability ' || prob || ' is outside [0, 1]'
            WHEN row_no > first_row THEN 'subject ' || subject_id || ' at ' || prediction_time
                 || ' repeats row ' || first_row
            WHEN n_samples = 0 THEN 'subject ' || subject_id || ' at ' || prediction_time
                 || ' is no ' || $task || ' sample of dataset ' || $dataset
                 || ' (prediction_time must be the label''s, as `medtx export meds --labels` writes it)'
            WHEN n_samples > 1 THEN 'subject ' || subject_id || ' at ' || prediction_time || ' meets '
                 || n_samples || ' samples (two stays with one prediction time cannot be told apart)'
            WHEN split IS DISTINCT FROM 'test' THEN 'subject ' || subject_id || ' at ' || prediction_time
                 || ' is a ' || coalesce(CASE split WHEN 'val' THEN 'validation (tuning)' WHEN 'train' THEN
                 'train' END, 'split-less') || ' sample; only held-out (test) samples may be imported'
            WHEN boolean_value IS DISTINCT FROM label THEN 'subject ' || subject_id || ' at ' || prediction_time
                 || ': boolean_value ' || boolean_value || ', but its ' || $task || ' label is ' || label
            END AS why
        FROM m WHERE why IS NOT NULL ORDER BY row_no LIMIT 1""", params).fetchall()
    if bad:
        raise _fail(path, f"row {bad[0][0]}: {bad[0][1]}")
    mixed = con.execute("SELECT count(*) FILTER (WHERE predicted IS NULL), count(*) FROM _medtx_import").fetchall()[0]
    if has_predicted and 0 < mixed[0] < mixed[1]:
        row = con.execute("SELECT min(row_no) FROM _medtx_import WHERE predicted IS NULL").fetchall()[0][0]
        raise _fail(path, f"row {row}: predicted_boolean_value is null while other rows give one")
    missing = con.execute("""
        SELECT count(*), arg_min([CAST(s.subject_id AS VARCHAR), CAST(s.prediction_time AS VARCHAR)],
                                 (s.subject_id, s.prediction_time))
        FROM _medtx_samples s ANTI JOIN _medtx_import f
             ON f.subject_id = s.subject_id AND f.prediction_time = s.prediction_time
        WHERE s.split = 'test'""").fetchall()[0]
    if missing[0]:
        raise _fail(path, f"{missing[0]} of {n_test} held-out {task.name} samples of dataset {dataset!r} have no row "
                          f"(first: subject {missing[1][0]} at {missing[1][1]})")


def _prediction_frame(con: duckdb.DuckDBPyConnection, task: Task) -> pa.Table:
    """The checked rows as ml.predictions rows (long form, the task's one label), in (subject, hadm) order."""
    return con.sql(f"""
        SELECT CAST(s.hadm_id AS VARCHAR) AS sample_id, s.subject_id, s.hadm_id, {sql_literal(task.samples.label_name)} AS label,
               f.prob, f.boolean_value AS y_true, coalesce(f.predicted, f.prob >= 0.5) AS predicted
        FROM _medtx_import f JOIN _medtx_samples s
             ON s.subject_id = f.subject_id AND s.prediction_time = f.prediction_time
        ORDER BY s.subject_id, s.hadm_id""").to_arrow_table()


def check_model_name(model: str) -> None:
    from medtx.models.registry import specs

    if not MODEL_NAME.fullmatch(model):
        raise PredictionsImportError(f"--model {model!r}: a name of lower-case letters, digits, '_', '.', '-' "
                                     "(at most 64), e.g. meds_tab_xgboost")
    if model in {s.name for s in specs()}:
        raise PredictionsImportError(f"--model {model!r} is one of medtx's own models; name the outside model "
                                     "otherwise (e.g. meds_tab_xgboost), so it is never taken for medtx's")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def import_predictions(con: duckdb.DuckDBPyConnection, path: Path | str, task: Task, dataset: str, model: str,
                       n_boot: int | None = None) -> ImportedRun:
    """Check the file against the task's held-out labels on `dataset`, then record it as a completed run
    (metrics, intervals, verdict, subgroups, calibration); returns the run. Refused (PredictionsImportError, one
    line): see the module doc."""
    from medtx.metrics.bootstrap import N_BOOT
    from medtx.metrics.collapse import is_collapsed
    from medtx.store.fingerprint import tables_fingerprint
    from medtx.store.hashing import code_version
    from medtx.tasks.verdict import check_gate_rows
    from medtx.training import records
    from medtx.training.ehr_evaluation import binary_test_metrics
    from medtx.training.runs import is_synthetic

    path = Path(path)
    if task.family != "ehr" or not task.binary:
        raise PredictionsImportError(f"--task {task.name}: meds-evaluation's PredictionSchema holds binary "
                                     "predictions; only a binary EHR task's can be imported")
    check_model_name(model)
    has_predicted = check_schema(path)
    try:
        datasets = [d for d, in con.execute(
            f"SELECT DISTINCT dataset FROM {quote_table(task.samples.table)} ORDER BY 1").fetchall()]
    except duckdb.CatalogException:
        datasets = []
    if dataset not in datasets:
        raise PredictionsImportError(f"--dataset {dataset!r} has no {task.name} samples (datasets with some: "
                                     f"{', '.join(datasets) or 'none'})")
    gate = [dict(zip(("dataset", "task", "status", "message"), r, strict=True)) for r in con.execute(
        "SELECT dataset, task, status, message FROM samples.leakage_gate WHERE dataset = ? AND task = ?",
        [dataset, task.name]).fetchall()]
    check_gate_rows(gate, task, dataset)  # a blocked task has no leaderboard, imported or trained
    check_rows(con, path, task, dataset, has_predicted)
    frame = _prediction_frame(con, task)
    y = np.asarray(frame.column("y_true").to_pylist(), dtype=np.float64)[:, None]
    p = np.asarray(frame.column("prob").to_pylist(), dtype=np.float64)[:, None]
    patients = np.asarray(frame.column("subject_id").to_pylist(), dtype=np.int64)
    n_boot = N_BOOT if n_boot is None else n_boot
    test_rows = binary_test_metrics(y, p, patients, n_boot, 0)
    test_rows += [("n_samples", "none", float(len(y)), None, None),
                  ("n_patients", "none", float(len(np.unique(patients))), None, None)]
    collapsed, reason = is_collapsed(p[:, 0])
    source = "file" if has_predicted else "fixed"
    sha = file_sha256(path)
    config = {"origin": ORIGIN, "source_file": str(path.resolve()), "source_sha256": sha,
              "predicted_from": "the file's predicted_boolean_value" if has_predicted
              else "probability >= 0.5 (the file gave no predicted_boolean_value)",
              "n_boot": n_boot, "bootstrap": "80% of test patients without replacement, sd ddof=0"}
    run_id = records.new_run_id(task.name, model, dataset, None)
    records.start_run(con, run_id, task=task.name, model=model, dataset=dataset, seed=None, config=config,
                      device=None, data_fingerprint=tables_fingerprint(
                          con, [f"samples.{task.table}", "samples.splits"], {"dataset": dataset, "task": task.name}),
                      code_version=code_version("meds"), is_synthetic=is_synthetic(con, dataset))
    results = records.RunResults(
        metrics={"test": test_rows}, predictions=frame,
        summary={"threshold": None if has_predicted else 0.5, "threshold_source": source, "collapsed": collapsed,
                 "collapse_reason": reason, "config": config})
    try:
        records.record_results(con, run_id, results)
    except BaseException as exc:
        records.fail_run(con, run_id, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        con.execute("DROP TABLE IF EXISTS _medtx_import; DROP TABLE IF EXISTS _medtx_samples")
    return ImportedRun(run_id, task.name, dataset, model, len(y), int(y.sum()), len(np.unique(patients)), source)
