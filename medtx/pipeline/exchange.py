"""Workers compute, the flow writes: training and result packages in an exchange folder.

DuckDB allows one writing process per file and is not safe on network file systems, so a training never opens
the warehouse. Instead:

1. the flow (the only warehouse writer) exports a *training package* for a step: every table the step declares
   it reads (`Step.reads`), filtered to the step's dataset/task scope, as Parquet files plus a manifest, into
   `<exchange>/packages/<key>/`. The key is a hash of the tables and their fingerprints, so one package serves
   every model and seed of a (task, dataset) and an unchanged one is never written twice;
2. a worker (a thread, a process, a Dask worker on another machine that mounts the exchange folder, or
   `python -m medtx.worker` on a machine without DuckDB) reads ONLY those tables (an undeclared read fails loudly
   instead of training on empty data), trains the run from them (medtx.worker.train_run: EHR, notes or FAQ) and
   writes a *result package*: the run's rows of every `ml.*` result table as Parquet plus its checkpoint folders,
   published by an atomic rename (a killed worker leaves no package, never half of one:
   medtx.training.packages);
3. the flow records the result package into the warehouse in one transaction, idempotently: a run already
   recorded with the same content is left as it is. Before a worker sees a package, the flow records the step's
   dispatch (ml.dispatches: the package's content digest, step, pipeline run, task, dataset, model, seed) and
   hands the digest to the worker; the result is recorded only as the answer to that awaited dispatch, under a
   run id the warehouse does not hold (issue 44: the exchange folder is authenticated against the warehouse,
   not against itself).

The exchange folder is untrusted input (medtx.training.integrity): every package's manifest lists the sha256 of
each of its files, checked before use. A damaged training package (a cut file, a missing or garbage manifest) is
rebuilt, never reused; a result package is recorded only when its files match, its run ids are plain names, and
every row it holds belongs to a run its manifest names — then it is deleted.

The exchange location is a folder (local by default). An object store slots in by syncing these folders
(packages are immutable, content-addressed; results are write-once), e.g. with fsspec or `aws s3 sync`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb

from medtx.training.integrity import PackageDamaged, check_package, content_digest, file_digests, safe_name
from medtx.training.packages import MANIFEST, RESULT_TABLES, now, publish_dir
from medtx.store.fingerprint import tables_fingerprint
from medtx.store.db import open_warehouse, param_marks, quote_ident, quote_table, sql_literal, transaction

log = logging.getLogger("medtx.pipeline")
_TABLE = re.compile(r"^[a-z_]+\.[a-z0-9_]+$")


def _checked(name: str) -> str:
    """A declared `schema.table` name (from task/stage declarations; checked anyway before it is quoted)."""
    if not _TABLE.match(name):
        raise ValueError(f"not a warehouse table name: {name!r}")
    return name


def package_key(reads: Iterable[str], scope: Mapping[str, Any], fingerprints: Mapping[str, str]) -> str:
    """Content address of a training package: its tables, their scope and the fingerprints of their rows."""
    body = json.dumps({"reads": sorted(reads), "scope": dict(scope), "fingerprints": dict(fingerprints)},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:24]


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    schema, name = table.split(".")
    return [r[0] for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = ? AND table_name = ?"
        " ORDER BY ordinal_position", [schema, name]).fetchall()]


_publish_dir = publish_dir  # the one atomic publish (medtx.training.packages)


# Tables whose `task` column names the task a record is about, not the samples the step trains on: a task
# trained on another's samples (readmission_notes on readmission's) needs its own rows, so these are scoped by
# dataset only (one small row per task and dataset).
PER_TASK_RECORDS = ("samples.leakage_gate", "samples.leakage_shortcuts")


def export_training_package(db: Path | str, reads: Iterable[str], scope: Mapping[str, Any], exchange: Path | str,
                            key: str, samples: Sequence[str] = ()) -> Path:
    """Write the tables a training step reads (rows of its dataset/task where the table has those columns)
    to `<exchange>/packages/<key>/`; reuse the folder when it already exists and every file matches its
    manifest's hashes, else discard it (logged) and write it again. `samples`: the tables whose fingerprint is a
    run's `ml.runs.data_fingerprint` (the task's samples and split, `samples_fingerprint` in the manifest: the
    rule an imported run's fingerprint follows too, medtx.meds.import_predictions)."""
    dest = Path(exchange) / "packages" / key
    if dest.exists() or dest.is_symlink():
        try:
            manifest = _check_training_package(dest)
            with open_warehouse(db, read_only=True, wait_s=120) as con:
                now_fingerprint = package_fingerprint(con, reads, scope)
            if manifest["data_fingerprint"] != now_fingerprint:  # e.g. a gate record written since
                raise PackageDamaged(f"{dest}: its rows are no longer the warehouse's (data fingerprint "
                                     f"{manifest['data_fingerprint']}, now {now_fingerprint})")
            return dest
        except PackageDamaged as exc:
            log.warning("%s; rebuilding the training package %s", exc, dest)
            _discard(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=dest.parent))
    tables: dict[str, int] = {}
    with open_warehouse(db, read_only=True, wait_s=120) as con:
        for table in sorted(set(reads)):
            cols = _columns(con, table)
            filters = [(c, v) for c, v in scope.items() if c in cols and v is not None
                       and not (c == "task" and table in PER_TASK_RECORDS)]
            # COPY takes no bound parameters: the scope values go in through the quoting helper.
            where_sql = " AND ".join(f"{quote_ident(c)} = {sql_literal(v)}" for c, v in filters) or "true"
            select_sql = f"SELECT * FROM {quote_table(_checked(table))} WHERE {where_sql}"
            tables[table] = con.execute(f"SELECT count(*) FROM ({select_sql})").fetchall()[0][0]
            # zstd, not DuckDB's default snappy: full-scale EHR packages 26-29% smaller, MTSamples' notes 50%
            con.execute(f"COPY ({select_sql}) TO {sql_literal(tmp / f'{table}.parquet')} "
                        "(FORMAT parquet, COMPRESSION zstd)")
        # what the rows are, as this warehouse fingerprints them: whoever records a result trained on the package
        # elsewhere checks it against its own warehouse (benchmarks/gpu/record.py), not the dataset's name alone
        data_fingerprint = package_fingerprint(con, reads, scope)
        samples_fingerprint = tables_fingerprint(con, list(samples), dict(scope)) if samples else None
    manifest = {"key": key, "tables": tables, "scope": dict(scope), "data_fingerprint": data_fingerprint,
                "samples_fingerprint": samples_fingerprint, "files": file_digests(tmp)}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
    return _publish_dir(tmp, dest)


def package_fingerprint(con: duckdb.DuckDBPyConnection, reads: Iterable[str], scope: Mapping[str, Any]) -> str:
    """The fingerprint of exactly the rows a training package of `reads` and `scope` holds (export_training_package's
    filters: the per-task records by dataset only). Not the step's cache key (medtx.pipeline.runs, which scopes
    every table by task): a gate record of a task trained on another's samples (readmission_notes) changes this
    one, so a package exported before that record existed is written again instead of failing every training for
    want of it."""
    tables = sorted(set(reads))
    per_task = [t for t in tables if t in PER_TASK_RECORDS]
    rest = [t for t in tables if t not in PER_TASK_RECORDS]
    by_dataset = {k: v for k, v in scope.items() if k != "task"}
    return (tables_fingerprint(con, rest, dict(scope))
            + (f"+{tables_fingerprint(con, per_task, by_dataset)}" if per_task else ""))


def _check_training_package(folder: Path) -> dict[str, Any]:
    """The manifest of a training package that may be reused, else PackageDamaged: every file matches its hash
    (check_package), every table it lists has its file among them (a manifest naming a table whose file is gone
    passed the hash check and failed every training after it, for ever), and it carries its data fingerprint (an
    older medtx's package is written again)."""
    manifest = check_package(folder)
    tables, files = manifest.get("tables"), manifest.get("files") or {}
    if not isinstance(tables, dict):
        raise PackageDamaged(f"{folder / MANIFEST}: 'tables' is {tables!r}, not a table -> rows mapping")
    for table in tables:
        if f"{table}.parquet" not in files:
            raise PackageDamaged(f"{folder}: the manifest lists table {table} but not its file {table}.parquet")
    if not isinstance(manifest.get("data_fingerprint"), str):
        raise PackageDamaged(f"{folder / MANIFEST}: no data fingerprint (written by an older medtx)")
    return manifest


def _discard(folder: Path) -> None:
    """Move a damaged package out of the way (one rename, so no reader sees half of it), then delete it."""
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink(missing_ok=True)
        return
    aside = folder.with_name(f".damaged-{folder.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


class ResultRefused(PackageDamaged):
    """A result package that is intact but not what the warehouse asked for (no awaited dispatch, another run,
    another package, a run id the warehouse already holds); the message says which, nothing was written."""


def dispatch_training(db: Path | str, dispatch_id: str, step: Any, package: Path | str, key: str,
                      fingerprints: Mapping[str, str], pipeline_run_id: str | None) -> str:
    """Record in ml.dispatches that the training `step` is handed out on `package` (its content digest, computed
    here from the files) and that its result is awaited; returns the digest (what the worker is told out of band,
    and what its result must say it trained on). A dispatch id already recorded is an error (never reused)."""
    digest = content_digest(package)
    spec = step.spec()
    params = spec["params"]
    with open_warehouse(db, wait_s=120) as con, transaction(con):
        con.execute("INSERT INTO ml.dispatches (dispatch_id, pipeline_run_id, step, task, dataset, model, seed, "
                    "package_key, package_digest, data_fingerprint, status, dispatched_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'awaiting', ?)",
                    [dispatch_id, pipeline_run_id, step.name, spec["task"], spec["dataset"], params["model"],
                     int(params["seed"]), key, digest, json.dumps(dict(fingerprints), sort_keys=True, default=str),
                     now()])
    return digest


def record_result_package(db: Path | str, result_dir: Path | str, models_dir: Path | str, *,
                          dispatch_id: str | None = None, cleanup: bool = True) -> list[str]:
    """Flow side: check the package (check_result_package), copy its checkpoints under `models_dir` and insert
    its rows into the warehouse in one transaction, then (`cleanup`) delete it.

    With `dispatch_id` (the pipeline, `medtx train`) the package must answer that awaited dispatch
    (`_check_dispatch`): one run, of its task, dataset, model, seed and pipeline run, trained on its package; the
    dispatch is closed in the same transaction. Without (results trained elsewhere, benchmarks/gpu/record.py)
    every run must be new to the warehouse. Either way a run the warehouse already holds is never replaced: a
    package whose runs are all recorded in the same final state is a no-op (a retry), anything else touching a
    recorded run is refused (ResultRefused). A refused package raises, is left in place and writes nothing."""
    result_dir, models_dir = Path(result_dir), Path(models_dir)
    manifest = check_result_package(result_dir, models_dir)
    run_ids: list[str] = manifest["run_ids"]
    if not run_ids:
        _remove_result(result_dir, cleanup)
        return []
    marks_sql = param_marks(len(run_ids))
    runs_file = str(result_dir / "ml.runs.parquet")
    with open_warehouse(db, wait_s=120) as con:
        same = con.execute("SELECT count(*) FROM ml.runs r JOIN read_parquet(?) i USING (run_id) "
                           "WHERE r.status = i.status AND r.finished_at IS NOT DISTINCT FROM i.finished_at",
                           [runs_file]).fetchall()
        if same[0][0] == len(run_ids):
            _remove_result(result_dir, cleanup)
            return run_ids
        held = con.execute(f"SELECT run_id, status FROM ml.runs WHERE run_id IN ({marks_sql}) ORDER BY 1",
                           run_ids).fetchall()
        if held:
            raise ResultRefused(f"{result_dir}: run {held[0][0]} is already in the warehouse ({held[0][1]}); a "
                                "result package never replaces a recorded run (rerun the step); nothing was recorded")
        if dispatch_id is not None:
            _check_dispatch(con, dispatch_id, result_dir, manifest)
        for run_id in run_ids:
            if (result_dir / "models" / run_id).exists():
                shutil.copytree(result_dir / "models" / run_id, models_dir / run_id, dirs_exist_ok=True)
        with transaction(con):
            for table in RESULT_TABLES:
                con.execute(f"INSERT INTO {quote_table(_checked(table))} BY NAME SELECT * FROM read_parquet(?)",
                            [str(result_dir / f"{table}.parquet")])
            con.execute(f"UPDATE ml.models SET path = replace(path, ?, ?) WHERE run_id IN ({marks_sql})",
                        [manifest["models_root"], str(models_dir), *run_ids])
            if dispatch_id is not None:
                con.execute("UPDATE ml.dispatches SET status = 'recorded', run_ids = ?, recorded_at = ? "
                            "WHERE dispatch_id = ?", [run_ids, now(), dispatch_id])
        _analyse(con, run_ids)
    _remove_result(result_dir, cleanup)
    return run_ids


_DISPATCHED = ("task", "dataset", "model", "seed", "pipeline_run_id")


def _check_dispatch(con: duckdb.DuckDBPyConnection, dispatch_id: str, result_dir: Path,
                    manifest: Mapping[str, Any]) -> None:
    """ResultRefused unless the package answers the awaited dispatch `dispatch_id`: one run whose task, dataset,
    model, seed and pipeline run are the dispatch's, trained on the package the dispatch handed out (the digest
    the worker computed from what it read)."""
    found = con.execute(f"SELECT status, package_digest, {', '.join(_DISPATCHED)} FROM ml.dispatches "
                        "WHERE dispatch_id = ?", [dispatch_id]).fetchall()
    if not found:
        raise ResultRefused(f"{result_dir}: no training was dispatched as {dispatch_id!r}; nothing was recorded")
    status, digest, *wanted = found[0]
    if status != "awaiting":
        raise ResultRefused(f"{result_dir}: dispatch {dispatch_id!r} is {status}, no result is awaited; "
                            "nothing was recorded")
    if len(manifest["run_ids"]) != 1:
        raise ResultRefused(f"{result_dir}: {len(manifest['run_ids'])} runs for dispatch {dispatch_id!r}, which "
                            "asked for one; nothing was recorded")
    rows = con.execute(f"SELECT {', '.join(_DISPATCHED)} FROM read_parquet(?)",
                       [str(result_dir / "ml.runs.parquet")]).fetchall()
    if len(rows) != 1:
        raise ResultRefused(f"{result_dir / 'ml.runs.parquet'}: {len(rows)} rows, one run expected")
    for column, want, got in zip(_DISPATCHED, wanted, rows[0], strict=True):
        if want != got:
            raise ResultRefused(f"{result_dir / 'ml.runs.parquet'}: {column} {got!r}, dispatch {dispatch_id!r} "
                                f"asked for {want!r}; nothing was recorded")
    trained_on = manifest.get("trained_on")
    if trained_on != digest:
        raise ResultRefused(f"{result_dir / MANIFEST}: trained on package {trained_on!r}, dispatch {dispatch_id!r} "
                            f"handed out {digest[:16]}...; nothing was recorded")


def check_result_package(result_dir: Path, models_dir: Path) -> dict[str, Any]:
    """The manifest of a result package that may be recorded, else PackageDamaged (one line): every file matches
    its hash; the run ids are plain names (a run id `../../x` would copy checkpoints outside `models_dir`); every
    row of every result table, and every checkpoint folder, belongs to a run the manifest names (a package may
    not write another run's rows); every checkpoint path lands inside its own run's folder."""
    manifest = check_package(result_dir)
    run_ids = manifest.get("run_ids")
    if not isinstance(run_ids, list):
        raise PackageDamaged(f"{result_dir / MANIFEST}: 'run_ids' is {run_ids!r}, not a list of run ids")
    for run_id in run_ids:
        safe_name(run_id, f"run id in {result_dir / MANIFEST}:")
    root = manifest.get("models_root")
    if not isinstance(root, str) or not root:
        raise PackageDamaged(f"{result_dir / MANIFEST}: 'models_root' is {root!r}, not a folder path")
    if (result_dir / "models").is_dir():
        for child in sorted((result_dir / "models").iterdir()):
            if child.name not in run_ids:
                raise PackageDamaged(f"{child}: checkpoints of a run the manifest does not name")
    with duckdb.connect() as con:  # in memory: the package is read before the warehouse is opened
        for table in RESULT_TABLES:
            path = result_dir / f"{table}.parquet"
            if not path.is_file():
                raise PackageDamaged(f"{path}: missing (a result package holds every result table)")
            foreign = con.execute("SELECT run_id, count(*) FROM read_parquet(?) WHERE run_id IS NULL "
                                  "OR NOT list_contains(?::VARCHAR[], run_id) GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 1",
                                  [str(path), run_ids]).fetchall()
            if foreign:
                other, n = foreign[0]
                raise PackageDamaged(f"{path}: {n:,} row(s) of run {other!r}, which the package's manifest does not "
                                     f"name ({', '.join(run_ids) or 'none'}); nothing was recorded")
        _check_figures(con, result_dir)
        paths = con.execute("SELECT run_id, path FROM read_parquet(?) WHERE path IS NOT NULL",
                            [str(result_dir / "ml.models.parquet")]).fetchall()
    for run_id, path in paths:
        moved = Path(os.path.normpath(str(path).replace(root, str(models_dir), 1)))
        if not path.startswith(root) or not moved.is_relative_to(Path(os.path.normpath(models_dir)) / run_id):
            raise PackageDamaged(f"{result_dir / 'ml.models.parquet'}: checkpoint path {path!r} of run {run_id} is "
                                 f"not inside its own folder under {root}")
    return manifest


# Metrics that are proportions or areas: a value outside [0, 1] is not a figure (a forged 1e9 is refused). The
# writer recomputes every test figure it can from the predictions anyway (medtx.evaluation.uncertainty).
_UNIT_METRIC = r"auc|auroc|auprc|f1|accuracy|precision|recall|jaccard|brier|ece|rp80|exact_match|positive_rate"


def _check_figures(con: duckdb.DuckDBPyConnection, result_dir: Path) -> None:
    """PackageDamaged for a figure no training writes: a probability outside [0, 1] or NaN in ml.predictions, a
    non-finite metric value, or a proportion-type metric outside [0, 1] (ml.metrics, ml.label_metrics)."""
    bad = con.execute("SELECT sample_id, prob FROM read_parquet(?) WHERE prob IS NOT NULL AND (isnan(prob) OR "
                      "prob < 0 OR prob > 1) LIMIT 1", [str(result_dir / "ml.predictions.parquet")]).fetchall()
    if bad:
        raise PackageDamaged(f"{result_dir / 'ml.predictions.parquet'}: sample {bad[0][0]} has probability "
                             f"{bad[0][1]!r}, not within [0, 1]; nothing was recorded")
    for table in ("ml.metrics", "ml.label_metrics"):
        bad = con.execute("SELECT metric, value FROM read_parquet(?) WHERE value IS NOT NULL AND (isnan(value) OR "
                          "isinf(value) OR (regexp_matches(metric, ?) AND (value < 0 OR value > 1))) LIMIT 1",
                          [str(result_dir / f"{table}.parquet"), _UNIT_METRIC]).fetchall()
        if bad:
            raise PackageDamaged(f"{result_dir / f'{table}.parquet'}: {bad[0][0]} = {bad[0][1]!r}, not a value "
                                 "that metric takes; nothing was recorded")


def _remove_result(result_dir: Path, cleanup: bool) -> None:
    """A recorded result package is deleted (23 MB per tiny run were kept forever), and its run's folder with
    its last package. MEDTX_KEEP_RESULTS=1 keeps them (to inspect which worker trained what)."""
    if not cleanup or os.environ.get("MEDTX_KEEP_RESULTS") == "1":
        return
    shutil.rmtree(result_dir, ignore_errors=True)
    try:
        result_dir.parent.rmdir()  # results/<pipeline run>/ once its last step's package is gone
    except OSError:
        pass


def _analyse(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> None:
    """What a run's figures need beyond its own rows, computed by the writer: the patient-bootstrap intervals of
    its test metrics (a worker without DuckDB stores the point estimates only), the paired comparisons with the
    reference baseline (the other runs of the (task, dataset) live only here) and the rest of `analyse_run`.
    A run whose figures cannot be qualified (e.g. other test samples than the reference's) is marked failed, as
    in finish_run; the other runs of the package are still analysed."""
    from medtx.evaluation.analysis import analyse_run
    from medtx.training.records import fail_run

    completed = [r for (r,) in con.execute(f"SELECT run_id FROM ml.runs WHERE run_id IN ({param_marks(len(run_ids))}) "
                                           "AND status = 'completed' ORDER BY run_id", run_ids).fetchall()]
    for run_id in completed:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            analyse_run(con, run_id)
            log.info("analysis: run %s in %.2f s (%.2f s CPU)", run_id, time.perf_counter() - started,
                     time.thread_time() - cpu)
        except Exception as exc:
            fail_run(con, run_id, f"test intervals/comparisons: {type(exc).__name__}: {exc}")
