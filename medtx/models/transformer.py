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
copy). Off by default; the registry turns it on for drug_rec (`drugs_hist` -> `drugs` labels). Measured on
synth_10000 drug_rec validation, seed 0 (PR-AUC): 0.765 without the gate, 0.777 with it; the gate + output
bias alone, before training, 0.774 (logistic regression 0.772, copy-previous-visit 0.771) -- so most of the
gain is the copy path, and the attention encoders add the rest. The copy path has no attention weights: the
stored/dashboard attention shows only what the encoders and label queries do.

The building blocks here (`MultiHeadAttention`, `FeedForward`, `EncoderLayer`, `Encoder`,
`SinusoidalPositions`) are reused by transformer_rope.py, behrt.py and seq2seq.py. Attention is computed
explicitly so that every layer's weights [B, heads, queries, keys] can be returned.

Batch keys (from `medtx.models.ehr_data.collate_ehr`): per feature f: `f_ids` [B, L] code ids (0 = pad),
`f_visit` [B, L] chronological visit index of each code, `f_nvisits` [B], `f_mask` [B, L] (True = real code);
`labels` [B, n_labels]; `tokens` {f: list of code labels per sample}.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medtx.models.base import ModelOutput


@dataclass
class TransformerConfig:
    n_labels: int  # output logits: label vocabulary size (1 for binary readmission)
    vocab_sizes: dict[str, int] = field(default_factory=dict)  # feature -> embedding rows (pad + unk + codes)
    features: tuple[str, ...] = ("conditions", "procedures", "drugs_hist")
    # Small on purpose: trains on 2 CPU cores in minutes at 10k patients. Chosen on synth_10000 drug_rec
    # validation (~2,400 training samples, 1,701 diagnosis codes), label-attention pooling, max_visits 2,
    # weight decay 0.1: d_model 64 / 2 layers peaked 0.767 val PR-AUC and overfit from epoch ~6;
    # 32 / 1 layer / dropout 0.1 peaked 0.770 (epoch 11). Smaller still (16) learned too slowly.
    d_model: int = 32
    n_heads: int = 4
    n_layers: int = 1
    d_ff: int = 64  # feed-forward width (2 x d_model)
    dropout: float = 0.1
    max_visits: int = 20  # keep the most recent visits of a long history
    max_codes: int = 128  # per feature, most recent codes kept after flattening (attention is O(L^2))
    pooling: str = "label_attention"  # "label_attention" (one attention-pooled view per label) | "mean"
    # Copy gate (COGNet-style, see the module docstring): the feature whose codes name labels (drug_rec:
    # "drugs_hist"), None = off; and which visits count, as recency (0 = current visit, 1 = the previous one).
    copy_feature: str | None = None
    copy_recencies: tuple[int, ...] = (1,)


POOLINGS = ("label_attention", "mean")


# ----------------------------------------------------------------------------------------------- blocks


def sinusoidal_table(n_positions: int, dim: int) -> Tensor:
    """The fixed [n_positions, dim] sin/cos table of 'Attention is all you need' (sin on even dims)."""
    position = torch.arange(n_positions, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_positions, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


class SinusoidalPositions(nn.Module):
    """Looks positions up in the fixed sinusoidal table (not trained, not saved)."""

    def __init__(self, dim: int, n_positions: int = 512) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(n_positions, dim), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        return self.table[positions.clamp(0, self.table.shape[0] - 1)]


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over `heads`, written out so the weights can be returned.

    Self-attention when `memory` is None, cross-attention (queries from x, keys/values from memory)
    otherwise. `key_mask` [B, K] is True for real keys; `causal` hides future keys (decoder). An optional
    `rotary` module (transformer_rope.RotaryEmbedding) rotates q and k by their positions instead of adding
    positions to the input (RoFormer).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def _split(self, x: Tensor) -> Tensor:  # [B, T, D] -> [B, H, T, Dh]
        return x.view(x.shape[0], x.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        key_mask: Tensor,
        memory: Tensor | None = None,
        causal: bool = False,
        rotary: nn.Module | None = None,
        q_pos: Tensor | None = None,
        k_pos: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        source = x if memory is None else memory
        q, k, v = self._split(self.q(x)), self._split(self.k(source)), self._split(self.v(source))
        if rotary is not None:
            q, k = rotary(q, q_pos), rotary(k, k_pos)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # [B, H, Q, K]
        hidden = ~key_mask[:, None, None, :]
        if causal:
            n_q, n_k = scores.shape[-2:]
            hidden = hidden | torch.ones(n_q, n_k, dtype=torch.bool, device=x.device).triu(1)
        # finfo.min instead of -inf: a fully hidden row (a padding query) gives uniform weights, not NaN.
        scores = scores.float().masked_fill(hidden, torch.finfo(torch.float32).min)
        weights = scores.softmax(dim=-1)  # softmax in fp32 even under bf16 autocast
        context = self.dropout(weights).to(v.dtype) @ v
        context = context.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.out(context), weights


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class EncoderLayer(nn.Module):
    """Pre-LayerNorm block (stabler than post-LN for small, briefly trained models): x + attn, x + ffn."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.norm_ff = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor, rotary: nn.Module | None = None,
                positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        attended, weights = self.attn(self.norm_attn(x), mask, rotary=rotary, q_pos=positions, k_pos=positions)
        x = x + self.dropout(attended)
        x = x + self.dropout(self.ff(self.norm_ff(x)))
        return x, weights


class Encoder(nn.Module):
    """A stack of encoder layers with a final LayerNorm; returns states and one weight tensor per layer."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_layers: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mask: Tensor, rotary: nn.Module | None = None,
                positions: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, rotary=rotary, positions=positions)
            weights.append(w)
        return self.norm(x), tuple(weights)


def masked_mean(states: Tensor, mask: Tensor) -> Tensor:
    """Mean of `states` [B, L, D] over positions where `mask` [B, L] is True."""
    weights = mask.to(states.dtype).unsqueeze(-1)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def multilabel_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """BCE-with-logits over every label (multi-label) or the single readmission logit (binary)."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


# ----------------------------------------------------------------------------------------------- model


class LabelAttentionPooling(nn.Module):
    """Label-wise attention pooling and output layer (CAML / LAAT) over several features' token states.

    For feature f and label a: weights = softmax over real tokens of <query[f, a], state> / sqrt(d),
    pooled[f, a] = weighted sum of states, logit_a = bias_a + sum_f <weight[f, a], pooled[f, a]>.
    Cost is O(B * labels * L * d) per feature: small next to self-attention at these sizes.
    """

    def __init__(self, n_features: int, n_labels: int, d_model: int) -> None:
        super().__init__()
        scale = d_model ** -0.5
        self.query = nn.Parameter(torch.randn(n_features, n_labels, d_model) * scale)
        self.weight = nn.Parameter(torch.randn(n_features, n_labels, d_model) * scale)
        self.bias = nn.Parameter(torch.zeros(n_labels))

    def forward(self, states: list[Tensor], masks: list[Tensor]) -> Tensor:
        """states: per feature [B, L_f, D]; masks: per feature [B, L_f] (True = real) -> logits [B, labels]."""
        logits = self.bias.float()
        for i, (s, mask) in enumerate(zip(states, masks, strict=True)):
            scores = torch.einsum("bld,ad->bal", s, self.query[i].to(s.dtype)).float() / math.sqrt(s.shape[-1])
            scores = scores.masked_fill(~mask[:, None, :], torch.finfo(torch.float32).min)
            pooled = torch.einsum("bal,bld->bad", scores.softmax(dim=-1).to(s.dtype), s)
            logits = logits + (pooled.float() * self.weight[i].float()).sum(-1)
        return logits


class DrugCopyGate(nn.Module):
    """Per-label copy logits from the labels found in the copy feature's recent visits (COGNet-style).

    `code_to_label[id]` is the label index of the copy feature's code id (-1: not a label, e.g. <pad>/<unk>).
    logit_a = sum_k weight[k, a] * present[k, a], present[k, a] = 1 when label a is among the codes at
    recency `recencies[k]`. Weights start at 0; `init_weights` sets them from training data.
    """

    def __init__(self, code_to_label: Tensor, n_labels: int, recencies: tuple[int, ...]) -> None:
        super().__init__()
        if not recencies or min(recencies) < 0:
            raise ValueError(f"copy_recencies must be non-empty visit recencies >= 0, got {recencies}")
        self.register_buffer("code_to_label", code_to_label.long(), persistent=False)  # rebuilt from vocabs
        self.n_labels, self.recencies = n_labels, tuple(recencies)
        self.weight = nn.Parameter(torch.zeros(len(self.recencies), n_labels))

    def present(self, ids: Tensor, visit: Tensor, nvisits: Tensor, mask: Tensor) -> Tensor:
        """-> [B, len(recencies), n_labels] 0/1: label a is among the codes `recencies[k]` visits back."""
        recency = nvisits.unsqueeze(1) - 1 - visit
        target = self.code_to_label[ids]
        out = torch.zeros(ids.shape[0], len(self.recencies), self.n_labels + 1, device=ids.device)
        for k, r in enumerate(self.recencies):
            hit = mask & (recency == r) & (target >= 0)
            # codes that are not labels (or not at this recency) land in a spare last column, dropped below
            out[:, k].scatter_(1, torch.where(hit, target, self.n_labels), 1.0)
        return out[..., : self.n_labels]

    def forward(self, present: Tensor) -> Tensor:
        return (present * self.weight.float()).sum(1)

    @torch.no_grad()
    def init_weights(self, present: Tensor, labels: Tensor) -> Tensor:
        """Set w[k, a] = logit P(a | copied at k) - logit P(a | copied nowhere); return that base logit.

        With one recency this is the maximum-likelihood logistic regression of label a on "a was given
        last visit" (add-half smoothed), so training starts at a calibrated copy-previous-visit + label
        frequency model instead of spending its few CPU epochs growing the copy weights from 0.
        """
        labels = labels.float()
        nowhere = 1.0 - present.amax(1)  # [N, labels]
        base = smoothed_log_odds((labels * nowhere).sum(0), nowhere.sum(0))
        for k in range(len(self.recencies)):
            copied = present[:, k]
            self.weight[k] = smoothed_log_odds((labels * copied).sum(0), copied.sum(0)) - base
        return base


def smoothed_log_odds(hits: Tensor, n: Tensor | float) -> Tensor:
    """log(p / (1 - p)) of p = hits / n with add-half smoothing, so labels never (or always) seen stay finite."""
    p = (hits + 0.5) / (n + 1.0)
    return torch.log(p / (1.0 - p))


@torch.no_grad()
def initial_output_bias(batches: Iterable[dict], copy: DrugCopyGate | None,
                        copy_presence: Callable[[dict], Tensor]) -> Tensor:
    """The output bias a multi-label head should start at, from collated training batches.

    Without a copy gate: each label's training log-odds, so the model starts at the most-frequent baseline
    instead of p = 0.5 everywhere and the few epochs a CPU budget allows go to learning from the codes
    (measured: +0.005 val PR-AUC at epoch 6 on synth_10000). With one: the gate's maximum-likelihood start
    (`DrugCopyGate.init_weights`, which sets the gate's weights) and its 'copied nowhere' base log-odds.
    """
    labels, present = [], []
    for batch in batches:
        labels.append(batch["labels"].float())
        if copy is not None:
            present.append(copy_presence(batch))
    y = torch.cat(labels)
    if copy is None:
        return smoothed_log_odds(y.sum(0), y.shape[0])
    return copy.init_weights(torch.cat(present), y)


class FeatureEncoder(nn.Module):
    """One feature's history: [CLS] + code embeddings (+ visit positions) -> encoder -> token states."""

    def __init__(self, vocab_size: int, config: TransformerConfig, rotary: nn.Module | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, config.d_model, padding_idx=0)
        self.cls = nn.Parameter(torch.randn(1, 1, config.d_model) * 0.02)
        # With rotary embeddings positions enter through q/k only (RoFormer); otherwise they are added.
        self.positions = SinusoidalPositions(config.d_model, config.max_visits + 1) if rotary is None else None
        self.rotary = rotary
        self.dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config.d_model, config.n_heads, config.d_ff, config.n_layers, config.dropout)

    def forward(self, ids: Tensor, visit: Tensor, nvisits: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor, tuple[Tensor, ...]]:
        """-> (states [B, 1 + L, D] with [CLS] first, mask [B, 1 + L], attention weights per layer)."""
        recency = (nvisits.unsqueeze(1) - 1 - visit).clamp(min=0)  # 0 = current visit
        x = self.embed(ids)
        if self.positions is not None:
            x = x + self.positions(recency)
        x = torch.cat([self.cls.expand(ids.shape[0], -1, -1).to(x.dtype), x], dim=1)
        # [CLS] is always a real key (so no query attends to nothing) and sits at the current visit.
        mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        recency = torch.cat([torch.zeros_like(recency[:, :1]), recency], dim=1)
        states, weights = self.encoder(self.dropout(x), mask, rotary=self.rotary, positions=recency)
        return states, mask, weights


class TransformerModel(nn.Module):
    """Per-feature encoders, then label-attention pooling (or mean pooling + linear head) -> logits."""

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
        self.encoders = nn.ModuleDict(
            {f: FeatureEncoder(config.vocab_sizes[f], config, self._rotary()) for f in config.features}
        )
        self.dropout = nn.Dropout(config.dropout)
        n_features = len(config.features)
        self.head: nn.Module = (LabelAttentionPooling(n_features, config.n_labels, config.d_model)
                                if config.pooling == "label_attention"
                                else nn.Linear(n_features * config.d_model, config.n_labels))

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
                                       batch[f"{f}_mask"])
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
