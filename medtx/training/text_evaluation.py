"""Evaluating a text run: test metrics with a bootstrap over test units, per-class F1, confusion, long-form
predictions (test; and validation for a binary task, as the EHR runs store them) and the collapse verdict
(`TextEvaluation`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from medtx.metrics.binary import binary_metrics
from medtx.metrics.bootstrap import N_BOOT, bootstrap
from medtx.metrics.classification import classification_metrics, confusion_counts, per_class_f1
from medtx.metrics.collapse import is_collapsed
from medtx.models import frames
from medtx.training.text_config import TextData

log = logging.getLogger("medtx.text")


@dataclass
class TextEvaluation:
    metrics: list[tuple[str, str, float, float | None, int | None]]  # (metric, averaging, value, sd, n_boot)
    label_metrics: list[tuple[str, str, float, int]]  # (label, metric, value, support)
    confusion: list[tuple[str, str, int]]
    predictions: pa.Table  # ml.predictions long form (without run_id)
    collapsed: bool
    collapse_reason: str
    val_predictions: pa.Table | None = None  # ml.val_predictions long form (binary tasks), without run_id
    val_metrics: list[tuple] | None = None  # a binary task's validation figures (no bootstrap), as an EHR run's


def binary_prediction_rows(data: TextData, split: str, probs: np.ndarray) -> pa.Table:
    """A binary task's long-form predictions of one split, one row per note (its admission and patient, the
    positive label, P(positive), the truth): the columns ml.val_predictions holds (ml.predictions adds
    `predicted`)."""
    rows = data.split(split)
    if len(probs) != rows.num_rows:
        raise ValueError(f"{split} probabilities for {len(probs)} notes, the {split} split has {rows.num_rows}")
    return pa.table({
        "sample_id": pa.array(frames.values(rows, "sample_id"), pa.string()),
        "subject_id": pc.cast(rows.column("subject_id"), pa.int64()),
        "hadm_id": pc.cast(rows.column("hadm_id"), pa.int64()),
        "label": pa.array([data.classes[1]] * rows.num_rows, pa.string()),
        "prob": np.asarray(probs, dtype=np.float64), "y_true": frames.numbers(rows, "y").astype(bool),
    })


def evaluate_text(data: TextData, probs: np.ndarray, *, val_probs: np.ndarray | None = None, n_boot: int = N_BOOT,
                  seed: int = 0) -> TextEvaluation:
    """Test metrics (point value + bootstrap mean±sd over 80% of test units), per-class F1, confusion,
    long-form predictions (and a binary task's validation predictions and figures, from `val_probs`) and the
    collapse verdict."""
    test = data.split("test")
    y = frames.numbers(test, "y")
    units = frames.numbers(test, "unit")
    ids = frames.values(test, "sample_id")
    if data.binary:
        pred = (probs >= 0.5).astype(int)
        point = binary_metrics(y, probs)
        boot = bootstrap(lambda idx: binary_metrics(y[idx], probs[idx]), units, n_boot=n_boot, seed=seed)
        collapsed, reason = is_collapsed(probs.astype(np.float64))
        predictions = pa.table({
            "sample_id": pa.array(ids, pa.string()), "label": pa.array([data.classes[1]] * len(ids), pa.string()),
            "prob": probs.astype(np.float64), "y_true": y.astype(bool), "predicted": pred.astype(bool),
            "subject_id": pc.cast(test.column("subject_id"), pa.int64()),
            "hadm_id": pc.cast(test.column("hadm_id"), pa.int64()),
        })
        label_rows, confusion = [], confusion_counts(y, pred, [0, 1])
        confusion = [(data.classes[int(t)], data.classes[int(p)], n) for t, p, n in confusion]
    else:
        classes = range(len(data.classes))
        pred = probs.argmax(axis=1)
        point = classification_metrics(y, pred, classes)
        boot = bootstrap(lambda idx: classification_metrics(y[idx], pred[idx], classes), units,
                         n_boot=n_boot, seed=seed)
        collapsed, reason = is_collapsed(np.asarray([data.classes[p] for p in pred]))
        n, c = probs.shape
        predictions = pa.table({
            "sample_id": pa.array([s for s in ids for _ in range(c)], pa.string()),
            "label": pa.array(list(data.classes) * n, pa.string()), "prob": probs.reshape(-1),
            "y_true": (np.repeat(y, c) == np.tile(np.arange(c), n)),
            "predicted": (np.repeat(pred, c) == np.tile(np.arange(c), n)),
        })
        label_rows = [(data.classes[int(k)], "f1", f, s) for k, f, s in per_class_f1(y, pred, classes)]
        confusion = [(data.classes[int(t)], data.classes[int(p)], k) for t, p, k in confusion_counts(y, pred, classes)]
    # The ml.metrics protocol: value = mean, sd over n_boot resamples of 80% of test units.
    metrics = [(m, "none", boot[m][0], boot[m][1], n_boot) for m in point]
    if collapsed:
        log.warning("COLLAPSED run: %s", reason)
    val_predictions, val_metrics = None, None
    if data.binary and val_probs is not None:
        val_predictions = binary_prediction_rows(data, "val", val_probs)
        y_val = frames.numbers(data.split("val"), "y")
        val_metrics = [(m, "none", v, None, None) for m, v in binary_metrics(y_val, val_probs).items()]
    return TextEvaluation(metrics, label_rows, confusion, predictions, collapsed, reason, val_predictions,
                          val_metrics)
