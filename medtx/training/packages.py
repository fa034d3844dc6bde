"""The two package formats of the exchange folder, read and written with pyarrow alone (no DuckDB, no polars), so
that a worker on a machine with only torch, numpy and pyarrow (medtx.worker) can use them.

- A *training package* (written by the flow, medtx.pipeline.exchange.export_training_package): `manifest.json`
  ({"key", "tables": {table: rows}, "scope"}) and one `<schema.table>.parquet` per table the step reads.
- A *result package* (written by a worker, recorded by the flow): `manifest.json` ({"run_ids", "models_root",
  "worker", "error"}), one `<schema.table>.parquet` per `RESULT_TABLES` entry holding the runs' rows (empty
  files keep their columns), and `models/<run_id>/` checkpoint folders. Published by an atomic rename: a killed
  worker leaves no package, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from medtx.training.integrity import PackageDamaged, file_digests, sha256_bytes, verify

from medtx.training.results import (
    ATTENTION_COLUMNS,
    PREDICTION_COLUMNS,
    VAL_PREDICTION_COLUMNS,
    RunResults,
    num,
    with_run_id,
)

MANIFEST = "manifest.json"
# Result tables a run writes, all keyed by run_id (ml.runs first: it names the runs of a package).
RESULT_TABLES = ("ml.runs", "ml.models", "ml.epochs", "ml.metrics", "ml.label_metrics", "ml.confusion",
                 "ml.predictions", "ml.val_predictions", "ml.attention")

_S, _I32, _I64, _F64, _B, _TS = pa.string(), pa.int32(), pa.int64(), pa.float64(), pa.bool_(), pa.timestamp("us")
# The columns of each result table a worker fills (warehouse/migrations: 0005_ml.sql and later); the flow inserts
# BY NAME, so a column named here that the warehouse lacks fails the recording loudly instead of being dropped.
SCHEMAS: dict[str, pa.Schema] = {
    "ml.runs": pa.schema([
        ("run_id", _S), ("task", _S), ("model", _S), ("status", _S), ("config", _S), ("seed", _I32), ("device", _S),
        ("data_fingerprint", _S), ("code_version", _S), ("dataset", _S), ("is_synthetic", _B), ("threshold", _F64),
        ("threshold_source", _S), ("collapsed", _B), ("collapse_reason", _S), ("n_params", _I64),
        ("best_epoch", _I32), ("train_seconds", _F64), ("started_at", _TS), ("finished_at", _TS), ("error", _S),
        ("pipeline_run_id", _S)]),
    "ml.models": pa.schema([("run_id", _S), ("kind", _S), ("path", _S), ("epoch", _I32), ("metric", _S),
                            ("value", _F64)]),
    "ml.epochs": pa.schema([("run_id", _S), ("epoch", _I32), ("split", _S), ("metric", _S), ("value", _F64),
                            ("seconds", _F64)]),
    "ml.metrics": pa.schema([("run_id", _S), ("split", _S), ("metric", _S), ("averaging", _S), ("value", _F64),
                             ("sd", _F64), ("n_boot", _I32)]),
    "ml.label_metrics": pa.schema([("run_id", _S), ("split", _S), ("label", _S), ("metric", _S), ("value", _F64),
                                   ("support", _I32)]),
    "ml.confusion": pa.schema([("run_id", _S), ("split", _S), ("true_label", _S), ("pred_label", _S), ("n", _I32)]),
    "ml.predictions": pa.schema([("run_id", _S), ("sample_id", _S), ("subject_id", _I64), ("hadm_id", _I64),
                                 ("label", _S), ("prob", _F64), ("y_true", _B), ("predicted", _B), ("text", _S)]),
    "ml.val_predictions": pa.schema([("run_id", _S), ("sample_id", _S), ("subject_id", _I64), ("hadm_id", _I64),
                                     ("label", _S), ("prob", _F64), ("y_true", _B)]),
    "ml.attention": pa.schema([("run_id", _S), ("sample_id", _S), ("module", _S), ("layer", _I32), ("head", _I32),
                               ("query_pos", _I32), ("key_pos", _I32), ("weight", pa.float32()),
                               ("query_token", _S), ("key_token", _S)]),
}


def now() -> datetime:
    """Naive UTC, as the warehouse's TIMESTAMP columns hold it."""
    return datetime.now(UTC).replace(tzinfo=None)


# ----------------------------------------------------------------------------------------------- training packages


class PackageError(ValueError):
    """A training package that cannot be read: the one line names the folder and what is wrong."""


class PackageTables(Mapping[str, pa.Table]):
    """The tables of a checked training package, each read from its Parquet file on first use and kept.

    Why lazily: a package holds every table its step reads, and a run uses some of them only (a synth package
    carries the four oracle tables, 17M rows and ~1 GiB of Arrow memory at 46,520 patients, which only the oracle
    baseline of one task reads): read eagerly, every training process held them for its whole run (issue #35).

    A table is parsed from the very bytes whose sha256 is checked against the manifest (the file read once into
    memory, hashed, then parsed from that buffer), so a file rewritten or cut after the package was opened is a
    PackageError naming it, never rows nobody checked."""

    def __init__(self, package: Path, rows: Mapping[str, int], files: Mapping[str, Any]) -> None:
        self._package, self._rows, self._files, self._read = package, dict(rows), dict(files), {}

    def __getitem__(self, name: str) -> pa.Table:
        if name not in self._rows:
            raise KeyError(name)
        if name not in self._read:
            path = self._package / f"{name}.parquet"
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise PackageError(f"{path}: unreadable after the package was opened ({exc.strerror})") from None
            want = self._files.get(path.name) or {}
            if sha256_bytes(data) != want.get("sha256"):
                raise PackageError(f"{path}: content differs from the manifest's sha256 ({len(data):,} bytes, the "
                                   f"manifest says {want.get('bytes')}): changed after the package was opened")
            self._read[name] = pq.read_table(pa.BufferReader(data))
        return self._read[name]

    def __contains__(self, name: object) -> bool:  # Mapping's would read the table
        return name in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


class MissingTable(LookupError):
    """A table the run reads is not among those it was given (a training package that does not declare it)."""


ORACLE_PREFIX = "raw.synth_oracle_"  # the synthetic generator's oracle tables (medtx.synth.oracle)


def package_table(tables: Mapping[str, pa.Table], name: str) -> pa.Table:
    """One table of a run's package; one the package does not hold is MissingTable naming what it holds."""
    from medtx.models import frames

    if name not in tables:
        raise MissingTable(f"the run reads {name}, which its training package does not hold "
                           f"(it holds {sorted(tables)}): declare it in the task's train_reads")
    return frames.arrow(tables[name])


def rows_where(table: pa.Table, **equal: Any) -> pa.Table:
    """The rows where each given column equals its value (a column the table lacks is skipped)."""
    from medtx.models import frames

    for column, value in equal.items():
        if column in table.column_names:
            table = frames.where(table, column, value)
    return table


def is_synthetic_tables(tables: Mapping[str, pa.Table], dataset: str) -> bool:
    """medtx.training.runs.is_synthetic on a package: the name says so, or an oracle table has rows for it."""
    from medtx.models import frames

    if dataset.startswith("synth"):
        return True
    return any(rows_where(frames.arrow(t), dataset=dataset).num_rows > 0
               for name, t in tables.items() if name.startswith(ORACLE_PREFIX))


def read_training_package(package: Path | str) -> tuple[dict[str, Any], PackageTables]:
    """(manifest, {table: rows}) of a training package; a missing manifest or table file, or a table file whose
    row count differs from the manifest's, is a PackageError. Every file is checked here (its sha256, its row count
    from the Parquet footer), and again when a run first asks for its rows: they are parsed from the bytes that
    were hashed (`PackageTables`), so nothing changed in between is read unchecked."""
    package = Path(package)
    manifest_path = package / MANIFEST
    if not manifest_path.is_file():
        raise PackageError(f"{package}: not a training package (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text())
        names = list(manifest["tables"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PackageError(f"{manifest_path}: unreadable manifest ({type(exc).__name__}: {exc})") from None
    try:  # the exchange folder is untrusted: every file must match the manifest's sha256 before it is read
        verify(package, manifest)
    except PackageDamaged as exc:
        raise PackageError(str(exc)) from None
    for name in names:
        path = package / f"{name}.parquet"
        if not path.is_file():
            raise PackageError(f"{package}: the manifest lists {name} but {path.name} is missing")
        rows = pq.read_metadata(path).num_rows
        if rows != manifest["tables"][name]:
            raise PackageError(f"{path}: {rows} rows, the manifest says {manifest['tables'][name]}")
    return manifest, PackageTables(package, manifest["tables"], manifest["files"])


# ----------------------------------------------------------------------------------------------- result packages


def temp_dir_in(parent: Path, prefix: str) -> Path:
    """A fresh hidden folder in `parent` for a package being written. The flow removes a pipeline run's results
    folder once its last recorded package is gone (exchange._remove_result), possibly while a worker was still
    training: the folder is made again and the creation retried, so that race never fails a finished training."""
    for _ in range(10):
        parent.mkdir(parents=True, exist_ok=True)
        try:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        except FileNotFoundError:  # removed between the mkdir and the mkdtemp: again
            continue
    raise FileNotFoundError(f"{parent}: removed again and again while a package was being written")


def publish_dir(tmp: Path, dest: Path) -> Path:
    """Atomically move a finished folder into place; if another writer won the race, keep theirs."""
    try:
        os.replace(tmp, dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not (dest / MANIFEST).exists():
            raise
    return dest


def _table(name: str, rows: Sequence[tuple]) -> pa.Table:
    schema = SCHEMAS[name]
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in schema]
    return pa.table({f.name: pa.array(list(col), type=f.type) for f, col in zip(schema, columns, strict=True)})


def _cast(name: str, table: pa.Table) -> pa.Table:
    return table.select(SCHEMAS[name].names).cast(SCHEMAS[name])


def run_tables(run: Mapping[str, Any], results: RunResults | None, epochs: Sequence[tuple]) -> dict[str, pa.Table]:
    """The result tables of one run: its ml.runs row (`run`: started as `running`; completed with the results'
    summary, or failed with its error), epochs, and, when it finished, metrics, per-label scores, confusion
    cells, predictions, attention and checkpoints (paths as the worker wrote them)."""
    run_id = run["run_id"]
    row = {f.name: run.get(f.name) for f in SCHEMAS["ml.runs"]}
    row["collapsed"] = bool(row["collapsed"])
    row["is_synthetic"] = bool(row["is_synthetic"])
    out = {"ml.epochs": _table("ml.epochs", list(epochs))}
    if results is None:
        for name in ("ml.models", "ml.metrics", "ml.label_metrics", "ml.confusion", "ml.predictions",
                     "ml.val_predictions", "ml.attention"):
            out[name] = _table(name, [])
    else:
        summary = dict(results.summary)
        if "config" in summary:
            summary["config"] = json.dumps(summary["config"], default=str)
        row.update({k: v for k, v in summary.items() if k in row})
        out["ml.metrics"] = _table("ml.metrics", [(run_id, split, m, a, num(v), num(sd), n)
                                                  for split, rows in results.metrics.items()
                                                  for m, a, v, sd, n in rows])
        out["ml.label_metrics"] = _table("ml.label_metrics", [(run_id, split, label, m, num(v), int(s))
                                                              for split, rows in results.label_metrics.items()
                                                              for label, m, v, s in rows])
        out["ml.confusion"] = _table("ml.confusion", [(run_id, split, *r) for split, rows in results.confusion.items()
                                                      for r in rows])
        out["ml.predictions"] = _cast("ml.predictions", with_run_id(
            results.predictions, "ml.predictions", run_id, PREDICTION_COLUMNS,
            optional=("subject_id", "hadm_id", "text", "y_true", "predicted")))
        out["ml.val_predictions"] = (_cast("ml.val_predictions", with_run_id(
            results.val_predictions, "ml.val_predictions", run_id, VAL_PREDICTION_COLUMNS,
            optional=("subject_id", "hadm_id"))) if results.val_predictions is not None
            else _table("ml.val_predictions", []))
        attention = results.attention
        out["ml.attention"] = (_cast("ml.attention", with_run_id(attention, "ml.attention", run_id, ATTENTION_COLUMNS))
                               if attention is not None and len(attention) else _table("ml.attention", []))
        models = []
        for kind, (path, epoch, *monitored) in results.checkpoints.items():
            metric, value = ([*monitored, None, None])[:2]
            models.append((run_id, kind, str(path), None if epoch is None else int(epoch), metric, num(value)))
        out["ml.models"] = _table("ml.models", models)
        for key in ("n_params", "best_epoch"):
            if row[key] is not None:
                row[key] = int(row[key])
    out["ml.runs"] = _table("ml.runs", [tuple(row[f.name] for f in SCHEMAS["ml.runs"])])
    return out


def replaceable_result(result_dir: Path) -> bool:
    """`result_dir` is absent, or an older result package and nothing else (a folder, not a link, holding only a
    manifest, the result tables and models/): the only thing a worker's output may replace."""
    if not result_dir.exists() and not result_dir.is_symlink():
        return True
    allowed = {MANIFEST, "models", *(f"{name}.parquet" for name in RESULT_TABLES)}
    return (result_dir.is_dir() and not result_dir.is_symlink() and (result_dir / MANIFEST).is_file()
            and all(entry.name in allowed for entry in result_dir.iterdir()))


def write_result_package(result_dir: Path | str, runs: Sequence[dict[str, pa.Table]], models_root: Path,
                         error: str | None = None, trained_on: str | None = None,
                         trained_on_data: Mapping[str, Any] | None = None) -> Path:
    """Publish the result package of `runs` (each `run_tables`' output) at `result_dir`, atomically, with the
    runs' checkpoint folders from `models_root/<run_id>`; `trained_on`: the content digest of the training
    package, as the worker computed it from the files it read (the flow compares it with its dispatch);
    `trained_on_data`: the package's data fingerprint, tables and scope (what a recorder elsewhere compares with
    its own warehouse). A retry
    of the same step replaces an older package; anything else at `result_dir` is a PackageError, untouched."""
    result_dir = Path(result_dir)
    if not replaceable_result(result_dir):
        raise PackageError(f"{result_dir}: exists and is not a result package; a worker never replaces it")
    run_ids = [t["ml.runs"].column("run_id")[0].as_py() for t in runs]
    tmp = temp_dir_in(result_dir.parent, f".{result_dir.name}-")
    try:
        for name in RESULT_TABLES:
            parts = [t[name] for t in runs]
            pq.write_table(pa.concat_tables(parts) if parts else _table(name, []), tmp / f"{name}.parquet",
                           compression="zstd")
        for run_id in run_ids:
            if (models_root / run_id).exists():
                shutil.copytree(models_root / run_id, tmp / "models" / run_id)
        manifest = {"run_ids": run_ids, "models_root": str(models_root),
                    "worker": {"host": socket.gethostname(), "pid": os.getpid()}, "error": error,
                    "trained_on": trained_on, "trained_on_data": dict(trained_on_data or {}),
                    "files": file_digests(tmp)}  # checked by the flow before it records (medtx.training.integrity)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if result_dir.exists():  # a retry of the same step: the newer result replaces the older one
        shutil.rmtree(result_dir)
    return publish_dir(tmp, result_dir)
