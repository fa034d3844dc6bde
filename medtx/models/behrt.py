"""BEHRT (Li et al. 2020): a BERT encoder over a patient's diagnosis history with age, segment and visit
position embeddings, pre-trained with masked language modelling, then fine-tuned per task.

Input: `[CLS] v1 [SEP] v2 [SEP] ...` (codes of each visit, see ehr_data.BehrtCodec) where every token
embedding is the sum of
    code embedding + age-at-visit embedding + segment (A/B alternating per visit) + visit position (sinusoidal)
followed by LayerNorm and the encoder blocks of medtx.models.layers (pre-LN; BEHRT used post-LN BERT
blocks — pre-LN is stabler at our small sizes). Ages are unknown (id 0) for drug_rec/readmission rows, whose
sample tables carry no age; next_visit rows carry them.

- `BehrtForMaskedLM`: MLM head; `medtx.training.pretrain.pretrain_mlm` masks 15% of code tokens (80% ->
  [MASK], 10% -> a random code, 10% unchanged; [CLS]/[SEP]/padding never), dynamically per epoch, on TRAIN
  items only (validation items, masked once with a fixed seed, drive early stopping), through the shared
  trainer `medtx.training.trainer.fit`. The bundle offers it as `EHRModelBundle.mlm`. In training its
  vocabulary head runs on the masked positions only, where the loss is defined (2.4x per pre-training step).
- `BehrtForMultiLabel`: pooled states -> one logit per label; next_visit and drug_rec (multi-label),
  readmission (one logit). It shares the `BehrtModel` instance the MLM pre-training updated.
  Pooling (`pooling`): "cls" = BEHRT/BERT's [CLS] state -> tanh pooler -> linear head (the paper's);
  "mean" = masked mean over the sequence's tokens -> linear head; "label_attention" = one attention-pooled view
  per label (CAML/LAAT, `layers.LabelAttentionPooling`).

Why the options (issue #5, next_visit on synth_10000: 1,469 labels from 1,801 training samples): the
paper's model stayed at the label prior (val PR-AUC 0.198, most_frequent 0.199, every seed flagged
collapsed). Its MLM did not get past a unigram-frequency predictor (val loss 6.035 vs 5.971 after 6 epochs:
1,801 sequences are far from BEHRT's 1.6M patients), so the encoder had little to give the head. Neither a
head that starts at the prior (`init_bias`: output bias = training log-odds, as the Transformer) nor mean or
label-attention pooling moved it (0.194-0.196). The copy gate did (`copy_recencies`, the Transformer's
`DrugCopyGate`, COGNet-style): a learned per-label logit for "label a is among the codes `r` visits back",
started at its training log-odds ratio (next_visit: r = 0, the current visit's diagnoses recur in the next
visit, 0.292 before fine-tuning, ~0.297 after; drug_rec: `copy_feature="drugs_hist"`, r = 1, 0.748 ->
0.780). The tasks turn the gate on for themselves (`Task.model_defaults`, medtx/tasks); the config defaults stay the paper's
model. Figures: seed 0, validation only (benchmarks/results.py states them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medtx.models.base import ModelOutput
from medtx.models.bounds import DropoutRate, Fraction, FFWidth, Heads, Layers, Length, Width, check_heads
from medtx.models.ehr_data import MASK, CodeIndex, LabelSpace, behrt_codec, vocab_tokens
from medtx.models.layers import (
    Dropout,
    DrugCopyGate,
    Encoder,
    LabelAttentionPooling,
    SinusoidalPositions,
    initial_output_bias,
    masked_mean,
    multilabel_loss,
)
from medtx.models.registry import (
    ModelContext,
    EHRModelBundle,
    MaskedLM,
    ModelSpec,
    chunked_init,
    make_config,
    register_model,
    sigmoid_proba,
)

IGNORE = -100  # cross-entropy ignore index for unmasked positions


@dataclass
class BehrtConfig:
    vocab_size: int  # codes + <pad>, <unk>, [CLS], [SEP], [MASK]
    n_labels: int
    n_codes: int = 0  # ids [2, n_codes) are real codes: MLM's random replacements come from there
    mask_id: int = 0  # id of [MASK] (set from the codec's index)
    # field types: bounds checked at config load (medtx.models.bounds)
    d_model: Width = 64  # BEHRT used 288; 64 keeps CPU training to minutes
    n_heads: Heads = 4
    n_layers: Layers = 2
    d_ff: FFWidth = 128
    dropout: DropoutRate = 0.1
    attention_dropout: DropoutRate | None = None  # on the attention weights; None = `dropout` (BERT's)
    n_ages: Length = 128  # age ids: 0 = unknown/pad, age + 1 (samples cap ages at 90)
    n_positions: Length = 64  # visit positions (sinusoidal table size; larger numbers are clamped)
    max_len: Length = 128  # tokens per patient sequence (oldest visits dropped first)
    mlm_prob: Fraction = 0.15  # share of code tokens selected for MLM (BERT/BEHRT)
    # "cls" (BEHRT: [CLS] -> tanh pooler) | "mean" | "label_attention", see module doc
    pooling: Literal["cls", "mean", "label_attention"] = "cls"
    init_bias: bool = False  # init_from_train sets the output bias to each label's training log-odds
    # Copy gate (see module doc): the feature whose codes name labels (None = the task's only feature,
    # e.g. next_visit "visits"), and the visit recencies it reads (0 = current visit); () = off.
    copy_feature: str | None = None
    copy_recencies: tuple[int, ...] = ()
    # The task's column of per-visit ages beside its one visits column (next_visit's `ages`, set by the task's
    # model_defaults); None: the sample rows carry no age, every age id is 0 (unknown).
    visit_ages: str | None = None

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)


POOLINGS = ("cls", "mean", "label_attention")


class BehrtEmbeddings(nn.Module):
    def __init__(self, config: BehrtConfig) -> None:
        super().__init__()
        self.code = nn.Embedding(config.vocab_size, config.d_model, padding_idx=0)
        self.age = nn.Embedding(config.n_ages, config.d_model, padding_idx=0)
        self.segment = nn.Embedding(2, config.d_model)
        self.position = SinusoidalPositions(config.d_model, config.n_positions)  # BEHRT: fixed, not trained
        self.norm = nn.LayerNorm(config.d_model)
        self.dropout = Dropout(config.dropout)

    def forward(self, input_ids: Tensor, age_ids: Tensor, segment_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = (self.code(input_ids) + self.age(age_ids.clamp(0, self.age.num_embeddings - 1))
             + self.segment(segment_ids) + self.position(position_ids))
        return self.dropout(self.norm(x))


class BehrtModel(nn.Module):
    """Embeddings + encoder: token states [B, L, D] and one attention tensor per layer."""

    def __init__(self, config: BehrtConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BehrtEmbeddings(config)
        self.encoder = Encoder(config.d_model, config.n_heads, config.d_ff, config.n_layers, config.dropout,
                               config.attention_dropout)

    def forward(self, batch: dict, input_ids: Tensor | None = None, need_weights: bool = True
                ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """`need_weights=False`: fused attention, no weights (empty tuple)."""
        ids = batch["input_ids"] if input_ids is None else input_ids
        x = self.embeddings(ids, batch["age_ids"], batch["segment_ids"], batch["position_ids"])
        return self.encoder(x, batch["attention_mask"], need_weights=need_weights)


class BehrtForMaskedLM(nn.Module):
    """MLM head over a (shared) BehrtModel; reads `mlm_input_ids` / `mlm_labels` from the batch."""

    def __init__(self, behrt: BehrtModel) -> None:
        super().__init__()
        self.config = behrt.config
        self.behrt = behrt
        d = self.config.d_model
        self.transform = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d))
        self.decoder = nn.Linear(d, self.config.vocab_size)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        states, weights = self.behrt(batch, input_ids=batch.get("mlm_input_ids"),
                                     need_weights=output_attentions)
        labels = batch.get("mlm_labels")
        if labels is None or output_attentions:
            logits = self.decoder(self.transform(states))  # [B, L, vocab]
            loss = None if labels is None else F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                                                               ignore_index=IGNORE)
            return ModelOutput(logits=logits, loss=loss, attentions={"behrt": weights} if output_attentions else None)
        # The loss is defined on the masked positions only (~15% of the codes), so the vocabulary head runs there
        # alone: the same mean cross-entropy, without [B, L, vocab] scores for every position (issue #18).
        # `logits` are those positions' scores, [n_masked, vocab].
        masked = labels != IGNORE
        logits = self.decoder(self.transform(states[masked]))
        return ModelOutput(logits=logits, loss=F.cross_entropy(logits.float(), labels[masked]))


class BehrtForMultiLabel(nn.Module):
    """Pooled BEHRT states -> one logit per label (+ the copy gate's logits when configured).

    `copy_targets[id]` is the label index of code id `id` of the copy feature (-1: not a label); required
    exactly when `config.copy_recencies` is non-empty.
    """

    def __init__(self, config: BehrtConfig, copy_targets: Sequence[int] | None = None) -> None:
        super().__init__()
        if config.pooling not in POOLINGS:
            raise ValueError(f"BehrtConfig.pooling={config.pooling!r}; expected one of {list(POOLINGS)}")
        self.config = config
        self.behrt = BehrtModel(config)
        self.dropout = Dropout(config.dropout)
        self.pooler = (nn.Sequential(nn.Linear(config.d_model, config.d_model), nn.Tanh())
                       if config.pooling == "cls" else None)
        self.head: nn.Module = (LabelAttentionPooling(1, config.n_labels, config.d_model)
                                if config.pooling == "label_attention" else nn.Linear(config.d_model, config.n_labels))
        self.copy = None
        if config.copy_recencies:
            if copy_targets is None or len(copy_targets) != config.vocab_size:
                raise ValueError(f"BehrtConfig.copy_recencies={config.copy_recencies} needs copy_targets (label "
                                 f"index per code id) of length {config.vocab_size}, got "
                                 f"{None if copy_targets is None else len(copy_targets)}")
            self.copy = DrugCopyGate(torch.tensor(list(copy_targets)), config.n_labels, tuple(config.copy_recencies))

    def copy_presence(self, batch: dict) -> Tensor:
        """[B, len(copy_recencies), n_labels]: which labels the sequence's codes hold at each visit recency.

        Visits are the `position_ids` (visit numbers); the last visit of each row is recency 0.
        """
        mask = batch["attention_mask"]
        visit = batch["position_ids"]
        nvisits = visit.masked_fill(~mask, 0).amax(1) + 1
        return self.copy.present(batch["input_ids"], visit, nvisits, mask)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        states, weights = self.behrt(batch, need_weights=output_attentions)
        mask = batch["attention_mask"]
        if self.config.pooling == "cls":
            logits = self.head(self.dropout(self.pooler(states[:, 0])))
        elif self.config.pooling == "mean":
            logits = self.head(self.dropout(masked_mean(states, mask)))
        else:
            logits = self.head([self.dropout(states)], [mask])
        if self.copy is not None:
            logits = logits + self.copy(self.copy_presence(batch))
        loss = multilabel_loss(logits, batch["labels"]) if "labels" in batch else None
        if not output_attentions:
            return ModelOutput(logits=logits, loss=loss)
        tokens = batch["tokens"]
        return ModelOutput(logits=logits, loss=loss, attentions={"behrt": weights},
                           attention_tokens={"behrt": (tokens, tokens)})

    @torch.no_grad()
    def init_from_train(self, batches: Iterable[dict]) -> None:
        """Data-dependent start (only when `init_bias` or the copy gate is on): output bias = each label's
        training log-odds (add-half smoothed), or with the copy gate the gate's ML start (DrugCopyGate.init_weights)
        and its 'copied nowhere' base log-odds as bias. Fine-tuning then starts at the prior (or at a calibrated
        copy model) instead of spending its epochs pulling 1,469 logits from p = 0.5 down to it."""
        if not (self.config.init_bias or self.copy is not None):
            return
        self.head.bias.copy_(initial_output_bias(batches, self.copy, self.copy_presence).to(self.head.bias.dtype))


# ----------------------------------------------------------------------------------------------- registry


def copy_targets(features: tuple[str, ...], vocabs: dict[str, Any], labels: LabelSpace, index: CodeIndex,
                 config: BehrtConfig) -> list[int]:
    """Label index of each BEHRT token id that is a code of the copy feature (-1 elsewhere)."""
    feature = config.copy_feature or (features[0] if len(features) == 1 else None)
    if feature not in features:
        raise ValueError(f"BehrtConfig.copy_feature={config.copy_feature!r}: expected one of {list(features)}")
    targets = [-1] * len(index)
    for token in vocab_tokens(vocabs[feature])[2:]:  # idx 0/1 are <pad>/<unk>
        code_id = index.code(feature, token)
        if code_id > 1:
            targets[code_id] = labels.index.get(token, -1)
    return targets


def build(ctx: ModelContext) -> EHRModelBundle:
    index = behrt_codec(ctx.task, ctx.vocabs, ctx.labels, 1).index
    fixed = {"vocab_size": len(index), "n_labels": len(ctx.labels), "n_codes": index.n_codes,
             "mask_id": index.special(MASK)}
    config = make_config(BehrtConfig, fixed, ctx.overrides)
    codec = behrt_codec(ctx.task, ctx.vocabs, ctx.labels, config.max_len, config.visit_ages)
    model = BehrtForMultiLabel(config, copy_targets(ctx.task.samples.features, ctx.vocabs, ctx.labels, codec.index, config)
                               if config.copy_recencies else None)
    return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba,
                          mlm=MaskedLM(lambda: BehrtForMaskedLM(model.behrt), codec.collate, config),
                          label_names=ctx.labels.names, init_from_train=chunked_init(model, codec.collate))


register_model(ModelSpec(
    name="behrt", family="ehr", kinds=("multilabel", "binary"), config=BehrtConfig, build=build, rank=30,
    # checkpoints from before these options: the [CLS] pooler, no copy gate
    checkpoint_defaults={"pooling": "cls", "copy_recencies": ()},
))
