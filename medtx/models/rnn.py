"""RNN / GRU / LSTM baselines over visit sequences (PyHealth `RNN`, book ch. 10).

Per feature: each visit becomes the sum of its codes' embeddings (PyHealth's choice; a visit is a set),
a recurrent layer reads the visits oldest -> current, and its last hidden state is the feature's summary.
Summaries are concatenated -> dropout -> linear -> one logit per label. No attention: these models return
no attention weights (`attentions` is None).

The head starts at the label prior (`init_from_train`: output bias = each label's training log-odds), as the
Transformer's does. Without it the recurrent baselines started at p = 0.5 for every label and spent
the pipeline's 5 epochs pulling hundreds of biases down: next_visit GRU on synth_2000 ended at val PR-AUC 0.050,
under the most-frequent baseline (0.19), a straw man beside the Transformer (benchmarks/README.md, "A fair
start for the recurrent baselines").

Batch keys: the same as medtx.models.transformer (`f_ids`, `f_visit`, `f_nvisits`, `f_mask`, `labels`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from medtx.models.base import ModelOutput
from medtx.models.bounds import DropoutRate, Layers, Length, Width
from medtx.models.ehr_data import history_codec
from medtx.models.layers import Dropout, initial_output_bias, multilabel_loss, visit_embeddings
from medtx.models.recurrent import last_outputs, run_recurrent
from medtx.models.registry import (ModelContext, EHRModelBundle, ModelSpec, chunked_init, make_config, register_model,
                                   sigmoid_proba)

CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


@dataclass
class RNNConfig:
    n_labels: int
    vocab_sizes: dict[str, int] = field(default_factory=dict)  # feature -> embedding rows
    features: tuple[str, ...] = ("conditions", "procedures", "drugs_hist")
    cell: Literal["rnn", "gru", "lstm"] = "gru"  # field types: bounds checked at config load (medtx.models.bounds)
    d_model: Width = 64  # code embedding size
    hidden: Width = 64
    n_layers: Layers = 1
    dropout: DropoutRate = 0.2
    max_visits: Length = 20  # most recent visits kept
    max_codes: Length = 128  # most recent codes kept per feature (shared codec with the Transformer)


class VisitRNN(nn.Module):
    """One feature: code embeddings -> visit vectors -> recurrent layer -> last real visit's state."""

    def __init__(self, vocab_size: int, config: RNNConfig) -> None:
        super().__init__()
        if config.cell not in CELLS:
            raise ValueError(f"unknown RNN cell {config.cell!r}; expected one of {sorted(CELLS)}")
        self.embed = nn.Embedding(vocab_size, config.d_model, padding_idx=0)
        self.rnn = CELLS[config.cell](config.d_model, config.hidden, num_layers=config.n_layers, batch_first=True,
                                      dropout=config.dropout if config.n_layers > 1 else 0.0)

    def forward(self, ids: Tensor, visit: Tensor, nvisits: Tensor, mask: Tensor) -> Tensor:
        visits = visit_embeddings(self.embed(ids), visit, mask, int(nvisits.max()))
        # The top layer's hidden state after each sequence's last real visit (fp32, see medtx.models.recurrent).
        return last_outputs(run_recurrent(self.rnn, visits, nvisits), nvisits)


class RNNModel(nn.Module):
    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        self.config = config
        self.encoders = nn.ModuleDict({f: VisitRNN(config.vocab_sizes[f], config) for f in config.features})
        self.dropout = Dropout(config.dropout)
        self.head = nn.Linear(len(config.features) * config.hidden, config.n_labels)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        pooled = [enc(batch[f"{f}_ids"], batch[f"{f}_visit"], batch[f"{f}_nvisits"], batch[f"{f}_mask"])
                  for f, enc in self.encoders.items()]
        logits = self.head(self.dropout(torch.cat(pooled, dim=-1)))
        loss = multilabel_loss(logits, batch["labels"]) if "labels" in batch else None
        return ModelOutput(logits=logits, loss=loss)  # recurrent models have no attention weights to return

    @torch.no_grad()
    def init_from_train(self, batches: Iterable[dict]) -> None:
        """Output bias = each label's training log-odds: training starts at the label prior."""
        self.head.bias.copy_(initial_output_bias(batches, None, lambda batch: batch).to(self.head.bias.dtype))


def _builder(cell: str):
    def build(ctx: ModelContext) -> EHRModelBundle:
        sizes = {f: len(index) for f, index in history_codec(ctx.task, ctx.vocabs, ctx.labels, 1, 1).index.items()}
        fixed = {"n_labels": len(ctx.labels), "vocab_sizes": sizes, "features": ctx.task.samples.features, "cell": cell}
        config = make_config(RNNConfig, fixed, ctx.overrides)
        codec = history_codec(ctx.task, ctx.vocabs, ctx.labels, config.max_visits, config.max_codes)
        model = RNNModel(config)
        return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba,
                              label_names=ctx.labels.names, init_from_train=chunked_init(model, codec.collate))
    return build


for _rank, _cell in enumerate(CELLS):
    register_model(ModelSpec(name=_cell, family="ehr", kinds=("multilabel", "binary"), config=RNNConfig,
                             build=_builder(_cell), rank=40 + 10 * _rank))
