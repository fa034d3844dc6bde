"""Encoder–decoder Transformer ('Attention is all you need'; book fig. 8.3) with greedy and beam decoding.

Two classes:

- `Seq2SeqTransformer` — generic over token vocabularies; reuse it for any sequence-to-sequence task (the
  TEXT stage imports it word-level for FAQ answering). Batch keys: `src_ids` [B, S] (0 = pad), `src_mask`
  [B, S] (True = real token), `tgt_ids` [B, T] = `<bos> y1 ... yn <eos>` right-padded with `pad_id`;
  optional `src_tokens` / `tgt_tokens` (strings per sample, for attention labels). `forward` returns token
  logits [B, T-1, V] and the teacher-forced cross-entropy. Decode with `greedy_decode` / `beam_search`.
- `Seq2SeqForDrugRec` — drug_rec as translation: the visit's ICD-9 codes -> its ATC-3 codes
  (medtx.models.ehr_data.Seq2SeqCodec; target order = label-vocabulary order). To sit beside the other
  models' metrics it scores every label: **p(label) = 1 - prod_t (1 - p_t(label))** over the steps t of the
  greedy decode up to `<eos>` ("noisy-OR": the chance the decoder emits the label at some step along its
  own greedy path). Labels the greedy decode emits usually score high; the set metrics then apply the run's
  threshold like for any other model. In training mode `forward` scores labels from the teacher-forced steps
  (only the loss is used there); in eval mode from the greedy decode, so no true label leaks into a score.

Layers are pre-LayerNorm; the decoder's self-attention is causal; cross-attention reads the encoder output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medtx.models.base import ModelOutput
from medtx.models.bounds import BatchSize, DropoutRate, FFWidth, Heads, Layers, Length, Width, check_heads
from medtx.models.ehr_data import N_TARGET_SPECIALS, SEQ2SEQ_SOURCE, seq2seq_codec
from medtx.models.layers import Dropout, Encoder, FeedForward, MultiHeadAttention, SinusoidalPositions
from medtx.models.registry import (EHRModelBundle, FAQAnswerer, ModelContext, ModelSpec, make_config,
                                   register_model, sigmoid_proba)


@dataclass
class Seq2SeqConfig:
    src_vocab_size: int
    tgt_vocab_size: int  # including pad / bos / eos
    pad_id: int = 0  # padding id in both vocabularies
    bos_id: int = 1  # target start token
    eos_id: int = 2  # target end token
    # field types: bounds checked at config load (medtx.models.bounds)
    d_model: Width = 64
    n_heads: Heads = 4
    n_encoder_layers: Layers = 2
    n_decoder_layers: Layers = 2
    d_ff: FFWidth = 128
    dropout: DropoutRate = 0.1
    max_positions: Length = 512  # sinusoidal table size (source and target)
    max_decode_len: Length = 48  # generated tokens before giving up on <eos>
    beam_size: BatchSize = 1  # 1 = greedy; used by `generate_labels`
    max_src: Length = 96  # source tokens kept by the drug_rec codec
    max_tgt: Length = 48  # target tokens kept by the drug_rec codec (incl. <bos>/<eos>)

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)


class DecoderLayer(nn.Module):
    """Pre-LN: x + causal self-attention, x + cross-attention over the encoder output, x + feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.norm_self, self.self_attn = nn.LayerNorm(d_model), MultiHeadAttention(d_model, n_heads, dropout)
        self.norm_cross, self.cross_attn = nn.LayerNorm(d_model), MultiHeadAttention(d_model, n_heads, dropout)
        self.norm_ff, self.ff = nn.LayerNorm(d_model), FeedForward(d_model, d_ff, dropout)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, tgt_mask: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = True
                ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        attended, self_w = self.self_attn(self.norm_self(x), tgt_mask, causal=True, need_weights=need_weights)
        x = x + self.dropout(attended)
        attended, cross_w = self.cross_attn(self.norm_cross(x), src_mask, memory=memory, need_weights=need_weights)
        x = x + self.dropout(attended)
        x = x + self.dropout(self.ff(self.norm_ff(x)))
        return x, self_w, cross_w


class Seq2SeqTransformer(nn.Module):
    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        self.src_embed = nn.Embedding(config.src_vocab_size, d, padding_idx=config.pad_id)
        self.tgt_embed = nn.Embedding(config.tgt_vocab_size, d, padding_idx=config.pad_id)
        self.positions = SinusoidalPositions(d, config.max_positions)
        self.dropout = Dropout(config.dropout)
        self.encoder = Encoder(d, config.n_heads, config.d_ff, config.n_encoder_layers, config.dropout)
        self.decoder = nn.ModuleList(DecoderLayer(d, config.n_heads, config.d_ff, config.dropout)
                                     for _ in range(config.n_decoder_layers))
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, config.tgt_vocab_size)

    def _embed(self, table: nn.Embedding, ids: Tensor) -> Tensor:
        steps = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        return self.dropout(table(ids) * math.sqrt(self.config.d_model) + self.positions(steps))

    def encode(self, src_ids: Tensor, src_mask: Tensor, need_weights: bool = False
               ) -> tuple[Tensor, tuple[Tensor, ...]]:
        return self.encoder(self._embed(self.src_embed, src_ids), src_mask, need_weights=need_weights)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor, need_weights: bool = False
               ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Target prefix [B, T] -> next-token logits [B, T, V], per-layer self and cross attention (weights
        only with `need_weights`; empty tuples otherwise)."""
        x, tgt_mask = self._embed(self.tgt_embed, tgt_in), tgt_in != self.config.pad_id
        tgt_mask = tgt_mask | (torch.arange(tgt_in.shape[1], device=tgt_in.device) == 0)  # <bos> always real
        self_ws, cross_ws = [], []
        for layer in self.decoder:
            x, self_w, cross_w = layer(x, tgt_mask, memory, src_mask, need_weights)
            if need_weights:
                self_ws.append(self_w)
                cross_ws.append(cross_w)
        return self.out(self.norm(x)), tuple(self_ws), tuple(cross_ws)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        tgt = batch["tgt_ids"]
        memory, enc_w = self.encode(batch["src_ids"], batch["src_mask"], output_attentions)
        logits, self_w, cross_w = self.decode(tgt[:, :-1], memory, batch["src_mask"], output_attentions)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=self.config.pad_id)
        if not output_attentions:
            return ModelOutput(logits=logits, loss=loss)
        src_tok = batch.get("src_tokens") or [[str(i) for i in row.tolist()] for row in batch["src_ids"]]
        tgt_tok = batch.get("tgt_tokens") or [[str(i) for i in row.tolist()] for row in tgt]
        # Cut to real tokens: the trainer slices each sample's weights to the label lists' lengths.
        src_tok = [t[: int(m.sum())] for t, m in zip(src_tok, batch["src_mask"], strict=True)]
        tgt_tok = [t[: int((row != self.config.pad_id).sum()) - 1] or t[:1]
                   for t, row in zip(tgt_tok, tgt, strict=True)]  # decoder inputs: <bos> y1 ... yn
        return ModelOutput(logits=logits, loss=loss,
                           attentions={"encoder": enc_w, "decoder_self": self_w, "decoder_cross": cross_w},
                           attention_tokens={"encoder": (src_tok, src_tok), "decoder_self": (tgt_tok, tgt_tok),
                                             "decoder_cross": (tgt_tok, src_tok)})


# ----------------------------------------------------------------------------------------------- decoding


@dataclass
class Decoded:
    sequences: list[list[int]]  # generated ids per sample, without <bos> and <eos>
    step_probs: Tensor | None = None  # greedy only: [B, steps, V] next-token distributions, 0 after <eos>


def _strip(row: list[int], config: Seq2SeqConfig) -> list[int]:
    out = []
    for token in row:
        if token == config.eos_id:
            break
        if token not in (config.pad_id, config.bos_id):
            out.append(token)
    return out


@torch.no_grad()
def greedy_decode(model: Seq2SeqTransformer, src_ids: Tensor, src_mask: Tensor, max_len: int | None = None
                  ) -> Decoded:
    """Pick the most probable token at each step until every sequence has emitted <eos> (or max_len)."""
    cfg = model.config
    max_len = max_len or cfg.max_decode_len
    memory, _ = model.encode(src_ids, src_mask)
    ys = torch.full((src_ids.shape[0], 1), cfg.bos_id, dtype=torch.long, device=src_ids.device)
    finished = torch.zeros(src_ids.shape[0], dtype=torch.bool, device=src_ids.device)
    step_probs = []
    for _ in range(max_len):
        probs = model.decode(ys, memory, src_mask)[0][:, -1].float().softmax(-1)
        step_probs.append(probs.masked_fill(finished.unsqueeze(1), 0.0))
        token = probs.argmax(-1).masked_fill(finished, cfg.pad_id)
        ys = torch.cat([ys, token.unsqueeze(1)], dim=1)
        finished |= token == cfg.eos_id
        if finished.all():
            break
    return Decoded([_strip(row, cfg) for row in ys[:, 1:].tolist()], torch.stack(step_probs, dim=1))


@torch.no_grad()
def beam_search(model: Seq2SeqTransformer, src_ids: Tensor, src_mask: Tensor, beam_size: int = 4,
                max_len: int | None = None, length_penalty: float = 0.0) -> Decoded:
    """Keep the `beam_size` best prefixes by total log-probability; a finished beam only extends with padding
    at no cost. The winner maximises score / length**length_penalty (0 = raw log-probability)."""
    cfg = model.config
    max_len = max_len or cfg.max_decode_len
    batch, device = src_ids.shape[0], src_ids.device
    memory, _ = model.encode(src_ids, src_mask)
    memory = memory.repeat_interleave(beam_size, dim=0)
    src_mask = src_mask.repeat_interleave(beam_size, dim=0)
    ys = torch.full((batch * beam_size, 1), cfg.bos_id, dtype=torch.long, device=device)
    scores = torch.full((batch, beam_size), -math.inf, device=device)
    scores[:, 0] = 0.0  # all beams start identical: let only the first one expand at step 1
    finished = torch.zeros(batch * beam_size, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch * beam_size, device=device)
    for _ in range(max_len):
        logp = model.decode(ys, memory, src_mask)[0][:, -1].float().log_softmax(-1)
        logp[finished] = -math.inf
        logp[finished, cfg.pad_id] = 0.0
        vocab = logp.shape[-1]
        candidates = (scores.unsqueeze(-1) + logp.view(batch, beam_size, vocab)).view(batch, -1)
        scores, flat = candidates.topk(beam_size, dim=-1)
        origin = (flat // vocab + torch.arange(batch, device=device).unsqueeze(1) * beam_size).flatten()
        token = (flat % vocab).flatten()
        ys = torch.cat([ys[origin], token.unsqueeze(1)], dim=1)
        lengths = lengths[origin] + (~finished[origin]).float()
        finished = finished[origin] | (token == cfg.eos_id)
        if finished.all():
            break
    normalised = scores / lengths.view(batch, beam_size).clamp(min=1.0) ** length_penalty
    best = normalised.argmax(-1) + torch.arange(batch, device=device) * beam_size
    return Decoded([_strip(row, cfg) for row in ys[best, 1:].tolist()])


# ----------------------------------------------------------------------------------------------- drug_rec


def noisy_or(step_probs: Tensor, n_labels: int) -> Tensor:
    """[B, T, V] per-step distributions -> [B, n_labels]: 1 - prod_t (1 - p_t(label)) (labels at V >= 3)."""
    label_probs = step_probs[..., N_TARGET_SPECIALS: N_TARGET_SPECIALS + n_labels].float()
    return 1.0 - torch.exp(torch.log1p(-label_probs.clamp(max=1.0 - 1e-6)).sum(1))


class Seq2SeqForDrugRec(nn.Module):
    """`Seq2SeqTransformer` for ICD -> ATC-3 generation with per-label scores (see module docstring)."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        self.seq2seq = Seq2SeqTransformer(config)
        self.n_labels = config.tgt_vocab_size - N_TARGET_SPECIALS

    def label_probs(self, batch: dict) -> Tensor:
        """Eval-time scores: noisy-OR over the greedy decode's steps."""
        decoded = greedy_decode(self.seq2seq, batch["src_ids"], batch["src_mask"])
        return noisy_or(decoded.step_probs, self.n_labels)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        out = self.seq2seq(batch, output_attentions=output_attentions)
        if self.training:  # teacher-forced scores, cheap; only the loss drives training
            valid = (batch["tgt_ids"][:, 1:] != self.config.pad_id).unsqueeze(-1)
            probs = noisy_or(out.logits.float().softmax(-1) * valid, self.n_labels)
        else:
            probs = self.label_probs(batch)
        out.logits = torch.logit(probs.clamp(1e-6, 1 - 1e-6))
        return out

    def generate(self, batch: dict, label_names: list[str]) -> list[list[str]]:
        """Decoded ATC-3 sequences (greedy, or beam search when config.beam_size > 1)."""
        if self.config.beam_size > 1:
            decoded = beam_search(self.seq2seq, batch["src_ids"], batch["src_mask"], self.config.beam_size)
        else:
            decoded = greedy_decode(self.seq2seq, batch["src_ids"], batch["src_mask"])
        return [[label_names[t - N_TARGET_SPECIALS] for t in row if t >= N_TARGET_SPECIALS]
                for row in decoded.sequences]


# ----------------------------------------------------------------------------------------------- registry


def build(ctx: ModelContext) -> EHRModelBundle:
    """ICD -> ATC-3 generation: the visit's diagnoses and procedures in, its label set out."""
    labels = ctx.labels
    index = seq2seq_codec(ctx.task, ctx.vocabs, labels, 1, 1).index
    fixed = {"src_vocab_size": len(index), "tgt_vocab_size": N_TARGET_SPECIALS + len(labels)}
    config = make_config(Seq2SeqConfig, fixed, ctx.overrides)
    model = Seq2SeqForDrugRec(config)
    codec = seq2seq_codec(ctx.task, ctx.vocabs, labels, config.max_src, config.max_tgt)

    def generate(m: nn.Module, batch: dict) -> list[list[str]]:
        return m.generate(batch, labels.names)

    # In eval mode Seq2SeqForDrugRec's logits already are the decoded label scores (noisy-OR over the
    # greedy decode), so the sigmoid default applies and the trainer decodes once per batch.
    return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba, label_names=labels.names,
                          generate=generate)


@dataclass
class Seq2SeqFAQConfig:
    """The settings the FAQ seq2seq reads: word windows and the encoder-decoder's size."""

    max_src: Length = 32  # question words kept
    max_answer: Length = 64  # answer words generated/trained (answers are cut here; F1 is against the full answer)
    d_model: Width = 64
    n_heads: Heads = 4
    layers: Layers = 2
    dropout: DropoutRate = 0.1

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)


def _faq_collate(items: list[dict]) -> dict:
    def pad(rows):
        out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out

    src = pad([it["src"] for it in items])
    # "labels" marks the batch as supervised for the trainer; the loss itself is on tgt_ids.
    return {"src_ids": src, "src_mask": src != 0, "tgt_ids": pad([it["tgt"] for it in items]),
            "labels": torch.zeros(len(items))}


def build_faq(ctx: ModelContext) -> FAQAnswerer:
    """One word-level encoder-decoder per fold, trained on the fold's pairs, greedy-decoding the answers.
    Word ids 0..3 are <pad> <bos> <eos> <unk> (the Seq2SeqConfig defaults; `FAQTools.word_vocab`)."""
    cfg = ctx.config(Seq2SeqFAQConfig)
    info: dict = {"best_epochs": [], "n_params": None, "train_seconds": 0.0}

    def answer(fold: int, questions: list[str], answers: list[str], queries: list[str], folder,
               on_epoch=None) -> list[str]:
        src, tgt = ctx.tools.word_vocab(questions), ctx.tools.word_vocab(answers)
        items = [{"src": src.ids(q, cfg.max_src) or [3], "tgt": [1, *tgt.ids(a, cfg.max_answer), 2]}
                 for q, a in zip(questions, answers, strict=True)]
        model = Seq2SeqTransformer(Seq2SeqConfig(
            src_vocab_size=len(src), tgt_vocab_size=len(tgt), d_model=cfg.d_model, n_heads=cfg.n_heads,
            n_encoder_layers=cfg.layers, n_decoder_layers=cfg.layers, d_ff=2 * cfg.d_model, dropout=cfg.dropout,
            max_decode_len=cfg.max_answer + 1, max_src=cfg.max_src, max_tgt=cfg.max_answer + 2,
        ))
        result = ctx.tools.train(model, items, _faq_collate, folder, on_epoch)
        device = ctx.tools.device
        model.to(device).eval()
        batch = _faq_collate([{"src": src.ids(q, cfg.max_src) or [3], "tgt": [1, 2]} for q in queries])
        decoded = greedy_decode(model, batch["src_ids"].to(device), batch["src_mask"].to(device))
        info["best_epochs"].append(result.best_epoch)
        info["train_seconds"] += result.train_seconds
        info["n_params"] = sum(p.numel() for p in model.parameters())
        return [tgt.text(s) for s in decoded.sequences]

    return FAQAnswerer(answer, info)


# A multi-label task whose samples hold the visit's diagnoses and procedures (the source sequence).
register_model(ModelSpec(name="seq2seq", family="ehr", kinds=("multilabel",), config=Seq2SeqConfig, build=build,
                         source_features=SEQ2SEQ_SOURCE, rank=70))
# The same encoder-decoder word-level for FAQ answering (trained by medtx.training.runners.faq).
register_model(ModelSpec(name="seq2seq", family="faq", kinds=("generation",), config=Seq2SeqConfig, rank=10,
                         build=build_faq, settings=(Seq2SeqFAQConfig,)))
