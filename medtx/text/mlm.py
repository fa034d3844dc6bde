"""Pre-train a small BERT with masked-language modelling on the *training* notes only, through the shared trainer.

Notes are cut into non-overlapping windows of `max_len` tokens; 15% of tokens are masked (80% [MASK],
10% random, 10% kept — `transformers.DataCollatorForLanguageModeling`). Validation notes give the validation
MLM loss the trainer selects on (`monitor="loss"`); they are never trained on. The encoder is saved as a
`save_pretrained` folder that `medtx.models.bert_text.load_encoder("local", folder)` loads for fine-tuning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling, PreTrainedTokenizerBase

from medtx.models.base import ModelOutput
from medtx.models.layers import fused_attention_kernels
from medtx.text.chunking import chunk_ids
from medtx.training.trainer import FitResult, TrainConfig, fit

log = logging.getLogger("medtx.text")


@dataclass
class MLMConfig:
    mlm_probability: float = 0.15  # BERT's masking rate
    max_len: int = 128  # window length incl. [CLS]/[SEP]; CPU-friendly
    max_windows_per_note: int | None = None  # None = every window of every training note


class MaskedLM(nn.Module):
    """BertForMaskedLM behind the medtx model contract, so the shared trainer can run it."""

    def __init__(self, bert_config: BertConfig) -> None:
        super().__init__()
        self.mlm = BertForMaskedLM(bert_config)
        self.config = bert_config.to_dict()

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        with fused_attention_kernels(batch["input_ids"]):  # not cuDNN attention under bf16 (medtx.models.layers)
            return self._forward(batch, output_attentions)

    def _forward(self, batch: dict, output_attentions: bool) -> ModelOutput:
        labels = batch.get("labels")
        if labels is None or output_attentions:
            out = self.mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                           output_attentions=output_attentions)
            return ModelOutput(logits=out.logits, loss=out.loss)
        # BertForMaskedLM's loss, computed where it is defined: the vocabulary head runs on the ~15% masked
        # positions only (it ran on every position, and at 4,000 words it dominated pre-training). The loss is
        # the same mean cross-entropy over the masked positions; `logits` are those positions' scores.
        hidden = self.mlm.bert(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        masked = labels != -100
        logits = self.mlm.cls(hidden[masked])
        return ModelOutput(logits=logits, loss=nn.functional.cross_entropy(logits, labels[masked]))


def mlm_windows(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], cfg: MLMConfig
) -> list[dict[str, list[int]]]:
    """Non-overlapping `[CLS] ... [SEP]` windows over the notes (the items the MLM collate masks)."""
    all_ids = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    windows = []
    for ids in all_ids:
        for chunk in chunk_ids(
            ids, cls_id=tokenizer.cls_token_id, sep_id=tokenizer.sep_token_id,
            max_len=cfg.max_len, stride=0, max_chunks=cfg.max_windows_per_note,
        ):
            windows.append({"input_ids": chunk})
    return windows


def pretrain_mlm(
    bert_config: BertConfig,
    tokenizer: PreTrainedTokenizerBase,
    train_texts: Sequence[str],
    val_texts: Sequence[str],
    train_cfg: TrainConfig,
    out_dir: Path,
    mlm_cfg: MLMConfig | None = None,
) -> tuple[Path, FitResult]:
    """Train BertForMaskedLM on train_texts (val_texts only for the validation loss); returns the encoder
    folder (`out_dir/encoder`, with the tokenizer saved beside the weights) and the trainer's result."""
    mlm_cfg = mlm_cfg or MLMConfig()
    if train_cfg.monitor != "loss":
        raise ValueError("MLM pre-training selects on the validation MLM loss: use monitor='loss'")
    # Pad every batch to max_len: the trainer stacks labels across batches, so widths must agree.
    collate_mlm = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=mlm_cfg.mlm_probability, pad_to_multiple_of=mlm_cfg.max_len
    )
    model = MaskedLM(bert_config)
    result = fit(
        model,
        mlm_windows(tokenizer, train_texts, mlm_cfg),
        mlm_windows(tokenizer, val_texts, mlm_cfg),
        collate_mlm,
        train_cfg,
        Path(out_dir) / "mlm",
    )
    encoder_dir = Path(out_dir) / "encoder"
    model.mlm.save_pretrained(encoder_dir)
    tokenizer.save_pretrained(encoder_dir)
    first, best = result.history[0]["val_loss"], result.best_value
    log.info("MLM pre-training: val loss %.3f -> %.3f (best epoch %d)", first, best, result.best_epoch)
    return encoder_dir, result


def load_pretrained_encoder(encoder_dir: Path) -> nn.Module:
    """The BertModel part of a pre-trained MLM folder (drops the MLM head)."""
    from medtx.models.bert_text import load_encoder

    return load_encoder("local", encoder_dir)


__all__ = ["MLMConfig", "MaskedLM", "mlm_windows", "pretrain_mlm", "load_pretrained_encoder"]
