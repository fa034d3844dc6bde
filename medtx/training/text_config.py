"""The types every text stage shares: a run's configuration (`TextConfig`, merged from the runner's, the
tokenizer's and each text model's settings) and a task's notes (`TextData`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pyarrow as pa
from pydantic import Field

from medtx.metrics.bootstrap import N_BOOT
from medtx.models import frames
from medtx.models.bounds import BatchSize, Count, Decay, Device, Epochs, LearningRate, Patience, Positive
from medtx.models.registry import merge_settings


@dataclass
class TextTrainerConfig:
    """The text runner's trainer settings (field types: bounds checked at config load, medtx.models.bounds)."""

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


@dataclass
class TokenizerConfig:
    """The WordPiece tokenizer a model trains on the training split only (bilstm, bert_scratch)."""

    vocab_size: Annotated[int, Field(ge=16, le=1_000_000)] = 8000


@dataclass
class TextReportConfig:
    """What a run reports besides its metrics: the showcase attention of the first n test notes (at most
    attention_max_tokens tokens per axis) and the bootstrap's resamples."""

    n_showcase: Count = 3
    attention_max_tokens: Positive = 64
    n_boot: Positive = N_BOOT


def _model_settings() -> tuple[type, ...]:
    """The settings classes every text model declares in its own file (ModelSpec.settings), each once."""
    from medtx.models.registry import specs

    out: list[type] = []
    for spec in (*specs("text"), *specs("text_baseline")):
        out += [cls for cls in spec.settings if cls not in out]
    return tuple(out)


# Everything a text run is configured by, as one flat dataclass whose fields are the YAML/CLI override keys:
# the trainer's, the tokenizer's, each text model's (declared in its file) and the report's settings.
# `overrides` replace any field; a model reads its own part (`ModelContext.config`). Defaults fit 2 CPU cores.
TextConfig = merge_settings("TextConfig", (TextTrainerConfig, TokenizerConfig, *_model_settings(), TextReportConfig),
                            module=__name__)


@dataclass
class TextData:
    """One task's notes: frame(sample_id, text, y, split, unit[, subject_id, hadm_id]) and its class names.

    The frame is an Arrow table (a polars DataFrame is converted through its `to_arrow()`): the text training path
    runs where polars is not installed (`python -m medtx.worker`)."""

    frame: pa.Table
    classes: list[str]
    binary: bool

    def __post_init__(self) -> None:
        self.frame = frames.arrow(self.frame)

    def split(self, name: str) -> pa.Table:
        """The rows of one split, in frame order."""
        return frames.where(self.frame, "split", name)
