"""Masked-language modelling of notes, the text tools: the windows a small BERT is pre-trained on and the model
the trainer runs (medtx.training.pretrain.pretrain_text_mlm trains it on the *training* notes only).

Notes are cut into non-overlapping windows of `max_len` tokens; 15% of tokens are masked (80% [MASK],
10% random, 10% kept — `transformers.DataCollatorForLanguageModeling`). The encoder is saved as a
`save_pretrained` folder that `medtx.models.bert_text.load_encoder("local", folder)` loads for fine-tuning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerBase

from medtx.models.base import ModelOutput
from medtx.models.layers import fused_attention_kernels
from medtx.text.chunking import chunk_ids

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


def load_pretrained_encoder(encoder_dir: Path) -> nn.Module:
    """The BertModel part of a pre-trained MLM folder (drops the MLM head)."""
    from medtx.models.bert_text import load_encoder

    return load_encoder("local", encoder_dir)


__all__ = ["MLMConfig", "MaskedLM", "mlm_windows", "load_pretrained_encoder"]
