"""Masked-LM pre-training through the shared trainer: an EHR model's encoder (BEHRT) on training patients
(`pretrain_mlm`), and a small BERT on training notes (`pretrain_text_mlm`, masking by medtx.text.mlm).

The model offers what to pre-train (`medtx.models.registry.MaskedLM`: the MLM head over its encoder, its
collate and masking settings); this module masks and trains. It lives in the training layer because it runs
`medtx.training.trainer.fit`: the models layer never imports the training layer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from medtx.models.behrt import IGNORE, BehrtConfig
from medtx.models.encoded import EncodedSet
from medtx.models.registry import MaskedLM
from medtx.training.trainer import FitResult, TrainConfig, fit

log = logging.getLogger("medtx.training")


def mask_tokens(input_ids: Tensor, config: BehrtConfig, generator: torch.Generator | None = None
                ) -> tuple[Tensor, Tensor]:
    """BERT masking of code tokens -> (masked input ids, labels with IGNORE where nothing is predicted).

    Selects each code token with probability `mlm_prob`; of those 80% become [MASK], 10% a random code,
    10% stay. A sequence with codes but no selected token gets one (random) selected, so every sequence
    contributes to the loss — this nudges the rate above 15% only for very short sequences.
    """
    maskable = (input_ids >= 2) & (input_ids < config.n_codes)
    noise = torch.rand(input_ids.shape, generator=generator)
    selected = (noise < config.mlm_prob) & maskable
    empty = maskable.any(1) & ~selected.any(1)
    if empty.any():  # pick the maskable position with the smallest noise among rows that got none
        fallback = noise.masked_fill(~maskable, 2.0).argmin(1)
        selected[empty.nonzero().squeeze(1), fallback[empty]] = True
    labels = input_ids.masked_fill(~selected, IGNORE)
    action = torch.rand(input_ids.shape, generator=generator)
    masked = input_ids.masked_fill(selected & (action < 0.8), config.mask_id)
    randomise = selected & (action >= 0.8) & (action < 0.9)
    random_codes = torch.randint(2, max(config.n_codes, 3), input_ids.shape, generator=generator)
    return torch.where(randomise, random_codes, masked), labels


class MLMMasking:
    """Fresh masks on a collated batch (the trainer re-seeds torch per epoch, so runs repeat).

    A batch that already carries `mlm_input_ids` (the fixed validation masks) keeps them. The multi-hot
    `labels` are dropped: pre-training sees no task labels.
    """

    def __init__(self, config: BehrtConfig) -> None:
        self.config = config

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        batch.pop("labels")
        if "mlm_input_ids" not in batch:
            batch["mlm_input_ids"], batch["mlm_labels"] = mask_tokens(batch["input_ids"], self.config)
        return batch


class MLMCollator:
    """The model's collate + `MLMMasking` (fresh masks per call)."""

    def __init__(self, collate: Callable[[Sequence[dict]], dict[str, Any]], config: BehrtConfig) -> None:
        self.collate, self.masking = collate, MLMMasking(config)

    def __call__(self, items: Sequence[dict]) -> dict[str, Any]:
        return self.masking(self.collate(items))


def fixed_masks(items: Sequence[dict], config: BehrtConfig, seed: int) -> list[dict]:
    """Copies of `items` masked once with `seed` (stable validation loss across epochs)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for item in items:
        ids = torch.tensor([item["input_ids"]])
        masked, labels = mask_tokens(ids, config, generator)
        out.append({**item, "mlm_input_ids": masked[0].tolist(), "mlm_labels": labels[0].tolist()})
    return out


def pretrain_mlm(mlm: MaskedLM, train_items: Sequence[dict] | EncodedSet, val_items: Sequence[dict],
                 cfg: TrainConfig, out_dir: Path) -> FitResult:
    """MLM pre-training of the model's encoder on TRAIN items (val items for early stopping) via the shared
    trainer. `cfg.monitor` must be "loss". On return the encoder holds the best pre-trained weights (the MLM
    head shares it with the fine-tuning model); returns the trainer's `FitResult`.

    Training batches are cut from the items collated once (`train_items` may already be that EncodedSet, built
    with `mlm.collate`) and masked afresh per batch. With `cfg.length_buckets` they are length-bucketed like
    fine-tuning's; without, they are the batches and masks of a DataLoader over the items with `MLMCollator`.
    """
    if cfg.monitor != "loss":
        raise ValueError(f"MLM pre-training selects on validation MLM loss; got monitor={cfg.monitor!r}")
    encoded = train_items if isinstance(train_items, EncodedSet) else EncodedSet(train_items, mlm.collate)
    train = encoded.with_transform(MLMMasking(mlm.config))
    return fit(mlm.make_model(), train, fixed_masks(val_items, mlm.config, cfg.seed),
               MLMCollator(mlm.collate, mlm.config), cfg, Path(out_dir))


def pretrain_text_mlm(
    bert_config: Any,  # transformers.BertConfig
    tokenizer: Any,  # its PreTrainedTokenizerBase
    train_texts: Sequence[str],
    val_texts: Sequence[str],
    train_cfg: TrainConfig,
    out_dir: Path,
    mlm_cfg: Any = None,  # medtx.text.mlm.MLMConfig
) -> tuple[Path, FitResult]:
    """Train BertForMaskedLM on train_texts (val_texts only for the validation loss); returns the encoder
    folder (`out_dir/encoder`, with the tokenizer saved beside the weights) and the trainer's result."""
    from transformers import DataCollatorForLanguageModeling

    from medtx.text.mlm import MaskedLM as NoteMaskedLM
    from medtx.text.mlm import MLMConfig, mlm_windows

    mlm_cfg = mlm_cfg or MLMConfig()
    if train_cfg.monitor != "loss":
        raise ValueError("MLM pre-training selects on the validation MLM loss: use monitor='loss'")
    # Pad every batch to max_len: the trainer stacks labels across batches, so widths must agree.
    collate_mlm = DataCollatorForLanguageModeling(
        tokenizer, mlm_probability=mlm_cfg.mlm_probability, pad_to_multiple_of=mlm_cfg.max_len
    )
    model = NoteMaskedLM(bert_config)
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
