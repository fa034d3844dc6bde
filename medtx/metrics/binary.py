"""Binary metrics for 30-day readmission: AUROC, AUPRC and recall at precision 0.8 (RP80, ClinicalBERT).

AUPRC is scikit-learn's average precision (step-wise, no interpolation). RP80 = the highest recall reached
at any threshold whose precision is >= 0.8 (0 when no threshold reaches it), as in Huang et al.'s
ClinicalBERT readmission evaluation. Single-class inputs make AUROC/AUPRC undefined: NaN, never a crash.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

BINARY_METRICS = ("auroc", "auprc", "rp80")


def _check(y_true: np.ndarray, y_score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true, dtype=np.float64).reshape(-1)
    y_score = np.asarray(y_score, dtype=np.float64).reshape(-1)
    if y_true.shape != y_score.shape:
        raise ValueError(f"binary metrics: y_true has {y_true.size} values but y_score has {y_score.size}")
    if y_true.size == 0:
        raise ValueError("binary metrics: no samples")
    return y_true >= 0.5, y_score


def recall_at_precision(y_true: np.ndarray, y_score: np.ndarray, min_precision: float = 0.8) -> float:
    """Highest recall over thresholds with precision >= `min_precision` (RP80 for 0.8)."""
    y_true, y_score = _check(y_true, y_score)
    if not y_true.any():
        return float("nan")
    precision, recall, _ = precision_recall_curve(y_true, y_score)
    ok = precision >= min_precision
    return float(recall[ok].max()) if ok.any() else 0.0


def binary_metrics(y_true: np.ndarray, y_score: np.ndarray) -> dict[str, float]:
    """AUROC, AUPRC and RP80; NaN for metrics undefined on a single-class sample."""
    y_true, y_score = _check(y_true, y_score)
    if y_true.all() or not y_true.any():
        return {"auroc": float("nan"), "auprc": float("nan"), "rp80": recall_at_precision(y_true, y_score)}
    return {
        "auroc": float(roc_auc_score(y_true, y_score)),
        # scikit-learn's sum of (R_n - R_{n-1}) P_n overshoots 1 by a rounding step on some perfect rankings
        # (1.0000000000000002 at 9 of 11 events ranked first: a training split): the value is 1
        "auprc": min(1.0, float(average_precision_score(y_true, y_score))),
        "rp80": recall_at_precision(y_true, y_score),
    }
