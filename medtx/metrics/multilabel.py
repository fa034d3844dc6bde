"""Multi-label metrics for drug recommendation and next-visit diagnosis, per visit then averaged.

Every metric is first computed per visit (one row of `y_true` / `y_prob`), then averaged two ways:
- averaging='visit'   — mean over visits: scikit-learn `average="samples"`, the PyHealth convention;
- averaging='patient' — mean over each patient's visits, then over patients: the SafeDrug convention.
Per-visit values make the patient bootstrap cheap (average the stored rows of the resampled patients).

Conventions (all match scikit-learn's defaults, checked in tests/test_metrics_multilabel.py):
- `pr_auc_samples`: average precision per visit, tie-aware like `average_precision_score`; a visit with no
  true label scores 0 (scikit-learn's behaviour; never happens in our tasks, which drop label-less visits).
- `roc_auc_samples`: ROC AUC per visit (ties count 1/2); visits with only one class are skipped
  (scikit-learn refuses them), so the mean is over visits where it is defined.
- `jaccard_samples`, `f1_samples`, `precision_samples`, `recall_samples` on the thresholded set
  `y_prob >= threshold`; an empty union / empty denominator scores 0 (`zero_division=0`).
- `recall_at_k`: share of the visit's true labels among its k highest-scored labels.
- `avg_pred_size` / `avg_true_size`: mean predicted vs true set size.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata

SET_METRICS = ("jaccard_samples", "f1_samples", "precision_samples", "recall_samples")


def _check(y_true: np.ndarray, y_score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true, dtype=bool)
    y_score = np.asarray(y_score, dtype=np.float64)
    if y_true.shape != y_score.shape or y_true.ndim != 2:
        raise ValueError(f"multi-label metrics need 2-D y_true and y_score of one shape, got "
                         f"{y_true.shape} and {y_score.shape}")
    if y_true.shape[0] == 0:
        raise ValueError("multi-label metrics: no samples")
    return y_true, y_score


def average_precision_rows(y_true: np.ndarray, y_score: np.ndarray) -> np.ndarray:
    """Per-row average precision (step-wise, no interpolation), tie-aware exactly like scikit-learn.

    AP = sum over positives of precision at the *end* of the positive's tie group / number of positives,
    which equals scikit-learn's sum over thresholds of (R_n - R_{n-1}) P_n. Vectorised over rows.
    """
    y_true, y_score = _check(y_true, y_score)
    n_rows, n_labels = y_true.shape
    order = np.argsort(-y_score, axis=1, kind="stable")
    scores = np.take_along_axis(y_score, order, axis=1)
    hits = np.take_along_axis(y_true, order, axis=1)
    tp = np.cumsum(hits, axis=1)
    idx = np.arange(n_labels)
    # Position i ends its tie group when the next score differs (or it is the last position).
    is_end = np.ones_like(hits)
    is_end[:, :-1] = scores[:, :-1] != scores[:, 1:]
    end_at = np.where(is_end, idx, n_labels)
    group_end = np.minimum.accumulate(end_at[:, ::-1], axis=1)[:, ::-1]  # first group end at or after i
    precision_at_end = np.take_along_axis(tp, group_end, axis=1) / (group_end + 1)
    n_pos = y_true.sum(axis=1)
    ap = (hits * precision_at_end).sum(axis=1)
    return np.divide(ap, n_pos, out=np.zeros(n_rows), where=n_pos > 0)


def roc_auc_rows(y_true: np.ndarray, y_score: np.ndarray) -> np.ndarray:
    """Per-row ROC AUC via the Mann-Whitney rank sum (average ranks for ties); NaN where undefined."""
    y_true, y_score = _check(y_true, y_score)
    ranks = rankdata(y_score, axis=1)
    n_pos = y_true.sum(axis=1).astype(np.float64)
    n_neg = y_true.shape[1] - n_pos
    u = (ranks * y_true).sum(axis=1) - n_pos * (n_pos + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = u / (n_pos * n_neg)
    auc[(n_pos == 0) | (n_neg == 0)] = np.nan
    return auc


def set_metric_rows(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row Jaccard, F1, precision, recall of predicted sets (boolean matrices), zero_division=0."""
    y_true, y_pred = _check(y_true, y_pred)
    y_pred = y_pred.astype(bool)
    inter = (y_true & y_pred).sum(axis=1).astype(np.float64)
    n_true, n_pred = y_true.sum(axis=1), y_pred.sum(axis=1)
    union = n_true + n_pred - inter

    def ratio(num, den):
        return np.divide(num, den, out=np.zeros_like(num), where=den > 0)

    return {
        "jaccard_samples": ratio(inter, union),
        "f1_samples": ratio(2 * inter, (n_true + n_pred).astype(np.float64)),
        "precision_samples": ratio(inter, n_pred.astype(np.float64)),
        "recall_samples": ratio(inter, n_true.astype(np.float64)),
    }


def recall_at_k_rows(y_true: np.ndarray, y_score: np.ndarray, k: int) -> np.ndarray:
    """Per-row share of the true labels found among the k top-scored labels (0 for rows without labels)."""
    y_true, y_score = _check(y_true, y_score)
    k = min(k, y_true.shape[1])
    top = np.argpartition(-y_score, k - 1, axis=1)[:, :k]
    found = np.take_along_axis(y_true, top, axis=1).sum(axis=1).astype(np.float64)
    n_true = y_true.sum(axis=1).astype(np.float64)
    return np.divide(found, n_true, out=np.zeros_like(found), where=n_true > 0)


def per_visit_metrics(
    y_true: np.ndarray, y_prob: np.ndarray, threshold: float = 0.5, ks: Sequence[int] = ()
) -> dict[str, np.ndarray]:
    """Every per-visit value used by the multi-label reports, one array of length n_visits each."""
    y_true, y_prob = _check(y_true, y_prob)
    y_pred = y_prob >= threshold
    rows = {
        "pr_auc_samples": average_precision_rows(y_true, y_prob),
        "roc_auc_samples": roc_auc_rows(y_true, y_prob),
        **set_metric_rows(y_true, y_pred),
        "avg_pred_size": y_pred.sum(axis=1).astype(np.float64),
        "avg_true_size": y_true.sum(axis=1).astype(np.float64),
    }
    for k in ks:
        rows[f"recall_at_{k}"] = recall_at_k_rows(y_true, y_prob, k)
    return rows


def visit_average(values: np.ndarray) -> float:
    """Mean over visits, skipping NaN (undefined) rows — scikit-learn's samples average."""
    values = np.asarray(values, dtype=np.float64)
    return float(np.nanmean(values)) if np.isfinite(values).any() else float("nan")


def patient_average(values: np.ndarray, patients: np.ndarray) -> float:
    """Mean within each patient, then over patients (SafeDrug); NaN rows are skipped in both steps."""
    values = np.asarray(values, dtype=np.float64)
    patients = np.asarray(patients)
    ok = np.isfinite(values)
    if not ok.any():
        return float("nan")
    _, inverse = np.unique(patients[ok], return_inverse=True)
    sums = np.bincount(inverse, weights=values[ok])
    counts = np.bincount(inverse)
    return float(np.mean(sums / counts))


def pr_auc_samples(y_true: np.ndarray, y_prob: np.ndarray) -> float:
    """Visit-averaged average precision (= sklearn `average_precision_score(average="samples")`)."""
    return visit_average(average_precision_rows(y_true, y_prob))


def roc_auc_samples(y_true: np.ndarray, y_prob: np.ndarray) -> float:
    """Visit-averaged ROC AUC over visits where it is defined (= sklearn on those visits)."""
    return visit_average(roc_auc_rows(y_true, y_prob))


def jaccard_samples(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Visit-averaged Jaccard of predicted sets (= sklearn `jaccard_score(average="samples", zero_division=0)`)."""
    return visit_average(set_metric_rows(y_true, y_pred)["jaccard_samples"])


def f1_samples(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Visit-averaged F1 of predicted sets (= sklearn `f1_score(average="samples", zero_division=0)`)."""
    return visit_average(set_metric_rows(y_true, y_pred)["f1_samples"])


def recall_at_k(y_true: np.ndarray, y_prob: np.ndarray, k: int) -> float:
    """Visit-averaged recall@k."""
    return visit_average(recall_at_k_rows(y_true, y_prob, k))


def tune_threshold(
    y_true: np.ndarray, y_prob: np.ndarray, metric: str = "jaccard_samples",
    grid: Sequence[float] = tuple(np.round(np.arange(0.05, 0.951, 0.05), 2)),
) -> tuple[float, float]:
    """The grid threshold maximising the visit-averaged set `metric` (use on VALIDATION only) and its value.

    Ties go to the threshold closest to 0.5, so a flat curve keeps the conventional default.
    """
    if metric not in SET_METRICS:
        raise ValueError(f"tune_threshold: metric must be one of {SET_METRICS}, got {metric!r}")
    y_true, y_prob = _check(y_true, y_prob)
    scored = [(visit_average(set_metric_rows(y_true, y_prob >= t)[metric]), -abs(t - 0.5), t) for t in grid]
    value, _, best = max(scored)
    return float(best), float(value)
