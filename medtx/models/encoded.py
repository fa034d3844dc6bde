"""Samples encoded to tensors once, and batches cut from them (instead of collating Python lists per batch).

`EncodedSet(items, collate)` calls the codec's own `collate` once over every item (tensors padded to the
widest row) and learns each row's own width, so that `batch(indices)` returns exactly what
`collate([items[i] for i in indices])` returns -- the same tensors, each trimmed to the batch's widest row --
by indexing instead of re-padding. It works for any collate whose output is per-row independent (every codec
of medtx.models.ehr_data); a collate that draws random numbers (BEHRT's MLM masking) must not be cached:
its random part goes in `transform`, which `batch` applies to every batch it cuts (fresh masks per batch).

A row's width is, by definition, the width `collate([item])` gives it. A collate bound to a codec with a
`row_widths(batch) -> {key: [B] widths}` method (every codec of medtx.models.ehr_data) has them read off the padded
batch (its masks) in one vectorised pass; any other collate is called once per item, which was most of a run's
setup before its first epoch (0.7 of 1.9 s on synth_10000's drug_rec). Tests hold the two paths equal per codec.

`length_buckets(...)`: shuffled batches of similar lengths (sort within shuffled pools, shuffle the batch
order), so padding does not dominate; deterministic under the generator, every index exactly once.
`bucket_pool(...)`: how many batches a pool holds, so that an epoch keeps at least `MIN_POOLS` pools.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

Collate = Callable[[list[Any]], dict[str, Any]]


def _row_value(value: Any, key: str) -> Any:
    """The one row of a single-item batch's non-tensor value (a list, or a dict of lists)."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    if isinstance(value, dict):
        return {k: _row_value(v, f"{key}.{k}") for k, v in value.items()}
    raise TypeError(f"EncodedSet: cannot split batch key {key!r} ({type(value).__name__}) into rows")


def _rows_of(rows: list[Any], index: list[int]) -> Any:
    """Gather non-tensor rows back into the collate's shape (list, or dict of lists)."""
    if rows and isinstance(rows[0], dict):
        return {k: [rows[i][k] for i in index] for k in rows[0]}
    return [rows[i] for i in index]


def _split_rows(value: Any, key: str, n: int) -> list[Any]:
    """A batch's non-tensor value (a list of n rows, or a dict of such lists) -> its n rows."""
    if isinstance(value, list) and len(value) == n:
        return value
    if isinstance(value, dict):
        parts = {k: _split_rows(v, f"{key}.{k}", n) for k, v in value.items()}
        return [{k: rows[i] for k, rows in parts.items()} for i in range(n)]
    raise TypeError(f"EncodedSet: cannot split batch key {key!r} ({type(value).__name__}) into {n} rows")


def _checked_widths(widths: dict[str, Tensor], tensors: dict[str, Tensor], collate: Collate) -> dict[str, Tensor]:
    """A codec's `row_widths`, held to what the item-by-item path would give: one width per row of every tensor
    with a sequence dimension, each at least 1 and the widest equal to the batch's width."""
    owner = type(getattr(collate, "__self__", collate)).__name__
    want = {k for k, v in tensors.items() if v.dim() >= 2}
    if set(widths) != want:
        raise ValueError(f"{owner}.row_widths gives widths for {sorted(widths)}; the batch's sequence tensors are "
                         f"{sorted(want)}")
    out = {}
    for key, w in widths.items():
        w = torch.as_tensor(w, dtype=torch.long)
        value = tensors[key]
        if w.shape != (value.shape[0],) or int(w.min()) < 1 or int(w.max()) != value.shape[1]:
            raise ValueError(f"{owner}.row_widths[{key!r}] does not fit the batch's {tuple(value.shape)} tensor")
        out[key] = w
    return out


class EncodedSet:
    """Items collated once; `batch(indices)` == `transform(collate([items[i] for i in indices]))`."""

    def __init__(self, items: Sequence[Any], collate: Collate,
                 transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        if len(items) == 0:
            raise ValueError("EncodedSet: no items")
        items = list(items)
        self._n = len(items)
        self.transform = transform
        full = collate(items)
        self.tensors: dict[str, Tensor] = {k: v for k, v in full.items() if isinstance(v, Tensor)}
        row_widths = getattr(getattr(collate, "__self__", None), "row_widths", None)
        if row_widths is None:  # the definition: each item collated on its own
            singles = [collate([item]) for item in items]
            # per-row width of every tensor with a sequence dimension
            self.widths: dict[str, Tensor] = {
                key: torch.tensor([s[key].shape[1] for s in singles], dtype=torch.long)
                for key, value in self.tensors.items() if value.dim() >= 2}
            self.rows: dict[str, list[Any]] = {key: [_row_value(s[key], key) for s in singles]
                                               for key, value in full.items() if not isinstance(value, Tensor)}
        else:  # the codec reads the widths off the padded batch: no collate per item (issue #18)
            self.widths = _checked_widths(row_widths(full), self.tensors, collate)
            self.rows = {key: _split_rows(value, key, self._n)
                         for key, value in full.items() if not isinstance(value, Tensor)}
        widths = list(self.widths.values())
        self.lengths = torch.stack(widths).sum(0) if widths else torch.zeros(self._n, dtype=torch.long)

    def __len__(self) -> int:
        return self._n

    def with_transform(self, transform: Callable[[dict[str, Any]], dict[str, Any]] | None) -> EncodedSet:
        """The same encoded items (shared, not copied) with another `transform`."""
        view = copy.copy(self)
        view.transform = transform
        return view

    def batch(self, indices: Sequence[int] | Tensor) -> dict[str, Any]:
        index = torch.as_tensor(indices, dtype=torch.long)
        out: dict[str, Any] = {}
        for key, value in self.tensors.items():
            rows = value.index_select(0, index)
            if key in self.widths:
                rows = rows[:, : int(self.widths[key].index_select(0, index).max())]
            out[key] = rows
        positions = index.tolist()
        for key, rows in self.rows.items():
            out[key] = _rows_of(rows, positions)
        return out if self.transform is None else self.transform(out)


def sequential_batches(n: int, batch_size: int) -> list[Tensor]:
    """0..n-1 in order, cut into batches (evaluation)."""
    return list(torch.arange(n).split(batch_size))


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> list[Tensor]:
    """The same batches as a DataLoader(shuffle=True) with this generator: its iterator first draws a base
    seed from the generator, then RandomSampler draws the permutation."""
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    return list(torch.randperm(n, generator=generator).split(batch_size))


MIN_POOLS = 8  # length buckets sort within at least this many pools per epoch


def bucket_pool(n_items: int, batch_size: int, pool_batches: int, min_pools: int = MIN_POOLS) -> int:
    """Batches per sorting pool for `length_buckets`: at most `pool_batches`, and small enough that an epoch has at
    least `min_pools` pools; 0 (plain shuffle) when that leaves fewer than 2 batches per pool.

    A pool as large as the training set sorts every batch of the epoch by length, with only the batch order
    shuffled: under the default pipeline's settings (synth_2000, 449 samples, batch 64) that lowered test PR-AUC
    beyond seed noise, while pools of 512 out of 2,357 samples did not change validation (issue #18,
    benchmarks/README.md round 5). So small training sets keep the plain shuffle, bit for bit.
    """
    n_batches = -(-n_items // batch_size)
    pool = min(pool_batches, n_batches // min_pools)
    return pool if pool >= 2 else 0


def length_buckets(lengths: Tensor, batch_size: int, generator: torch.Generator, pool_batches: int = 16
                   ) -> list[Tensor]:
    """Shuffle, sort each pool of `pool_batches` batches by length, cut into batches, shuffle the batches.

    Every index appears exactly once; the same generator state gives the same batches. Ties keep the
    shuffled order (stable sort), so equal-length samples still mix across epochs.
    """
    order = torch.randperm(len(lengths), generator=generator)
    batches: list[Tensor] = []
    pool = batch_size * max(1, pool_batches)
    for chunk in order.split(pool):
        ranked = chunk[torch.argsort(lengths.index_select(0, chunk), stable=True)]
        batches.extend(ranked.split(batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
