"""DDI rate: the share of drug pairs in predicted sets that are known to interact (SafeDrug's `ddi_rate_score`).

The interaction matrix is built on the model's own label vocabulary from `ref.ddi_atc3` (ATC-3 pairs), so
labels outside the DDI source simply have no interactions. The rate pools pairs over all visits:
interacting pairs / all unordered pairs of distinct drugs in each visit's set, summed over visits. It is
reported for the predicted sets next to the same rate on the true sets (the data's own DDI rate).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def ddi_matrix(pairs: Iterable[tuple[str, str]], labels: Sequence[str]) -> np.ndarray:
    """Symmetric boolean [L, L] matrix over `labels`; pairs naming a label outside the vocabulary are dropped."""
    index = {label: i for i, label in enumerate(labels)}
    matrix = np.zeros((len(labels), len(labels)), dtype=bool)
    for a, b in pairs:
        i, j = index.get(a), index.get(b)
        if i is not None and j is not None and i != j:
            matrix[i, j] = matrix[j, i] = True
    return matrix


def ddi_pair_counts(sets: np.ndarray, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-visit (interacting pairs, all pairs) for boolean label sets [N, L]; pool with sums."""
    sets = np.asarray(sets, dtype=bool)
    if sets.shape[1] != matrix.shape[0]:
        raise ValueError(f"DDI matrix has {matrix.shape[0]} labels but the sets have {sets.shape[1]}")
    x = sets.astype(np.float64)
    interacting = ((x @ matrix.astype(np.float64)) * x).sum(axis=1) / 2  # each unordered pair counted once
    n = x.sum(axis=1)
    return interacting, n * (n - 1) / 2


def ddi_rate(sets: np.ndarray, matrix: np.ndarray) -> float:
    """Pooled DDI rate of label sets: sum of interacting pairs / sum of all pairs (0 when no pairs at all)."""
    interacting, pairs = ddi_pair_counts(sets, matrix)
    total = pairs.sum()
    return float(interacting.sum() / total) if total > 0 else 0.0
