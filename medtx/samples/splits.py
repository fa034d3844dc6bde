"""Deterministic train/val/test splits by unit (patient, or MTSamples text group), stored in `samples.splits`.

The unit ids are sorted, shuffled by a numpy Generator seeded with `seed`, and cut at the cumulative
fractions, so the same ids and seed always give the same split (and the stored table lets a rerun check it).
With at least 3 units, val and test each get at least one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import duckdb
import numpy as np

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)
DEFAULT_SEED = 42


def split_sizes(n: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> tuple[int, int, int]:
    """How many units go to train, val and test (rounded half up; val/test >= 1 when n >= 3)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
        raise ValueError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    n_val = int(n * fractions[1] + 0.5)
    n_test = int(n * fractions[2] + 0.5)
    if n >= 3:
        n_val, n_test = max(n_val, 1 if fractions[1] > 0 else 0), max(n_test, 1 if fractions[2] > 0 else 0)
    n_val = min(n_val, n)
    n_test = min(n_test, n - n_val)
    return n - n_val - n_test, n_val, n_test


def assign_splits(units: Iterable[int], seed: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[int, str]:
    """unit id -> 'train' | 'val' | 'test'."""
    ordered = sorted(set(units))
    n_train, n_val, _ = split_sizes(len(ordered), fractions)
    perm = np.random.default_rng(seed).permutation(len(ordered))
    out = {}
    for rank, pos in enumerate(perm):
        out[ordered[pos]] = "train" if rank < n_train else "val" if rank < n_train + n_val else "test"
    return out


def assign_folds(units: Iterable[int], seed: int, k: int) -> dict[int, int]:
    """unit id -> fold in [0, k), balanced, deterministic from the seed."""
    ordered = sorted(set(units))
    perm = np.random.default_rng(seed).permutation(len(ordered))
    return {ordered[pos]: rank % k for rank, pos in enumerate(perm)}


def write_splits(
    con: duckdb.DuckDBPyConnection, dataset: str, task: str, units: Iterable[int], seed: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> dict[int, str]:
    """Replace the (dataset, task) rows of `samples.splits`; call inside the builder's transaction.

    A dataset imported from MEDS keeps the splits it came with (`raw.meds_splits`: the task's own rows, else
    the dataset-wide ones); only units those do not cover are drawn from the seed."""
    assignment = assign_splits(units, seed, fractions)
    assignment.update(given_splits(con, dataset, task, assignment))
    con.execute("DELETE FROM samples.splits WHERE dataset = $d AND task = $t", {"d": dataset, "t": task})
    if assignment:
        con.execute(
            "INSERT INTO samples.splits SELECT $d, $t, unnest($ids), unnest($splits), $seed",
            {"d": dataset, "t": task, "ids": list(assignment), "splits": list(assignment.values()), "seed": seed},
        )
    return assignment


def given_splits(con: duckdb.DuckDBPyConnection, dataset: str, task: str, units: Iterable[int]) -> dict[int, str]:
    """unit id -> split for the units `raw.meds_splits` assigns (task rows win over dataset-wide rows)."""
    rows = con.execute(
        """SELECT subject_id, arg_min(split, task IS NULL) FROM raw.meds_splits
           WHERE dataset = $d AND (task = $t OR task IS NULL) AND subject_id IN (SELECT unnest($ids))
           GROUP BY subject_id""",
        {"d": dataset, "t": task, "ids": list(units)},
    ).fetchall()
    return dict(rows)


def split_counts(assignment: dict[int, str]) -> dict[str, int]:
    """Units per split, for the task summary."""
    return {f"{s}_units": sum(1 for v in assignment.values() if v == s) for s in SPLITS}
