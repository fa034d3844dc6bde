"""What a finished run leaves to record, with no warehouse in sight: `RunResults` (metrics, predictions,
attention, checkpoints, summary) and the long-form attention rule (`attention_frame`).

Pure data (numpy, pyarrow): a runner returns a `RunResults`; the worker (medtx.worker) writes its rows as Parquet
into a result package, which the flow records into the warehouse (medtx.pipeline.exchange, medtx.training.records).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from medtx.models.frames import Frame

PREDICTION_COLUMNS = ("run_id", "sample_id", "subject_id", "hadm_id", "label", "prob", "y_true", "predicted", "text")
# ml.val_predictions (migration 0018): what recalibration and operating-point thresholds are fitted on.
VAL_PREDICTION_COLUMNS = ("run_id", "sample_id", "subject_id", "hadm_id", "label", "prob", "y_true")
ATTENTION_COLUMNS = ("run_id", "sample_id", "module", "layer", "head", "query_pos", "key_pos", "weight",
                     "query_token", "key_token")
# ml.predictions / ml.attention column types (warehouse/migrations/0005_ml.sql) for columns a frame may lack.
_TYPES = {"run_id": pa.string(), "sample_id": pa.string(), "subject_id": pa.int64(), "hadm_id": pa.int64(),
          "label": pa.string(), "prob": pa.float64(), "y_true": pa.bool_(), "predicted": pa.bool_(),
          "text": pa.string()}


@dataclass
class RunResults:
    """What a finished run records: test (and val) metrics, per-label scores, confusion cells, predictions,
    attention, checkpoint folders (kind -> (path, epoch)) and the `finish_run` summary fields."""

    metrics: Mapping[str, Sequence[tuple]]  # split -> (metric, averaging, value, sd, n_boot) rows
    predictions: Frame
    label_metrics: Mapping[str, Sequence[tuple]] = field(default_factory=dict)  # split -> rows
    confusion: Mapping[str, Sequence[tuple]] = field(default_factory=dict)  # split -> (true, predicted, n)
    attention: Frame | None = None
    # kind -> (path, epoch) or (path, epoch, monitored metric, its value)
    checkpoints: Mapping[str, tuple] = field(default_factory=dict)
    summary: Mapping[str, Any] = field(default_factory=dict)  # finish_run fields
    val_predictions: Frame | None = None  # validation predictions (binary/multi-label runs), long form


def with_run_id(frame: Any, table: str, run_id: str, columns: Sequence[str], optional: Sequence[str] = ()
                ) -> pa.Table:
    """`frame` (Arrow, or anything with `to_arrow()`) as the rows of `table` for `run_id`, in `columns` order;
    `optional` columns it lacks are NULL, any other missing column is an error naming it."""
    from medtx.models.frames import arrow

    frame = arrow(frame)
    have = set(frame.column_names)
    missing = [c for c in columns if c != "run_id" and c not in have and c not in optional]
    if missing:
        raise ValueError(f"{table}: frame lacks columns {missing}")
    n = frame.num_rows
    out = {}
    for c in columns:
        if c == "run_id":
            out[c] = pa.array([run_id] * n, type=pa.string())
        elif c in have:
            out[c] = frame.column(c)
        else:
            out[c] = pa.nulls(n, type=_TYPES.get(c, pa.string()))
    return pa.table(out)


def new_run_id(task: str, model: str, dataset: str | None, seed: int | None) -> str:
    """Readable and unique: `drug_rec.transformer.synth_10000.s0.3f9a1c2b`."""
    return f"{task}.{model}.{dataset or 'none'}.s{seed if seed is not None else 'x'}.{uuid.uuid4().hex[:8]}"


def epoch_rows(run_id: str, epoch: int, metrics: Mapping[str, float]) -> list[tuple]:
    """One epoch's values as ml.epochs rows (run_id, epoch, split, metric, value, seconds), long form:
    `train_loss` -> (train, loss), `val_pr_auc_samples` -> (val, pr_auc_samples)."""
    seconds = metrics.get("seconds")
    rows = []
    for key, value in metrics.items():
        split, _, metric = key.partition("_")
        if key == "seconds" or split not in ("train", "val"):
            continue
        rows.append((run_id, epoch, split, metric, None if value is None else float(value), seconds))
    return rows


def num(value: float | None) -> float | None:
    """NaN/inf become NULL so SQL aggregates and the dashboard never see them."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def attention_frame(sample_ids: Sequence[Any], attentions: Sequence[dict], max_tokens: int,
                    keep: str = "last") -> pa.Table:
    """Long-form attention rows of the showcase samples; `keep` = "last" or "first" `max_tokens` positions."""
    if keep not in ("last", "first"):
        raise ValueError(f"attention_frame: keep must be 'last' or 'first', got {keep!r}")
    cut = slice(-max_tokens, None) if keep == "last" else slice(0, max_tokens)
    parts = []
    for sample_id, modules in zip(sample_ids, attentions, strict=True):
        for module, (weights, q_tokens, k_tokens) in modules.items():
            w = weights[:, :, cut, cut]
            qt, kt = list(q_tokens)[cut], list(k_tokens)[cut]
            grid = np.indices(w.shape).reshape(4, -1)
            n = grid.shape[1]
            parts.append(pa.table({
                "sample_id": pa.array([str(sample_id)] * n, type=pa.string()),
                "module": pa.array([module] * n, type=pa.string()),
                "layer": grid[0].astype(np.int32), "head": grid[1].astype(np.int32),
                "query_pos": grid[2].astype(np.int32), "key_pos": grid[3].astype(np.int32),
                "weight": w.reshape(-1).astype(np.float32),
                "query_token": pa.array(np.asarray(qt, dtype=object)[grid[2]].astype(str).tolist(), type=pa.string()),
                "key_token": pa.array(np.asarray(kt, dtype=object)[grid[3]].astype(str).tolist(), type=pa.string()),
            }))
    if not parts:
        return pa.table({c: pa.array([], type=t) for c, t in (
            ("sample_id", pa.string()), ("module", pa.string()), ("layer", pa.int32()), ("head", pa.int32()),
            ("query_pos", pa.int32()), ("key_pos", pa.int32()), ("weight", pa.float32()),
            ("query_token", pa.string()), ("key_token", pa.string()))})
    return pa.concat_tables(parts)
