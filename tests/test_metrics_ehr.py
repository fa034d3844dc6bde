"""EHR metrics against scikit-learn and against cases computed by hand."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.metrics import (
    average_precision_score,
    f1_score,
    jaccard_score,
    precision_recall_curve,
    roc_auc_score,
)

from medtx.metrics.binary import binary_metrics, recall_at_precision
from medtx.metrics.bootstrap import bootstrap, patient_resamples
from medtx.metrics.ddi import ddi_matrix, ddi_rate
from medtx.metrics.multilabel import (
    average_precision_rows,
    f1_samples,
    jaccard_samples,
    patient_average,
    per_visit_metrics,
    pr_auc_samples,
    recall_at_k,
    roc_auc_samples,
    tune_threshold,
)


def random_multilabel(n=60, labels=12, seed=0, tied=False):
    rng = np.random.default_rng(seed)
    y = rng.random((n, labels)) < 0.3
    y[np.arange(n), rng.integers(0, labels, n)] = True  # every visit has >= 1 label, like our samples
    p = rng.random((n, labels))
    if tied:
        p = np.round(p * 4) / 4  # heavy ties, as in frequency/copy baselines
    return y, p


@pytest.mark.parametrize("tied", [False, True])
def test_multilabel_matches_sklearn(tied):
    y, p = random_multilabel(tied=tied)
    assert pr_auc_samples(y, p) == pytest.approx(average_precision_score(y, p, average="samples"), abs=1e-12)
    assert jaccard_samples(y, p >= 0.5) == pytest.approx(
        jaccard_score(y, p >= 0.5, average="samples", zero_division=0), abs=1e-12)
    assert f1_samples(y, p >= 0.5) == pytest.approx(
        f1_score(y, p >= 0.5, average="samples", zero_division=0), abs=1e-12)
    defined = (y.sum(1) > 0) & (y.sum(1) < y.shape[1])
    assert roc_auc_samples(y, p) == pytest.approx(
        roc_auc_score(y[defined], p[defined], average="samples"), abs=1e-12)


def test_visit_without_labels_scores_zero_like_sklearn():
    y = np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0]], dtype=bool)
    p = np.array([[0.9, 0.2, 0.4], [0.1, 0.6, 0.2], [0.3, 0.8, 0.1]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = average_precision_score(y, p, average="samples")
    assert pr_auc_samples(y, p) == pytest.approx(expected) == pytest.approx(2 / 3)


def test_hand_computed_visit():
    # Truth {A, C}; scores rank A (hit), B (miss), C (hit): AP = (1/1 + 2/3) / 2.
    y = np.array([[1, 0, 1, 0]], dtype=bool)
    p = np.array([[0.9, 0.6, 0.4, 0.1]])
    assert average_precision_rows(y, p)[0] == pytest.approx((1 + 2 / 3) / 2)
    rows = per_visit_metrics(y, p, threshold=0.5, ks=(1, 3))
    # Predicted {A, B}: intersection 1, union 3.
    assert rows["jaccard_samples"][0] == pytest.approx(1 / 3)
    assert rows["f1_samples"][0] == pytest.approx(2 * 1 / (2 + 2))
    assert rows["recall_at_1"][0] == 0.5 and rows["recall_at_3"][0] == 1.0
    assert rows["avg_pred_size"][0] == 2 and rows["avg_true_size"][0] == 2
    assert rows["roc_auc_samples"][0] == pytest.approx(3 / 4)  # pairs (A>B, A>D, C<B, C>D)
    assert recall_at_k(y, p, 1) == 0.5


def test_patient_average_is_safedrug_convention():
    values = np.array([1.0, 0.0, 0.0, 0.5])
    patients = np.array([7, 7, 7, 9])  # patient 7 mean 1/3, patient 9 mean 0.5
    assert patient_average(values, patients) == pytest.approx((1 / 3 + 0.5) / 2)
    assert np.mean(values) == pytest.approx(0.375)  # the visit average differs


def test_tune_threshold_picks_the_best_grid_point():
    y = np.array([[1, 0], [0, 1]], dtype=bool)
    p = np.array([[0.3, 0.1], [0.2, 0.35]])
    threshold, value = tune_threshold(y, p)
    assert value == 1.0 and 0.2 < threshold <= 0.3


def test_binary_metrics_match_sklearn_and_rp80_by_hand():
    rng = np.random.default_rng(1)
    y = rng.random(200) < 0.3
    s = y * 0.3 + rng.random(200)
    m = binary_metrics(y, s)
    assert m["auroc"] == pytest.approx(roc_auc_score(y, s))
    assert m["auprc"] == pytest.approx(average_precision_score(y, s))
    precision, recall, _ = precision_recall_curve(y, s)
    assert m["rp80"] == pytest.approx(recall[precision >= 0.8].max())
    # By hand: scores rank P P N P N; precision >= 0.8 holds at the top 2 (recall 2/3), not at top 4 (3/4).
    assert recall_at_precision([1, 1, 0, 1, 0], [0.9, 0.8, 0.7, 0.6, 0.5]) == pytest.approx(2 / 3)
    assert np.isnan(binary_metrics([0, 0], [0.1, 0.2])["auroc"])


def test_ddi_rate_by_hand():
    labels = ["A01", "B01", "C01", "D01"]
    matrix = ddi_matrix([("A01", "B01"), ("C01", "Z99")], labels)  # Z99 is outside the vocabulary
    assert matrix.sum() == 2 and matrix[0, 1] and matrix[1, 0]
    sets = np.array([[1, 1, 1, 0],   # pairs AB*, AC, BC -> 1 of 3
                     [1, 1, 0, 0],   # AB* -> 1 of 1
                     [0, 0, 0, 1]], dtype=bool)  # no pairs
    assert ddi_rate(sets, matrix) == pytest.approx(2 / 4)
    assert ddi_rate(np.zeros((2, 4), dtype=bool), matrix) == 0.0


def test_bootstrap_resamples_80_percent_of_patients():
    patients = np.repeat(np.arange(10), 3)  # 10 patients x 3 visits
    draws = patient_resamples(patients, n_boot=10, frac=0.8, seed=0)
    assert len(draws) == 10
    for idx in draws:
        chosen = np.unique(patients[idx])
        assert len(chosen) == 8 and len(idx) == 24  # all visits of 8 distinct patients
    assert any(not np.array_equal(draws[0], d) for d in draws[1:])
    values = patients.astype(float)
    out = bootstrap(lambda idx: {"mean": values[idx].mean()}, patients, seed=0)
    mean, sd = out["mean"]
    assert 3.0 < mean < 6.0 and sd > 0
    assert bootstrap(lambda idx: {"mean": values[idx].mean()}, patients, seed=0) == out  # deterministic
