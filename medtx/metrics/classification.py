"""Multi-class metrics (accuracy, macro/weighted F1, per-class F1, confusion) via scikit-learn.

Every function takes label strings or ints plus the full class list, so classes absent from a test split
still count (as F1 0) in the macro average — the honest convention for MTSamples' 40 classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

MULTICLASS_METRICS = ("accuracy", "macro_f1", "weighted_f1")


def classification_metrics(y_true: Sequence, y_pred: Sequence, labels: Sequence) -> dict[str, float]:
    """accuracy, macro_f1 and weighted_f1 over the given class list (zero_division counts as 0)."""
    labels = list(labels)
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)),
        "weighted_f1": float(f1_score(y_true, y_pred, labels=labels, average="weighted", zero_division=0)),
    }


def per_class_f1(y_true: Sequence, y_pred: Sequence, labels: Sequence) -> list[tuple[str, float, int]]:
    """(class, F1, support in y_true) for every class of the list."""
    labels = list(labels)
    _, _, f1, support = precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
    return [(str(c), float(f), int(s)) for c, f, s in zip(labels, f1, support, strict=True)]


def confusion_counts(y_true: Sequence, y_pred: Sequence, labels: Sequence) -> list[tuple[str, str, int]]:
    """Non-zero cells of the confusion matrix as (true, predicted, n)."""
    labels = list(labels)
    matrix = confusion_matrix(y_true, y_pred, labels=labels)
    rows, cols = np.nonzero(matrix)
    return [(str(labels[i]), str(labels[j]), int(matrix[i, j])) for i, j in zip(rows, cols, strict=True)]


def bootstrap_classification(
    y_true: Sequence, y_pred: Sequence, labels: Sequence, *, n_boot: int = 10, frac: float = 0.8, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Mean and sd of each multi-class metric over `n_boot` resamples of `frac` of the test samples.

    Resampling is without replacement (a subsample, as the ml.metrics protocol says: 80% of test units);
    for text tasks the unit is the note.
    """
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    if len(y_true) == 0:
        raise ValueError("bootstrap_classification: empty test set")
    rng = np.random.default_rng(seed)
    size = max(1, int(round(frac * len(y_true))))
    draws = [
        classification_metrics(y_true[idx], y_pred[idx], labels)
        for idx in (rng.choice(len(y_true), size=size, replace=False) for _ in range(n_boot))
    ]
    return {m: (float(np.mean([d[m] for d in draws])), float(np.std([d[m] for d in draws]))) for m in MULTICLASS_METRICS}
