"""The types every text stage shares: a run's configuration (`TextConfig`) and a task's notes (`TextData`)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from medtx.metrics.bootstrap import N_BOOT


@dataclass
class TextConfig:
    """Everything a text run needs; `overrides` (CLI/YAML) replace any field. Defaults fit 2 CPU cores."""

    # trainer
    epochs: int = 10
    batch_size: int = 16
    lr: float = 5e-4
    patience: int = 3
    weight_decay: float = 0.01
    device: str = "auto"
    num_threads: int | None = None  # torch CPU threads; 1 avoids thread oversubscription on a shared, loaded CPU
    # class weighting of the CE loss: "none", "sqrt" (1/sqrt(freq), mean 1) or "balanced" (1/freq)
    class_weighting: str = "sqrt"
    dedupe: bool = True  # one row per (text group, label): exact duplicate notes count once
    # WordPiece tokenizer (bilstm, bert_scratch), trained on the training split only
    vocab_size: int = 8000
    # BiLSTM: head truncation to the first bilstm_max_len tokens
    bilstm_max_len: int = 512
    embed_dim: int = 128
    hidden_dim: int = 128
    dropout: float = 0.3
    # BERT chunking: windows of max_len tokens overlapping by stride; first max_chunks windows per note
    max_len: int = 128
    stride: int = 32
    max_chunks: int | None = 4
    pooling: str = "mean"  # mean | max over chunk [CLS] vectors; clinicalbert for readmission_notes
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
    probe_init_epochs: int = 0
    # bert: a local checkpoint folder or a Hub id (online only)
    bert_path: str | None = None
    # bert_scratch: encoder size and MLM pre-training (once per data+config, cached, seed mlm_seed)
    hidden: int = 128
    layers: int = 2
    heads: int = 2
    mlm_epochs: int = 3
    mlm_lr: float = 1e-3
    mlm_batch_size: int = 32
    mlm_seed: int = 0
    mlm_max_windows: int | None = None  # first N windows of 128 tokens per training note (None = all)
    # tfidf_logreg
    tfidf_C: float = 10.0
    tfidf_max_features: int = 50_000
    # showcase attention: the first n test notes, at most attention_max_tokens tokens per axis
    n_showcase: int = 3
    attention_max_tokens: int = 64
    n_boot: int = N_BOOT


@dataclass
class TextData:
    """One task's notes: frame(sample_id, text, y, split, unit[, subject_id, hadm_id]) and its class names."""

    frame: pl.DataFrame
    classes: list[str]
    binary: bool

    def split(self, name: str) -> pl.DataFrame:
        return self.frame.filter(pl.col("split") == name)
