"""Transformer encoder for EHR visit histories (PyHealth `Transformer` semantics, book ch. 8).

One embedding table and one self-attention encoder per feature (conditions, procedures, drug history):

    codes of visit 1 | codes of visit 2 | ... | codes of the current visit      (flattened history)
      -> [CLS] + code embeddings + sinusoidal position of each code's *visit*
      -> N pre-LayerNorm encoder layers with padding masks
      -> pooling, then one logit per label (BCE):
         "label_attention" (default): every label has its own query per feature and attends over that
             feature's token states ([CLS] included, so an empty history still pools to something);
             logit = sum over features of <label weight, label's pooled state> + label bias
         "mean": masked mean per feature, concat over features -> dropout -> linear

Positions: all codes of a visit share one position, counted back from the current visit (0 = current
visit, 1 = the one before, ...). Codes inside a visit are a set, so they get no order among themselves, and
the current visit sits at the same position whatever the history length. Pooling: PyHealth 1.x takes the
first position's output (its first visit, not a learned [CLS]). A single pooled vector per feature has to carry the whole multi-hot
history through d_model dimensions: on the synthetic cohort (118 drug labels, d_model 64) mean pooling could
not even learn "the previous visit's drugs recur" and stayed at the most-frequent baseline. Label-wise
attention (CAML, Mullenbach et al. 2018; LAAT, Vu et al. 2020) gives each label its own view of the codes,
so "drug a was given last visit" or "an indicator diagnosis of a is present" reaches label a's logit
directly; see `LabelAttentionPooling`.

Copy gate (optional, `copy_feature`): COGNet (Wu et al. 2022, "Conditional Generation Net for Medication
Recommendation", WWW '22) copies drugs from earlier visits, because a patient's previous medication is the
best single predictor of the next. Label attention can learn "a was given last visit" only through a query
that finds a's token among the history, which a small model trained for a few CPU epochs does not get
right for every label (on synth_10000 the Transformer stayed below copy-previous-visit). `DrugCopyGate` adds
the copy path directly: logit_a += sum_r w[r, a] * [label a among the copy feature's codes r visits back]
(r = 1: the previous visit), one learned weight per (recency, label), started at each label's training
log-odds ratio. It is `len(copy_recencies) * n_labels` parameters beside the attention encoders, which stay
the model's core (they carry every diagnosis/procedure effect and how much the history matters beyond the
copy). Off by default; the drug_rec task turns it on (`drugs_hist` -> `drugs` labels). Measured on
synth_10000 drug_rec validation, seed 0 (PR-AUC): 0.765 without the gate, 0.777 with it; the gate + output
bias alone, before training, 0.774 (logistic regression 0.772, copy-previous-visit 0.771) -- so most of the
gain is the copy path, and the attention encoders add the rest. The copy path has no attention weights: the
stored/dashboard attention shows only what the encoders and label queries do.

One sequence (optional, `joint_sequence`): instead of one encoder per feature, every feature's codes form one
[CLS]-led sequence, visit by visit with each code at its visit's position (medtx.models.ehr_data.joint_history: ids
from one id space, so a diagnosis and a procedure stay distinct tokens), read by one encoder, and the label head
attends over all of it at once. Diagnoses, procedures and earlier drugs then attend to each other, and a step runs
one encoder and one head instead of three of each: on synth_10000 drug_rec (seeds 0-7, paired, 10 epochs) best
validation PR-AUC was higher in 8 of 8 seeds (mean +0.0011) and a training step took about 8 ms instead of 14 on one
CPU thread (issue #18, benchmarks/README.md round 7). drug_rec turns it on; the generic default stays PyHealth's
one encoder per feature. Its attention export is one module, `codes`.

The building blocks (`MultiHeadAttention`, `Encoder`, `SinusoidalPositions`, `LabelAttentionPooling`,
`DrugCopyGate`, ...) live in medtx/models/layers.py, shared with the other models. Attention is computed
explicitly, returning every layer's weights [B, heads, queries, keys], only when `output_attentions` asks
for them (the export pass); otherwise it runs torch's fused scaled_dot_product_attention (same function).

Batch keys (from `medtx.models.ehr_data.collate_ehr`): per feature f: `f_ids` [B, L] code ids (0 = pad),
`f_visit` [B, L] chronological visit index of each code, `f_nvisits` [B], `f_mask` [B, L] (True = real code);
`labels` [B, n_labels]; `tokens` {f: list of code labels per sample}.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from medtx.models.base import ModelOutput
from medtx.models.bounds import DropoutRate, FFWidth, Heads, Layers, Length, Width, check_heads
from medtx.models.ehr_data import JOINT, CodeIndex, LabelSpace, history_codec
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
    ModelSpec,
    chunked_init,
    make_config,
    register_model,
    sigmoid_proba,
)


@dataclass
class TransformerConfig:  # field types: bounds checked at config load (medtx.models.bounds)
    n_labels: int  # output logits: label vocabulary size (1 for binary readmission)
    vocab_sizes: dict[str, int] = field(default_factory=dict)  # feature -> embedding rows (pad + unk + codes)
    features: tuple[str, ...] = ("conditions", "procedures", "drugs_hist")
    # Small on purpose: trains on 2 CPU cores in minutes at 10k patients. Chosen on synth_10000 drug_rec
    # validation (~2,400 training samples, 1,701 diagnosis codes), label-attention pooling, max_visits 2,
    # weight decay 0.1: d_model 64 / 2 layers peaked 0.767 val PR-AUC and overfit from epoch ~6;
    # 32 / 1 layer / dropout 0.1 peaked 0.770 (epoch 11). Smaller still (16) learned too slowly.
    d_model: Width = 32
    n_heads: Heads = 4
    n_layers: Layers = 1
    d_ff: FFWidth = 64  # feed-forward width (2 x d_model)
    dropout: DropoutRate = 0.1
    attention_dropout: DropoutRate | None = None  # on the attention weights; None = `dropout`
    max_visits: Length = 20  # keep the most recent visits of a long history
    max_codes: Length = 128  # per feature, most recent codes kept after flattening (attention is O(L^2))
    pooling: Literal["label_attention", "mean"] = "label_attention"  # one attention-pooled view per label | mean
    # Copy gate (COGNet-style, see the module docstring): the feature whose codes name labels (drug_rec:
    # "drugs_hist"), None = off; and which visits count, as recency (0 = current visit, 1 = the previous one).
    copy_feature: str | None = None
    copy_recencies: tuple[int, ...] = (1,)
    # One sequence, one encoder (see the module docstring): every feature's codes in one [CLS]-led sequence, visit by
    # visit (medtx.models.ehr_data.joint_history), instead of one encoder per feature. Off by default (PyHealth's
    # layout); drug_rec turns it on.
    joint_sequence: bool = False

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)


POOLINGS = ("label_attention", "mean")


class FeatureEncoder(nn.Module):
    """One feature's history: [CLS] + code embeddings (+ visit positions) -> encoder -> token states."""

    def __init__(self, vocab_size: int, config: TransformerConfig, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, config.d_model, padding_idx=0)
        self.cls = nn.Parameter(torch.randn(1, 1, config.d_model) * 0.02)
        # With rotary embeddings positions enter through q/k only (RoFormer); otherwise they are added.
        self.positions = SinusoidalPositions(config.d_model, config.max_visits + 1) if rotary is None else None
        self.rotary = rotary
        self.dropout = Dropout(config.dropout)
        self.encoder = Encoder(config.d_model, config.n_heads, config.d_ff, config.n_layers, config.dropout,
                               config.attention_dropout)

    def forward(self, ids: Tensor, visit: Tensor, nvisits: Tensor, mask: Tensor, need_weights: bool = True
                ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """-> (states [B, 1 + L, D] with [CLS] first, mask [B, 1 + L], attention weights per layer: none
        when `need_weights` is False, which runs the fused attention kernel)."""
        recency = (nvisits.unsqueeze(1) - 1 - visit).clamp(min=0)  # 0 = current visit
        x = self.embed(ids)
        if self.positions is not None:
            x = x + self.positions(recency)
        x = torch.cat([self.cls.expand(ids.shape[0], -1, -1).to(x.dtype), x], dim=1)
        # [CLS] is always a real key (so no query attends to nothing) and sits at the current visit.
        mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        recency = torch.cat([torch.zeros_like(recency[:, :1]), recency], dim=1)
        states, weights = self.encoder(self.dropout(x), mask, rotary=self.rotary, positions=recency,
                                       need_weights=need_weights)
        return states, mask, weights


class TransformerModel(nn.Module):
    """Per-feature encoders (or one over the joint sequence), then label-attention pooling (or mean pooling + linear
    head) -> logits."""

    def __init__(self, config: TransformerConfig, copy_targets: Sequence[int] | None = None) -> None:
        """`copy_targets[id]`: label index of `config.copy_feature`'s code id, -1 when it is no label."""
        super().__init__()
        missing = [f for f in config.features if f not in config.vocab_sizes]
        if missing:
            raise ValueError(f"TransformerConfig.vocab_sizes has no size for feature(s) {missing}")
        if config.pooling not in POOLINGS:
            raise ValueError(f"TransformerConfig.pooling={config.pooling!r}; expected one of {list(POOLINGS)}")
        self.copy = self._copy_gate(config, copy_targets)
        self.config = config
        sequences = (JOINT,) if config.joint_sequence else config.features
        if JOINT in sequences and JOINT not in config.vocab_sizes:
            raise ValueError(f"TransformerConfig.joint_sequence needs vocab_sizes[{JOINT!r}] (the joint id space)")
        # One encoder per sequence the batch carries: each feature's, or the joint one (batch keys `codes_*`).
        self.encoders = nn.ModuleDict(
            {f: FeatureEncoder(config.vocab_sizes[f], config, self._rotary()) for f in sequences}
        )
        self.dropout = Dropout(config.dropout)
        self.head: nn.Module = (LabelAttentionPooling(len(sequences), config.n_labels, config.d_model)
                                if config.pooling == "label_attention"
                                else nn.Linear(len(sequences) * config.d_model, config.n_labels))

    @staticmethod
    def _copy_gate(config: TransformerConfig, copy_targets: Sequence[int] | None) -> DrugCopyGate | None:
        if config.copy_feature is None:
            return None
        if config.copy_feature not in config.features:
            raise ValueError(f"TransformerConfig.copy_feature={config.copy_feature!r} is not one of the "
                             f"model's features {list(config.features)}")
        size = config.vocab_sizes[config.copy_feature]
        if copy_targets is None or len(copy_targets) != size:
            raise ValueError(f"copy_feature={config.copy_feature!r} needs copy_targets (label index per code id) "
                             f"of length {size}, got {None if copy_targets is None else len(copy_targets)}")
        return DrugCopyGate(torch.tensor(list(copy_targets)), config.n_labels, tuple(config.copy_recencies))

    def copy_presence(self, batch: dict) -> Tensor:
        """[B, len(copy_recencies), n_labels]: which labels the copy feature holds at each recency."""
        f = self.config.copy_feature
        return self.copy.present(batch[f"{f}_ids"], batch[f"{f}_visit"], batch[f"{f}_nvisits"], batch[f"{f}_mask"])

    @torch.no_grad()
    def init_from_train(self, batches: Iterable[dict]) -> None:
        """Data-dependent start from collated training batches: output bias, and the copy gate when on."""
        self.head.bias.copy_(initial_output_bias(batches, self.copy, self.copy_presence).to(self.head.bias.dtype))

    def _rotary(self) -> nn.Module | None:
        """Absolute sinusoidal positions here; transformer_rope.TransformerRoPEModel returns a rotary module."""
        return None

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        states, masks, attentions = [], [], {}
        for f, encoder in self.encoders.items():
            s, mask, weights = encoder(batch[f"{f}_ids"], batch[f"{f}_visit"], batch[f"{f}_nvisits"],
                                       batch[f"{f}_mask"], need_weights=output_attentions)
            states.append(s)
            masks.append(mask)
            attentions[f] = weights
        if self.config.pooling == "mean":
            pooled = [masked_mean(s, mask) for s, mask in zip(states, masks, strict=True)]
            logits = self.head(self.dropout(torch.cat(pooled, dim=-1)))
        else:
            logits = self.head([self.dropout(s) for s in states], masks)
        if self.copy is not None:
            logits = logits + self.copy(self.copy_presence(batch))
        loss = multilabel_loss(logits, batch["labels"]) if "labels" in batch else None
        if not output_attentions:
            return ModelOutput(logits=logits, loss=loss)
        tokens = {f: [["[CLS]", *row] for row in batch["tokens"][f]] for f in self.encoders}
        return ModelOutput(logits=logits, loss=loss, attentions=attentions,
                           attention_tokens={f: (tokens[f], tokens[f]) for f in tokens})


# ----------------------------------------------------------------------------------------------- registry


def copy_targets(vocabs: dict[str, Any], labels: LabelSpace, copy_feature: str | None) -> list[int] | None:
    """Label index of each code id of `copy_feature` (-1: not a label), in the history codec's id order."""
    if copy_feature is None or copy_feature not in vocabs:
        return None  # the model raises a clear error when it was asked to copy from a missing feature
    return [labels.index.get(token, -1) for token in CodeIndex(vocabs, [copy_feature]).labels]


def history_builder(model_cls: type, config_cls: type) -> Callable[[ModelContext], EHRModelBundle]:
    """`build` for a model over per-feature code histories (medtx.models.ehr_data.HistoryCodec)."""
    def build(ctx: ModelContext) -> EHRModelBundle:
        sizes = {f: len(index) for f, index in history_codec(ctx.task, ctx.vocabs, ctx.labels, 1, 1).index.items()}
        fixed = {"n_labels": len(ctx.labels), "vocab_sizes": sizes, "features": ctx.task.samples.features}
        config = make_config(config_cls, fixed, ctx.overrides)
        codec = history_codec(ctx.task, ctx.vocabs, ctx.labels, config.max_visits, config.max_codes,
                              joint=config.joint_sequence)
        if codec.joint is not None:
            config.vocab_sizes[JOINT] = len(codec.joint)
        model = model_cls(config, copy_targets(ctx.vocabs, ctx.labels, config.copy_feature))
        return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba,
                              label_names=ctx.labels.names, init_from_train=chunked_init(model, codec.collate))
    return build


# Checkpoints from before these options: mean pooling, no copy gate, one encoder per feature.
CHECKPOINT_DEFAULTS: dict[str, Any] = {"pooling": "mean", "copy_feature": None, "joint_sequence": False}

register_model(ModelSpec(
    name="transformer", family="ehr", kinds=("multilabel", "binary"), config=TransformerConfig,
    build=history_builder(TransformerModel, TransformerConfig),
    checkpoint_defaults=CHECKPOINT_DEFAULTS, rank=10,
))
