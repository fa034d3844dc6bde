"""Evaluating a text run: test metrics with a bootstrap over test units, per-class F1, confusion, long-form
predictions and the collapse verdict (`TextEvaluation`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import polars as pl

from medtx.metrics.binary import binary_metrics
from medtx.metrics.bootstrap import N_BOOT, bootstrap
from medtx.metrics.classification import classification_metrics, confusion_counts, per_class_f1
from medtx.metrics.collapse import is_collapsed
from medtx.text.base import TextData

log = logging.getLogger("medtx.text")


@dataclass
class TextEvaluation:
    metrics: list[tuple[str, str, float, float | None, int | None]]  # (metric, averaging, value, sd, n_boot)
    label_metrics: list[tuple[str, str, float, int]]  # (label, metric, value, support)
    confusion: list[tuple[str, str, int]]
    predictions: pl.DataFrame  # ml.predictions long form (without run_id)
    collapsed: bool
    collapse_reason: str


def evaluate_text(data: TextData, probs: np.ndarray, *, n_boot: int = N_BOOT, seed: int = 0) -> TextEvaluation:
    """Test metrics (point value + bootstrap mean±sd over 80% of test units), per-class F1, confusion,
    long-form predictions and the collapse verdict."""
    test = data.split("test")
    y = test["y"].to_numpy()
    units = test["unit"].to_numpy()
    ids = test["sample_id"].to_list()
    if data.binary:
        pred = (probs >= 0.5).astype(int)
        point = binary_metrics(y, probs)
        boot = bootstrap(lambda idx: binary_metrics(y[idx], probs[idx]), units, n_boot=n_boot, seed=seed)
        collapsed, reason = is_collapsed(probs.astype(np.float64))
        predictions = pl.DataFrame({
            "sample_id": ids, "label": [data.classes[1]] * len(ids), "prob": probs.astype(np.float64),
            "y_true": y.astype(bool), "predicted": pred.astype(bool),
            "subject_id": test["subject_id"].cast(pl.Int64), "hadm_id": test["hadm_id"].cast(pl.Int64),
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
        predictions = pl.DataFrame({
            "sample_id": np.repeat(ids, c), "label": np.tile(data.classes, n), "prob": probs.reshape(-1),
            "y_true": (np.repeat(y, c) == np.tile(np.arange(c), n)),
            "predicted": (np.repeat(pred, c) == np.tile(np.arange(c), n)),
        })
        label_rows = [(data.classes[int(k)], "f1", f, s) for k, f, s in per_class_f1(y, pred, classes)]
        confusion = [(data.classes[int(t)], data.classes[int(p)], k) for t, p, k in confusion_counts(y, pred, classes)]
    # The ml.metrics protocol: value = mean, sd over n_boot resamples of 80% of test units.
    metrics = [(m, "none", boot[m][0], boot[m][1], n_boot) for m in point]
    if collapsed:
        log.warning("COLLAPSED run: %s", reason)
    return TextEvaluation(metrics, label_rows, confusion, predictions, collapsed, reason)
