"""The types every text stage shares: a run's configuration (`TextConfig`) and a task's notes (`TextData`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import polars as pl
from pydantic import Field

from medtx.metrics.bootstrap import N_BOOT
from medtx.models.bounds import (BatchSize, Count, Decay, Device, DropoutRate, Epochs, Heads, Layers, LearningRate,
                                 Length, Patience, Positive, PositiveFloat, Width, FieldProblem, check_heads)


@dataclass
class TextConfig:
    """Everything a text run needs; `overrides` (CLI/YAML) replace any field. Defaults fit 2 CPU cores."""

    # trainer (field types: bounds checked at config load, medtx.models.bounds)
    epochs: Epochs = 10
    batch_size: BatchSize = 16
    lr: LearningRate = 5e-4
    patience: Patience = 3
    weight_decay: Decay = 0.01
    device: Device = "auto"
    num_threads: Positive | None = None  # torch CPU threads; 1 avoids thread oversubscription on a shared, loaded CPU
    # class weighting of the CE loss: "none", "sqrt" (1/sqrt(freq), mean 1) or "balanced" (1/freq)
    class_weighting: Literal["none", "sqrt", "balanced"] = "sqrt"
    dedupe: bool = True  # one row per (text group, label): exact duplicate notes count once
    # WordPiece tokenizer (bilstm, bert_scratch), trained on the training split only
    vocab_size: Annotated[int, Field(ge=16, le=1_000_000)] = 8000
    # BiLSTM: head truncation to the first bilstm_max_len tokens
    bilstm_max_len: Length = 512
    embed_dim: Width = 128
    hidden_dim: Width = 128
    dropout: DropoutRate = 0.3
    # BERT chunking: windows of max_len tokens overlapping by stride; first max_chunks windows per note
    max_len: Length = 128
    stride: Count = 32
    max_chunks: Positive | None = 4
    pooling: Literal["mean", "max", "clinicalbert"] = "mean"  # over chunk [CLS] vectors; clinicalbert: readmission_notes
    # pretrained encoders on CPU: freeze the encoder and train only the head on note vectors (mean-pooled
    # token states, averaged over the note's chunks) computed once and cached — a linear probe, not fine-tuning
    freeze_encoder: bool = False
    # partial fine-tuning on CPU: train only the top K encoder layers (+ head); the embeddings and lower layers
    # are frozen and their output is computed once per note and cached (exact, see medtx.models.bert_text).
    # None = every layer is trained (full fine-tuning, the GPU path)
    finetune_layers: int | None = None
    cache_dtype: str = "float16"  # storage of the cached lower-layer states (float32: bit-exact, twice the disk)
    chunk_vector: str = "cls"  # cls | mean (masked token mean, how sentence-transformers pool): see bert_text
    # LP-FT (Kumar et al. 2022): first train a linear probe on the initial note vectors for up to this many
    # epochs (lr 1e-3, batch 32, patience 10, validation-selected) and start fine-tuning from its head, so a
    # few fine-tuning epochs need not also learn a 40-class head from scratch. 0 = random head.
    probe_init_epochs: Count = 0
    # bert: a local checkpoint folder or a Hub id (online only)
    bert_path: str | None = None
    # bert_scratch: encoder size and MLM pre-training (once per data+config, cached, seed mlm_seed)
    hidden: Width = 128
    layers: Layers = 2
    heads: Heads = 2
    mlm_epochs: Count = 3
    mlm_lr: LearningRate = 1e-3
    mlm_batch_size: BatchSize = 32
    mlm_seed: Count = 0
    mlm_max_windows: Positive | None = None  # first N windows of 128 tokens per training note (None = all)
    # tfidf_logreg
    tfidf_C: PositiveFloat = 10.0
    tfidf_max_features: Positive = 50_000
    # showcase attention: the first n test notes, at most attention_max_tokens tokens per axis
    n_showcase: Count = 3
    attention_max_tokens: Positive = 64
    n_boot: Positive = N_BOOT

    def __post_init__(self) -> None:
        check_heads(self.hidden, self.heads, "hidden", "heads")
        if isinstance(self.stride, int) and isinstance(self.max_len, int) and self.stride >= self.max_len:
            raise FieldProblem(("stride", "max_len"), f"stride = {self.stride} is not below max_len = "
                                                      f"{self.max_len}; allowed stride: 0 to {self.max_len - 1}")


@dataclass
class TextData:
    """One task's notes: frame(sample_id, text, y, split, unit[, subject_id, hadm_id]) and its class names."""

    frame: pl.DataFrame
    classes: list[str]
    binary: bool

    def split(self, name: str) -> pl.DataFrame:
        return self.frame.filter(pl.col("split") == name)
