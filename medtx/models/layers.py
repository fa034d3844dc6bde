"""Building blocks shared by the model files of medtx.models (EHR and text).

Attention runs through torch's fused `scaled_dot_product_attention` when neither weights nor CPU attention dropout
are wanted (validation, prediction: its flash kernel) and explicitly otherwise (training on CPU with dropout; the
attention export pass, which returns every layer's weights [B, heads, queries, keys]). Every path computes the
same function. Dropout (`Dropout`, `dropout`) draws its CPU keep-mask from 16-bit slices of random 64-bit words
instead of `torch.bernoulli_` (about 4x cheaper on CPU, where the [B, heads, L, L] attention masks made it the
largest single cost of a training step: issue #18's profile); on GPU it is torch's own dropout.
Blocks: `Dropout`, `SinusoidalPositions` (+ `sinusoidal_table`), `MultiHeadAttention` (self/cross, causal, rotary),
`FeedForward`, `EncoderLayer`, `Encoder`; pooling and heads: `masked_mean`, `LabelAttentionPooling`
(CAML/LAAT), `DrugCopyGate` (COGNet-style copy path); losses and starts: `multilabel_loss`,
`classification_loss`, `smoothed_log_odds`, `initial_output_bias`; visit pooling: `visit_embeddings`.
They live here, not in one model's file, so a model imports the layer below it and never another model.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

# ----------------------------------------------------------------------------------------------- blocks

# The fused attention kernels allowed on CUDA: not cuDNN's. Under bf16 autocast torch picks cuDNN attention, which
# builds a new execution plan for every new (batch, length) shape: 0.35-0.4 s of CPU per forward and per backward
# while the GPU work is microseconds. A training's batches have many lengths, so on an H200 the transformer trained
# at 331 samples/s (bf16, first sight of each shape) against 8,057 in fp32, which uses the memory-efficient kernel
# (benchmarks/gpu/bf16_probe.py; benchmarks/README.md, the first GPU run). The same maths, another kernel.
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]



def fused_attention_kernels(x: Tensor) -> contextlib.AbstractContextManager:
    """`CUDA_SDPA_BACKENDS` around code whose attention calls torch's SDPA itself (transformers' BertModel, BERT's
    masked LM) when `x` is on CUDA; nothing elsewhere. The backward runs the kernel its forward picked."""
    return sdpa_kernel(CUDA_SDPA_BACKENDS) if x.is_cuda else contextlib.nullcontext()


_LEVELS = 1 << 16  # keep-mask resolution: each element's draw is one uniform 16-bit integer


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1 / (1 - p).

    On CPU the keep-mask compares uniform 16-bit integers (four per random 64-bit word from torch's seeded
    generator) with round(p * 65536), so the drop rate is p to within 1 / 131072 (0.1 -> 0.1000061) and the
    scale uses that exact rate (the expectation is kept exactly). torch's own CPU dropout draws one Bernoulli
    per element, about 4x slower. Elsewhere (CUDA) and for p outside (0, 1) it is `torch.nn.functional.dropout`.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    cut = round(p * _LEVELS)
    if cut == 0:
        return x
    if cut == _LEVELS:  # p within 1/131072 of 1: everything dropped
        return x * 0.0
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)
    lanes = words.view(torch.int16)[: x.numel()].view(x.shape)
    # The comparison writes 0/1 straight into x's dtype: going through a bool tensor (`>=`, then `.to`) cost 4x
    # as much (12 against 47 us on [32, 34, 32]), the same values (issue #18, benchmarks/README.md round 6).
    keep = torch.ge(lanes, cut - _LEVELS // 2, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))
    return x * keep.mul_(_LEVELS / (_LEVELS - cut))


class Dropout(nn.Module):
    """`nn.Dropout` with `dropout`'s cheaper CPU mask (same `p` attribute, no parameters or state)."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


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
        self.dropout = Dropout(dropout)

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
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """-> (output [B, Q, D], weights [B, H, Q, K] or None when `need_weights` is False)."""
        source = x if memory is None else memory
        q, k, v = self._split(self.q(x)), self._split(self.k(source)), self._split(self.v(source))
        if rotary is not None:
            q, k = rotary(q, q_pos), rotary(k, k_pos)
        hidden = hidden_keys(key_mask, q.shape[-2], causal)
        if need_weights or (self.training and self.dropout.p > 0 and q.device.type == "cpu"):
            context, weights = self._explicit(q, k, v, hidden)
        else:
            context, weights = self._fused(q, k, v, hidden), None
        context = context.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.out(context), (weights if need_weights else None)

    def _explicit(self, q: Tensor, k: Tensor, v: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """Scores written out: the weights [B, H, Q, K] can be returned (exported attention), and training on
        CPU drops them with `dropout`'s cheap mask (torch's fused CPU kernels have no dropout: with dropout_p > 0
        scaled_dot_product_attention falls back to an unfused path with a Bernoulli mask)."""
        # The scale on q ([B, H, Q, Dh]) rather than on the scores, and the mask added rather than filled in: two
        # passes over [B, H, Q, K] fewer, 1.5-2x faster on CPU (issue #18, benchmarks/README.md round 4).
        # finfo.min + a score rounds to finfo.min, so hidden keys get weight 0 and a fully hidden row (a padding
        # query) gives uniform weights, not NaN, as in the fused path.
        scores = ((q * self.head_dim ** -0.5) @ k.transpose(-2, -1)).float() + additive_mask(hidden, torch.float32)
        weights = scores.softmax(dim=-1)  # [B, H, Q, K]; softmax in fp32 even under bf16 autocast
        return self.dropout(weights).to(v.dtype) @ v, weights

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, hidden: Tensor) -> Tensor:
        """torch's fused scaled_dot_product_attention: the same maths (same finfo.min additive mask, so a
        fully hidden row is uniform too), no [B, H, Q, K] weights kept for backward."""
        bias = additive_mask(hidden, q.dtype)
        p = self.dropout.p if self.training else 0.0
        if q.is_cuda:
            with sdpa_kernel(CUDA_SDPA_BACKENDS):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p)


def additive_mask(hidden: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where a position counts, finfo(dtype).min where `hidden` is True: added to scores before a softmax
    (finfo.min, not -inf, so a fully hidden row gives uniform weights instead of NaN)."""
    return torch.zeros(hidden.shape, dtype=dtype, device=hidden.device).masked_fill(hidden, torch.finfo(dtype).min)


def hidden_keys(key_mask: Tensor, n_queries: int, causal: bool) -> Tensor:
    """True where a query must not see a key: padding keys [B, 1, 1, K], plus future keys [B, 1, Q, K] if causal."""
    hidden = ~key_mask[:, None, None, :]
    if causal:
        future = torch.ones(n_queries, key_mask.shape[1], dtype=torch.bool, device=key_mask.device).triu(1)
        hidden = hidden | future
    return hidden


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), Dropout(dropout), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class EncoderLayer(nn.Module):
    """Pre-LayerNorm block (stabler than post-LN for small, briefly trained models): x + attn, x + ffn.
    `attention_dropout` (on the attention weights) defaults to `dropout`."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 attention_dropout: float | None = None) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout if attention_dropout is None else attention_dropout)
        self.norm_ff = nn.LayerNorm(d_model)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor, rotary: nn.Module | None = None,
                positions: Tensor | None = None, need_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        attended, weights = self.attn(self.norm_attn(x), mask, rotary=rotary, q_pos=positions, k_pos=positions,
                                      need_weights=need_weights)
        x = x + self.dropout(attended)
        x = x + self.dropout(self.ff(self.norm_ff(x)))
        return x, weights


class Encoder(nn.Module):
    """A stack of encoder layers with a final LayerNorm; returns states and one weight tensor per layer."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_layers: int, dropout: float,
                 attention_dropout: float | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, dropout, attention_dropout)
                                    for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mask: Tensor, rotary: nn.Module | None = None,
                positions: Tensor | None = None, need_weights: bool = True) -> tuple[Tensor, tuple[Tensor, ...]]:
        """-> (states, one weight tensor per layer; () when `need_weights` is False: the fused path)."""
        weights = []
        for layer in self.layers:
            x, w = layer(x, mask, rotary=rotary, positions=positions, need_weights=need_weights)
            if w is not None:
                weights.append(w)
        return self.norm(x), tuple(weights)


def masked_mean(states: Tensor, mask: Tensor) -> Tensor:
    """Mean of `states` [B, L, D] over positions where `mask` [B, L] is True."""
    weights = mask.to(states.dtype).unsqueeze(-1)
    return (states * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def classification_loss(logits: Tensor, labels: Tensor, *, binary: bool, weights: Tensor | None = None) -> Tensor:
    """Softmax CE for class ids (optionally class-weighted), BCE-with-logits for one binary logit."""
    if binary:
        return F.binary_cross_entropy_with_logits(logits.squeeze(-1), labels.float())
    return F.cross_entropy(logits, labels.long(), weight=weights)


def multilabel_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """BCE-with-logits over every label (multi-label) or the single readmission logit (binary)."""
    return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


# ----------------------------------------------------------------------------------------------- heads


class LabelAttentionPooling(nn.Module):
    """Label-wise attention pooling and output layer (CAML / LAAT) over several features' token states.

    For feature f and label a: weights = softmax over real tokens of <query[f, a], state> / sqrt(d),
    pooled[f, a] = weighted sum of states, logit_a = bias_a + sum_f <weight[f, a], pooled[f, a]>.

    Computed as logit_a = bias_a + sum_f sum_l weights[a, l] * <weight[f, a], state_l> (the same sum, reordered):
    two GEMMs per feature give every token's score and value for every label ([B, L, labels] each), and the
    softmax runs over the token axis, so no [B, labels, d] pooled tensor and no batched matmul are made (issue
    #18: 1.25x faster on CPU, benchmarks/archive/attention_kernels.py). Two GEMMs rather than one over the stacked
    [2 * labels, d] projection: no split of the product, whose backward copied the [B, L, 2 * labels] gradient
    back together (5-9% less head time; training at batch 32 gives the same weights bit for bit, and some
    evaluation shapes differ in the last float digits; round 6). `written_out` is the definition, for tests.
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
        in_place = not torch.is_grad_enabled()  # prediction: nothing to keep for a backward pass
        for i, (s, mask) in enumerate(zip(states, masks, strict=True)):
            scores = F.linear(s, (self.query[i] / math.sqrt(s.shape[-1])).to(s.dtype)).float()  # [B, L, labels]
            hidden = additive_mask(~mask, scores.dtype).unsqueeze(-1)  # [B, L, 1]
            if in_place:  # the same operations on the same operands, at most two [B, L, labels] tensors alive
                weights = scores.add_(hidden).softmax(dim=1)
                del scores
                logits = logits + weights.mul_(F.linear(s, self.weight[i].to(s.dtype)).float()).sum(1)
            else:
                values = F.linear(s, self.weight[i].to(s.dtype)).float()
                logits = logits + ((scores + hidden).softmax(dim=1) * values).sum(1)
        return logits

    def written_out(self, states: list[Tensor], masks: list[Tensor]) -> Tensor:
        """`forward` as defined: per label, attention-pool the states, then a dot product with the label's weight."""
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


def visit_embeddings(codes: Tensor, visit: Tensor, mask: Tensor, n_visits: int) -> Tensor:
    """Sum code embeddings [B, L, D] into their visits -> [B, n_visits, D] (padding codes add nothing)."""
    out = codes.new_zeros(codes.shape[0], n_visits, codes.shape[-1])
    index = visit.clamp(0, n_visits - 1).unsqueeze(-1).expand_as(codes)
    return out.scatter_add(1, index, codes * mask.unsqueeze(-1).to(codes.dtype))
