"""Notes as model inputs: tokenised items and the collate functions of the BiLSTM and the chunked BERT.

An item is a dict `{"sample_id": str, "ids": list[int], "label": int}` — content token ids without special
tokens, tokenised once up front (fast tokenizers batch the whole corpus), so every epoch only pads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from medtx.text.chunking import chunk_ids


def encode_items(
    tokenizer: PreTrainedTokenizerBase, sample_ids: Sequence[str], texts: Sequence[str], labels: Sequence[int]
) -> list[dict]:
    """Tokenise every note once (no specials, no truncation: chunking/truncation happen in collate)."""
    ids = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return [
        {"sample_id": str(s), "ids": list(i), "label": int(y)}
        for s, i, y in zip(sample_ids, ids, labels, strict=True)
    ]


def _labels(items: Sequence[dict], binary: bool) -> torch.Tensor:
    return torch.tensor([it["label"] for it in items], dtype=torch.float if binary else torch.long)


@dataclass
class SequenceCollate:
    """BiLSTM batches: the first `max_len` tokens of each note (head truncation), padded with 0."""

    max_len: int = 512
    binary: bool = False
    tokenizer: PreTrainedTokenizerBase | None = None  # set to add "tokens" (attention labels)

    def __call__(self, items: list[dict]) -> dict:
        seqs = [it["ids"][: self.max_len] for it in items]
        width = max(1, max(len(s) for s in seqs))
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        batch = {
            "input_ids": ids,
            "lengths": torch.tensor([len(s) for s in seqs]),
            "labels": _labels(items, self.binary),
            "sample_id": [it["sample_id"] for it in items],
        }
        if self.tokenizer is not None:
            batch["tokens"] = [self.tokenizer.convert_ids_to_tokens(s) for s in seqs]
        return batch


@dataclass
class ChunkCollate:
    """Chunked BERT batches: every note cut into `[CLS] ... [SEP]` windows (see medtx.text.chunking)."""

    cls_id: int
    sep_id: int
    pad_id: int = 0
    max_len: int = 128
    stride: int = 32
    max_chunks: int | None = 4  # first N windows per note, to bound CPU cost; None = the whole note
    binary: bool = False
    tokenizer: PreTrainedTokenizerBase | None = None  # set to add "tokens" of each note's first chunk

    def __call__(self, items: list[dict]) -> dict:
        chunks, owner = [], []
        for note, it in enumerate(items):
            windows = chunk_ids(
                it["ids"], cls_id=self.cls_id, sep_id=self.sep_id,
                max_len=self.max_len, stride=self.stride, max_chunks=self.max_chunks,
            )
            chunks.extend(windows)
            owner.extend([note] * len(windows))
        width = max(len(c) for c in chunks)
        ids = torch.full((len(chunks), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(chunks), width, dtype=torch.long)
        for row, chunk in enumerate(chunks):
            ids[row, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
            mask[row, : len(chunk)] = 1
        batch = {
            "input_ids": ids,
            "attention_mask": mask,
            "chunk_note": torch.tensor(owner, dtype=torch.long),
            "labels": _labels(items, self.binary),
            "sample_id": [it["sample_id"] for it in items],
        }
        if self.tokenizer is not None:
            firsts = [chunks[owner.index(n)] for n in range(len(items))]
            batch["tokens"] = [self.tokenizer.convert_ids_to_tokens(c) for c in firsts]
        return batch


def chunk_collate_for(tokenizer: PreTrainedTokenizerBase, *, with_tokens: bool = False, **kwargs) -> ChunkCollate:
    """A ChunkCollate with the tokenizer's own [CLS]/[SEP]/[PAD] ids (and token strings when with_tokens)."""
    return ChunkCollate(
        cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id, pad_id=tokenizer.pad_token_id or 0,
        tokenizer=tokenizer if with_tokens else None, **kwargs,
    )


@dataclass
class VectorCollate:
    """Batches of fixed note vectors (items {sample_id, x, label}) for `NoteVectorClassifier`."""

    binary: bool = False

    def __call__(self, items: list[dict]) -> dict:
        return {
            "features": torch.stack([torch.as_tensor(it["x"], dtype=torch.float) for it in items]),
            "labels": _labels(items, self.binary),
            "sample_id": [it["sample_id"] for it in items],
        }


@dataclass
class CachedStateCollate:
    """Batches of cached lower-layer states (items {sample_id, hidden [c, L, H], mask [c, L], label}) for the
    top layers of a partly fine-tuned BERT: chunks concatenated and cut to the longest real chunk of the batch,
    the width `ChunkCollate` would pad the same notes to, so both paths see identical inputs."""

    binary: bool = False

    def __call__(self, items: list[dict]) -> dict:
        mask = torch.cat([it["mask"] for it in items])
        width = max(1, int(mask.sum(1).max()))
        return {
            "hidden": torch.cat([it["hidden"] for it in items])[:, :width].float(),
            "attention_mask": mask[:, :width].long(),
            "chunk_note": torch.cat([torch.full((len(it["mask"]),), n, dtype=torch.long) for n, it in enumerate(items)]),
            "labels": _labels(items, self.binary),
            "sample_id": [it["sample_id"] for it in items],
        }
