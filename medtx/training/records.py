"""Recording runs into the `ml` schema (warehouse/migrations/0005_ml.sql): runs, epochs, metrics, predictions,
attention and checkpoint folders.

Every writer is one transaction and idempotent: it deletes what it is about to write for the run (and the
split/epoch in question) before inserting, so a retried task never duplicates rows. A run goes
`running` -> `completed` | `failed`; `start_run` on an existing run id wipes that run's old rows first.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import duckdb
import pyarrow as pa

from medtx.store.db import insert_arrow, insert_rows, quote_ident, quote_table, transaction
from medtx.store.run_owners import claim, heartbeat
from medtx.training.results import (  # noqa: F401  (new_run_id, RunResults: re-exported)
    ATTENTION_COLUMNS,
    PREDICTION_COLUMNS,
    VAL_PREDICTION_COLUMNS,
    RunResults,
    epoch_rows,
    new_run_id,
    with_run_id,
)
from medtx.training.results import num as _num

log = logging.getLogger("medtx.training")

# Every ml table keyed by run_id, in the order a run's rows are deleted.
RUN_TABLES = ("ml.comparisons", "ml.subgroups", "ml.subgroup_gaps", "ml.calibration", "ml.recalibration",
              "ml.operating_targets", "ml.reliability",
              "ml.operating_points", "ml.decision_curve", "ml.attention", "ml.predictions", "ml.val_predictions",
              "ml.confusion", "ml.label_metrics", "ml.metrics", "ml.epochs", "ml.models", "ml.runs")


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # TIMESTAMP columns hold naive UTC


def start_run(
    con: duckdb.DuckDBPyConnection, run_id: str, *, task: str, model: str, dataset: str | None,
    seed: int | None, config: Mapping[str, Any] | None, device: str | None = None,
    data_fingerprint: str | None = None, code_version: str | None = None, is_synthetic: bool = False,
    pipeline_run_id: str | None = None,
) -> str:
    """Insert the run as `running` (replacing any earlier rows of the same run id)."""
    with transaction(con):
        for table in RUN_TABLES:
            con.execute(f"DELETE FROM {quote_table(table)} WHERE run_id = ?", [run_id])
        # Comparisons against this run as the reference described its old predictions: recomputed on finish.
        con.execute("DELETE FROM ml.comparisons WHERE reference_run_id = ?", [run_id])
        con.execute(
            "INSERT INTO ml.runs (run_id, task, model, status, config, seed, device, data_fingerprint, "
            "code_version, dataset, is_synthetic, started_at, pipeline_run_id) "
            "VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [run_id, task, model, json.dumps(config or {}, default=str), seed, device, data_fingerprint,
             code_version, dataset, is_synthetic, _now(), pipeline_run_id],
        )
        claim(con, "ml.runs", run_id)  # this process owns it: a kill -9 is noticed by the next start
    return run_id


# Connections (by id) inside `recording`: the writers join its one transaction instead of opening their own.
_RECORDING: set[int] = set()


@contextmanager
def _write(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """One writer's transaction, or the enclosing `recording` transaction when there is one."""
    if id(con) in _RECORDING:
        yield con
        return
    with transaction(con):
        yield con


@contextmanager
def recording(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """Every writer called inside is part of one transaction: a run's results land together or not at all."""
    with transaction(con):
        _RECORDING.add(id(con))
        try:
            yield con
        finally:
            _RECORDING.discard(id(con))


def record_results(con: duckdb.DuckDBPyConnection, run_id: str, results: RunResults) -> None:
    """Write a finished run's results and mark it `completed`, in one transaction; then qualify it (intervals,
    comparisons: `finish_run`'s second half)."""
    with recording(con):
        for split, rows in results.metrics.items():
            write_metrics(con, run_id, split, rows)
        for split, rows in results.label_metrics.items():
            write_label_metrics(con, run_id, split, rows)
        for split, rows in results.confusion.items():
            write_confusion(con, run_id, split, list(rows))
        write_predictions(con, run_id, results.predictions)
        if results.val_predictions is not None:
            write_val_predictions(con, run_id, results.val_predictions)
        if results.attention is not None and len(results.attention):
            write_attention(con, run_id, results.attention)
        for kind, (path, epoch, *monitored) in results.checkpoints.items():
            register_checkpoint(con, run_id, kind, str(path), epoch, *monitored)
        _mark_completed(con, run_id, dict(results.summary))
    _analyse(con, run_id)


def finish_run(con: duckdb.DuckDBPyConnection, run_id: str, **fields: Any) -> None:
    """Mark the run `completed` and set summary fields (threshold, threshold_source, collapsed,
    collapse_reason, n_params, best_epoch, train_seconds, device, config)."""
    _mark_completed(con, run_id, fields)
    _analyse(con, run_id)


def _mark_completed(con: duckdb.DuckDBPyConnection, run_id: str, fields: dict[str, Any]) -> None:
    allowed = {"threshold", "threshold_source", "collapsed", "collapse_reason", "n_params", "best_epoch",
               "train_seconds", "device", "config"}
    unknown = set(fields) - allowed
    if unknown:
        raise ValueError(f"finish_run: unknown ml.runs fields {sorted(unknown)}")
    if "config" in fields:
        fields["config"] = json.dumps(fields["config"], default=str)
    sets_sql = "".join(f", {quote_ident(k)} = ?" for k in fields)  # names checked against ml.runs above
    with _write(con):
        con.execute(
            f"UPDATE ml.runs SET status = 'completed', finished_at = ?, error = NULL"
            f"{sets_sql} WHERE run_id = ?",
            [_now(), *fields.values(), run_id],
        )


def _analyse(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    # Every runner (EHR, text, FAQ) ends here with its test predictions stored: the patient-bootstrap
    # intervals and the paired comparisons against the reference baseline are computed now, once.
    # A run whose figures cannot be qualified (e.g. it predicted other test samples than the reference) must
    # not stay `completed` beside comparisons that left it out: it is marked failed with the reason.
    from medtx.evaluation.analysis import analyse_run

    try:
        analyse_run(con, run_id)
    except Exception as exc:
        fail_run(con, run_id, f"test intervals/comparisons: {type(exc).__name__}: {exc}")
        raise


def fail_run(con: duckdb.DuckDBPyConnection, run_id: str, error: str) -> None:
    """Mark the run `failed`, keeping the error text (the rows written so far stay for diagnosis)."""
    with _write(con):
        con.execute("UPDATE ml.runs SET status = 'failed', finished_at = ?, error = ? WHERE run_id = ?",
                    [_now(), error[:4000], run_id])


def write_epochs(con: duckdb.DuckDBPyConnection, run_id: str, epoch: int, metrics: Mapping[str, float]) -> None:
    """One epoch's values, long form: `train_loss` -> (train, loss), `val_pr_auc_samples` -> (val, pr_auc_samples)."""
    rows = epoch_rows(run_id, epoch, metrics)
    with _write(con):
        heartbeat(con, "ml.runs", run_id)  # the owner is alive: it just finished an epoch
        con.execute("DELETE FROM ml.epochs WHERE run_id = ? AND epoch = ?", [run_id, epoch])
        if rows:
            insert_rows(con, "ml.epochs", rows)


def write_metrics(
    con: duckdb.DuckDBPyConnection, run_id: str, split: str,
    rows: Iterable[tuple[str, str, float, float | None, int | None]],
) -> None:
    """Replace a split's final metrics: rows of (metric, averaging, value, sd, n_boot)."""
    data = [(run_id, split, m, a, _num(v), _num(sd), n) for m, a, v, sd, n in rows]
    with _write(con):
        con.execute("DELETE FROM ml.metrics WHERE run_id = ? AND split = ?", [run_id, split])
        if data:
            # Named columns: migration 0011 added the interval columns, filled later by medtx.evaluation.uncertainty.
            insert_rows(con, "ml.metrics", data,
                        columns=("run_id", "split", "metric", "averaging", "value", "sd", "n_boot"))


def write_label_metrics(
    con: duckdb.DuckDBPyConnection, run_id: str, split: str, rows: Iterable[tuple[str, str, float, int]]
) -> None:
    """Replace a split's per-label scores: rows of (label, metric, value, support)."""
    data = [(run_id, split, label, m, _num(v), int(s)) for label, m, v, s in rows]
    with _write(con):
        con.execute("DELETE FROM ml.label_metrics WHERE run_id = ? AND split = ?", [run_id, split])
        if data:
            insert_rows(con, "ml.label_metrics", data)


def _insert_frame(con: duckdb.DuckDBPyConnection, table: str, run_id: str, rows: pa.Table) -> None:
    with _write(con):
        con.execute(f"DELETE FROM {quote_table(table)} WHERE run_id = ?", [run_id])
        insert_arrow(con, table, rows)


def write_predictions(con: duckdb.DuckDBPyConnection, run_id: str, frame) -> None:
    """Replace the run's test predictions (long form: one row per sample and label; Arrow or polars)."""
    rows = with_run_id(frame, "ml.predictions", run_id, PREDICTION_COLUMNS,
                       optional=("subject_id", "hadm_id", "text", "y_true", "predicted"))
    _insert_frame(con, "ml.predictions", run_id, rows)


def write_val_predictions(con: duckdb.DuckDBPyConnection, run_id: str, frame) -> None:
    """Replace the run's validation predictions (ml.val_predictions; Arrow or polars)."""
    rows = with_run_id(frame, "ml.val_predictions", run_id, VAL_PREDICTION_COLUMNS,
                       optional=("subject_id", "hadm_id"))
    _insert_frame(con, "ml.val_predictions", run_id, rows)


def write_attention(con: duckdb.DuckDBPyConnection, run_id: str, frame) -> None:
    """Replace the run's stored attention weights (long form, see `attention_frame`; Arrow or polars)."""
    _insert_frame(con, "ml.attention", run_id, with_run_id(frame, "ml.attention", run_id, ATTENTION_COLUMNS))


def register_checkpoint(
    con: duckdb.DuckDBPyConnection, run_id: str, kind: str, path: str, epoch: int | None = None,
    metric: str | None = None, value: float | None = None,
) -> None:
    """Record a checkpoint folder (`best`, `last` or `pretrained`) of a run in ml.models."""
    with _write(con):
        con.execute("DELETE FROM ml.models WHERE run_id = ? AND kind = ?", [run_id, kind])
        con.execute("INSERT INTO ml.models (run_id, kind, path, epoch, metric, value) VALUES (?, ?, ?, ?, ?, ?)",
                    [run_id, kind, str(path), epoch, metric, _num(value)])


def write_confusion(con, run_id: str, split: str, rows: list[tuple[str, str, int]]) -> None:
    """Replace a split's confusion cells (true, predicted, n) in ml.confusion."""
    with _write(con):
        con.execute("DELETE FROM ml.confusion WHERE run_id = ? AND split = ?", [run_id, split])
        if rows:
            insert_rows(con, "ml.confusion", [(run_id, split, *r) for r in rows])
