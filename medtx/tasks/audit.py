"""The shortcut audit of the leakage gate, on a prepared matrix: could the features, alone or together, give a
binary label away far better than what is honestly knowable?

Pure numpy/scipy/scikit-learn; medtx.tasks.leakage prepares the matrix from the warehouse and records the verdict.

Per feature family (a feature column; a static token prefix, `static:AGE`) and on all features together, a
logistic regression is cross-validated over the given samples (train + validation of the task's split; folds by
patient, stratified), and the pooled out-of-fold AUROC is compared with a cut-off:
- with a reference (the synthetic generator's oracle, scored on the same samples): reference + REFERENCE_MARGIN
  (the oracle is the best any model can do with what is knowable, so an honest model beats it only by
  chance, and the lower bound below takes the chance out; the leaks of issue 43 sat 0.2-0.3 above it);
- without one (real data, the demo): FIXED_CUTOFF.
A family is flagged when the AUROC's lower 95% bound (Hanley & McNeil 1982) reaches the cut-off, so a few
positives that one code happens to separate do not flag a task, and a near-perfect proxy is flagged even on small
data (its bound is near 1). No minimum count: with fewer than two patients of a class there is nothing to
cross-validate, and the result says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

REFERENCE_MARGIN = 0.05
FIXED_CUTOFF = 0.90
MAX_CUTOFF = 0.98  # a reference near 1 still leaves room to flag
FOLDS = 5
Z95 = 1.959964


@dataclass(frozen=True)
class FamilyScore:
    family: str
    auroc: float  # pooled out-of-fold AUROC, max(AUROC, 1 - AUROC)
    lower: float  # its lower 95% bound
    flagged: bool


def auroc(y: np.ndarray, score: np.ndarray) -> float:
    """AUROC with ties counted half (Mann-Whitney)."""
    from scipy.stats import rankdata

    y = np.asarray(y, dtype=bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    ranks = rankdata(score)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def lower_bound(area: float, n_pos: int, n_neg: int) -> float:
    """The lower 95% bound of an AUROC (Hanley & McNeil's standard error)."""
    q1, q2 = area / (2 - area), 2 * area * area / (1 + area)
    var = (area * (1 - area) + (n_pos - 1) * (q1 - area * area) + (n_neg - 1) * (q2 - area * area)) / (n_pos * n_neg)
    return float(area - Z95 * np.sqrt(max(var, 0.0)))


def folds_of(y: np.ndarray, groups: np.ndarray, folds: int = FOLDS, seed: int = 0) -> list:
    """(train, test) index pairs, folds by group (patient): the groups with a positive sample and the others are
    each shuffled and dealt round the folds, so every fold holds about its share of positives."""
    rng = np.random.default_rng(seed)
    uniq, inverse = np.unique(groups, return_inverse=True)
    positive = np.zeros(len(uniq), dtype=bool)
    np.logical_or.at(positive, inverse, y)
    fold = np.empty(len(uniq), dtype=int)
    for mask in (positive, ~positive):
        members = rng.permutation(np.flatnonzero(mask))
        fold[members] = np.arange(len(members)) % folds
    of_row = fold[inverse]
    return [(np.flatnonzero(of_row != k), np.flatnonzero(of_row == k)) for k in range(folds)]


def cv_scores(x, y: np.ndarray, folds: Sequence) -> np.ndarray:
    """Out-of-fold probabilities of an L2 logistic regression over the given folds."""
    from sklearn.linear_model import LogisticRegression

    out = np.full(len(y), float(y.mean()))
    for train, test in folds:
        if y[train].min() == y[train].max() or x[train].nnz == 0:
            continue  # one class (or no token) in the fold's training part: the prior stays
        model = LogisticRegression(C=1.0, solver="liblinear", max_iter=200)
        model.fit(x[train], y[train])
        out[test] = model.predict_proba(x[test])[:, 1]
    return out


def audit(x, y: np.ndarray, groups: np.ndarray, families: Mapping[str, Sequence[int]],
          cutoff: float, seed: int = 0) -> tuple[tuple[FamilyScore, ...], str | None]:
    """Score every family (columns of the sparse matrix `x`) and `all` of them; (scores, why-not-run)."""
    y = np.asarray(y, dtype=bool)
    pos_groups = len(set(groups[y])) if y.any() else 0
    neg_groups = len(set(groups[~y])) if (~y).any() else 0
    if min(pos_groups, neg_groups) < 2:
        return (), (f"shortcut audit not run: train + validation hold {pos_groups} patient(s) with a positive and "
                    f"{neg_groups} with a negative sample, fewer than 2 to cross-validate")
    folds = folds_of(y, groups, min(FOLDS, pos_groups, neg_groups), seed)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    x = x.tocsc()  # column slices per family
    scores = []
    for family, cols in [*families.items(), ("all", range(x.shape[1]))]:
        area = auroc(y, cv_scores(x[:, list(cols)].tocsr(), y, folds))
        area = max(area, 1.0 - area)
        low = lower_bound(area, n_pos, n_neg)
        scores.append(FamilyScore(family, area, low, low >= cutoff))
    return tuple(scores), None


def cutoff_for(reference: float | None) -> tuple[float, str]:
    """The cut-off and how it was set, in words."""
    if reference is None:
        return FIXED_CUTOFF, f"fixed {FIXED_CUTOFF:.2f} (no reference)"
    cut = min(MAX_CUTOFF, max(reference, 0.5) + REFERENCE_MARGIN)
    return cut, f"{cut:.3f} = oracle {reference:.3f} + {REFERENCE_MARGIN:.2f}"
