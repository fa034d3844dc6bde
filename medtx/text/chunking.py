"""Split long notes into overlapping windows a BERT can read (ClinicalBERT-style chunking).

A note's token ids (without specials) are cut into windows of `max_len - 2` content tokens, each wrapped as
`[CLS] ... [SEP]`; consecutive windows overlap by `stride` tokens so no sentence is only ever seen cut in
half. Together the windows cover every token of the note (tested). `max_chunks` optionally keeps the first
N windows to bound CPU cost — then coverage is partial by choice, and the config records it.
"""

from __future__ import annotations

from collections.abc import Sequence


def chunk_spans(n_tokens: int, *, max_len: int = 512, stride: int = 64) -> list[tuple[int, int]]:
    """[start, end) content spans of the windows for a note of n_tokens (at least one, even if empty)."""
    window = max_len - 2  # room for [CLS] and [SEP]
    if window <= 0:
        raise ValueError(f"chunk max_len must exceed 2, got {max_len}")
    if not 0 <= stride < window:
        raise ValueError(f"chunk stride must be in [0, {window}), got {stride}")
    step = window - stride
    spans = [(0, min(window, n_tokens))]
    while spans[-1][1] < n_tokens:
        start = spans[-1][0] + step
        spans.append((start, min(start + window, n_tokens)))
    return spans


def chunk_ids(
    ids: Sequence[int],
    *,
    cls_id: int,
    sep_id: int,
    max_len: int = 512,
    stride: int = 64,
    max_chunks: int | None = None,
) -> list[list[int]]:
    """Windows `[CLS] ids[a:b] [SEP]` over the whole note (or its first `max_chunks` windows)."""
    spans = chunk_spans(len(ids), max_len=max_len, stride=stride)
    if max_chunks is not None:
        spans = spans[:max_chunks]
    return [[cls_id, *ids[a:b], sep_id] for a, b in spans]
