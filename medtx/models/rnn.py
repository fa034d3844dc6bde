"""RNN / GRU / LSTM baselines over visit sequences (PyHealth `RNN`, book ch. 10).

Per feature: each visit becomes the sum of its codes' embeddings (PyHealth's choice; a visit is a set),
a recurrent layer reads the visits oldest -> current, and its last hidden state is the feature's summary.
Summaries are concatenated -> dropout -> linear -> one logit per label. No attention: these models return
no attention weights (`attentions` is None).

Batch keys: the same as medtx.models.transformer (`f_ids`, `f_visit`, `f_nvisits`, `f_mask`, `labels`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence

from medtx.models.base import ModelOutput
from medtx.models.transformer import multilabel_loss

CELLS = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}


@dataclass
class RNNConfig:
    n_labels: int
    vocab_sizes: dict[str, int] = field(default_factory=dict)  # feature -> embedding rows
    features: tuple[str, ...] = ("conditions", "procedures", "drugs_hist")
    cell: str = "gru"  # rnn | gru | lstm
    d_model: int = 64  # code embedding size
    hidden: int = 64
    n_layers: int = 1
    dropout: float = 0.2
    max_visits: int = 20  # most recent visits kept
    max_codes: int = 128  # most recent codes kept per feature (shared codec with the Transformer)


def visit_embeddings(codes: Tensor, visit: Tensor, mask: Tensor, n_visits: int) -> Tensor:
    """Sum code embeddings [B, L, D] into their visits -> [B, n_visits, D] (padding codes add nothing)."""
    out = codes.new_zeros(codes.shape[0], n_visits, codes.shape[-1])
    index = visit.clamp(0, n_visits - 1).unsqueeze(-1).expand_as(codes)
    return out.scatter_add(1, index, codes * mask.unsqueeze(-1).to(codes.dtype))


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
        packed = pack_padded_sequence(visits.float(), nvisits.clamp(min=1).cpu(), batch_first=True,
                                      enforce_sorted=False)
        # Recurrent kernels run in fp32 even under CUDA bf16 autocast (cuDNN RNN bf16 support varies).
        with torch.autocast(device_type=ids.device.type, enabled=False):
            _, state = self.rnn(packed)
        if isinstance(state, tuple):  # LSTM returns (h, c)
            state = state[0]
        return state[-1]  # top layer's hidden state after each sequence's last real visit


class RNNModel(nn.Module):
    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        self.config = config
        self.encoders = nn.ModuleDict({f: VisitRNN(config.vocab_sizes[f], config) for f in config.features})
        self.dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(len(config.features) * config.hidden, config.n_labels)

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        pooled = [enc(batch[f"{f}_ids"], batch[f"{f}_visit"], batch[f"{f}_nvisits"], batch[f"{f}_mask"])
                  for f, enc in self.encoders.items()]
        logits = self.head(self.dropout(torch.cat(pooled, dim=-1)))
        loss = multilabel_loss(logits, batch["labels"]) if "labels" in batch else None
        return ModelOutput(logits=logits, loss=loss)  # recurrent models have no attention weights to return
