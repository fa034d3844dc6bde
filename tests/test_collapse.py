"""The collapse guard fires on (nearly) constant predictors and stays quiet on real ones."""

from __future__ import annotations

import numpy as np
import pytest

from medtx.metrics.classification import classification_metrics, confusion_counts, per_class_f1
from medtx.metrics.collapse import is_collapsed


def test_constant_class_predictor_is_collapsed():
    collapsed, reason = is_collapsed(["Surgery"] * 100)
    assert collapsed
    assert "100.0%" in reason and "'Surgery'" in reason


def test_nearly_constant_at_the_limit_and_below():
    assert is_collapsed([0] * 95 + [1] * 5)[0]  # exactly 95%: collapsed
    assert not is_collapsed([0] * 94 + [1] * 6)[0]


def test_varied_predictions_are_not_collapsed():
    collapsed, reason = is_collapsed(np.arange(50) % 7)
    assert not collapsed and reason.startswith("not collapsed")


def test_multiclass_probabilities_use_argmax():
    probs = np.tile([0.1, 0.7, 0.2], (40, 1)) + np.random.default_rng(0).normal(0, 0.01, (40, 3))
    assert is_collapsed(probs)[0]
    assert not is_collapsed(np.eye(3)[np.arange(40) % 3])[0]


def test_multilabel_identical_sets():
    same = np.tile([0.9, 0.1, 0.8], (30, 1))
    collapsed, reason = is_collapsed(same, multilabel=True)
    assert collapsed and "size 2" in reason
    varied = np.random.default_rng(1).random((30, 6))
    assert not is_collapsed(varied, multilabel=True)[0]


def test_binary_constant_scores():
    assert is_collapsed(np.full(60, 0.2312))[0]
    assert not is_collapsed(np.linspace(0, 1, 60))[0]


def test_empty_and_bad_shapes():
    assert is_collapsed([]) == (False, "no predictions to judge")
    with pytest.raises(ValueError, match="neither 1-D nor 2-D"):
        is_collapsed(np.zeros((2, 2, 2)))


def test_majority_predictor_scores_like_the_pyhealth_book_run():
    """A majority predictor on a 40-class task: accuracy = majority share, macro-F1 tiny — and flagged."""
    labels = [f"c{i}" for i in range(40)]
    y_true = ["c0"] * 25 + [labels[1 + i % 39] for i in range(75)]
    y_pred = ["c0"] * 100
    m = classification_metrics(y_true, y_pred, labels)
    assert m["accuracy"] == pytest.approx(0.25)
    assert m["macro_f1"] == pytest.approx((2 * 0.25 / 1.25) / 40)  # F1 of c0 = 0.4, others 0
    assert is_collapsed(y_pred)[0]
    f1 = dict((c, f) for c, f, _ in per_class_f1(y_true, y_pred, labels))
    assert f1["c0"] == pytest.approx(0.4) and f1["c5"] == 0.0
    assert ("c1", "c0", 2) in confusion_counts(y_true, y_pred, labels)
