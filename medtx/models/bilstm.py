"""Bidirectional LSTM note classifier (book ch. 10) with additive attention pooling.

Token embeddings -> BiLSTM -> attention over time steps (one weight per token, so the dashboard can show
which words the model read) -> dropout -> linear. Multi-class (softmax CE) or binary (one logit, BCE).

Batch keys: `input_ids` [B, T] (0 = padding), `lengths` [B], optional `labels` ([B] class ids or [B] 0/1),
optional `tokens` (list of token strings per sample, for attention labels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from medtx.models.base import ModelOutput
from medtx.models.bounds import DropoutRate, Length, Width
from medtx.models.layers import Dropout, classification_loss
from medtx.models.recurrent import run_recurrent
from medtx.models.registry import ModelSpec, ModelContext, TextModelBundle, register_model


@dataclass
class BiLSTMConfig:
    vocab_size: int
    n_outputs: int  # classes (multi-class) or 1 (binary)
    embed_dim: int = 128  # small: MTSamples has ~1.6k training notes
    hidden_dim: int = 128  # per direction
    num_layers: int = 1
    dropout: float = 0.3
    pad_id: int = 0
    binary: bool = False  # one sigmoid logit instead of softmax over classes


class AttentionPool(nn.Module):
    """Additive (Bahdanau) attention over time: one softmax weight per non-padding step."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.score = nn.Linear(dim, 1, bias=False)

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        scores = self.score(torch.tanh(self.proj(states))).squeeze(-1)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return torch.einsum("bt,btd->bd", weights, states), weights


class BiLSTMClassifier(nn.Module):
    def __init__(self, config: BiLSTMConfig, class_weights: Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=config.pad_id)
        self.lstm = nn.LSTM(
            config.embed_dim,
            config.hidden_dim,
            num_layers=config.num_layers,
            batch_first=True,
            bidirectional=True,
            dropout=config.dropout if config.num_layers > 1 else 0.0,
        )
        self.pool = AttentionPool(2 * config.hidden_dim)
        self.dropout = Dropout(config.dropout)
        self.head = nn.Linear(2 * config.hidden_dim, config.n_outputs)
        self.register_buffer("class_weights", class_weights, persistent=False)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        ids, lengths = batch["input_ids"], batch["lengths"]
        embedded = self.dropout(self.embed(ids))
        states = run_recurrent(self.lstm, embedded, lengths)  # zeros after each note's end
        mask = ids != self.config.pad_id
        mask[:, 0] = True  # an empty note still attends somewhere instead of producing NaN
        pooled, weights = self.pool(states, mask)
        logits = self.head(self.dropout(pooled))
        loss = None
        if "labels" in batch:
            loss = classification_loss(logits, batch["labels"], binary=self.config.binary, weights=self.class_weights)
        if not output_attentions:
            return ModelOutput(logits=logits, loss=loss)
        tokens = batch.get("tokens") or [[str(i) for i in row.tolist()] for row in ids]
        return ModelOutput(
            logits=logits,
            loss=loss,
            attentions={"bilstm": (weights[:, None, None, :],)},  # [B, 1 head, 1 query, T keys]
            attention_tokens={"bilstm": ([["[NOTE]"] for _ in tokens], [list(t) for t in tokens])},
        )


@dataclass
class BiLSTMTextConfig:
    """The settings a BiLSTM text run reads (flat override keys; bounds checked at config load)."""

    bilstm_max_len: Length = 512  # head truncation to the first bilstm_max_len tokens
    embed_dim: Width = 128
    hidden_dim: Width = 128
    dropout: DropoutRate = 0.3


def build(ctx: ModelContext) -> TextModelBundle:
    """A WordPiece tokenizer trained on the training notes, and the BiLSTM over its ids."""
    cfg = ctx.config(BiLSTMTextConfig)
    tokenizer = ctx.tools.train_tokenizer(ctx.train_texts)
    net = BiLSTMClassifier(
        BiLSTMConfig(vocab_size=len(tokenizer), n_outputs=ctx.n_outputs, embed_dim=cfg.embed_dim,
                     hidden_dim=cfg.hidden_dim, dropout=cfg.dropout, binary=ctx.binary),
        class_weights=ctx.class_weights,
    )

    def make_collate(with_tokens: bool = False):
        return ctx.tools.sequence_collate(tokenizer, max_len=cfg.bilstm_max_len, with_tokens=with_tokens)

    return TextModelBundle(tokenizer, net, make_collate)


# Trainer defaults for this model (flat keys of the text run's settings).
register_model(ModelSpec(name="bilstm", family="text", kinds=("multiclass", "binary"), config=BiLSTMConfig,
                         build=build, settings=(BiLSTMTextConfig,),
                         defaults={"lr": 2e-3, "batch_size": 32, "epochs": 15}, rank=30))
