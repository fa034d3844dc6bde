"""RETAIN (Choi et al. 2016, "RETAIN: An Interpretable Predictive Model for Healthcare using Reverse Time
Attention Mechanism", NeurIPS): two GRUs read the visits from the most recent one back, one gives each
visit a weight (alpha, a softmax over visits), the other each visit's embedding dimensions a gate
(beta, tanh); the context is sum_i alpha_i * (beta_i . v_i) and a linear layer turns it into logits.

Visits: v_i = sum of the visit's code embeddings over every feature (conditions, procedures, drug history;
one embedding table per feature, the paper's W_emb x_i on the multi-hot visit). Reading in reverse time
lets the most recent visits set the weights. The model is linear in v given alpha and beta, so each code's
contribution to the logits is exact: omega_j = alpha_i * W (beta_i . e_j) for code j of visit i (paper,
section 3.3).

Attention export (the contract of medtx.models.base; the patient explorer reads it like any other model's):
- module "visits": alpha, [B, 1 head, 1 query, visits], key tokens `v<visit>` (v1 = oldest kept visit);
- module "codes": each code's share of the total absolute contribution sum over labels |omega_j|, normalised
  over the sample's codes, [B, 1, 1, codes], key tokens `v<visit>:<code>` feature by feature.
Both rows sum to 1. The code weights are RETAIN's interpretation of alpha and beta together, not a softmax.

Batch keys: the history codec's (medtx.models.ehr_data.HistoryCodec), as the Transformer and the RNNs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from medtx.models.base import ModelOutput
from medtx.models.bounds import DropoutRate, Length, Width
from medtx.models.ehr_data import history_codec
from medtx.models.layers import Dropout, initial_output_bias, multilabel_loss, visit_embeddings
from medtx.models.recurrent import real_steps, reverse_index, run_recurrent, time_gather
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
class RetainConfig:
    n_labels: int
    vocab_sizes: dict[str, int] = field(default_factory=dict)  # feature -> embedding rows
    features: tuple[str, ...] = ("conditions", "procedures", "drugs_hist")
    # field types: bounds checked at config load (medtx.models.bounds)
    d_model: Width = 64  # visit embedding size (the paper's m)
    hidden: Width = 64  # size of each GRU (the paper's p and q)
    dropout: DropoutRate = 0.2  # on the visit embeddings and on the context (the paper's two dropouts)
    max_visits: Length = 20  # most recent visits kept
    max_codes: Length = 128  # most recent codes kept per feature (the codec shared with the Transformer)


class RetainModel(nn.Module):
    def __init__(self, config: RetainConfig) -> None:
        super().__init__()
        missing = [f for f in config.features if f not in config.vocab_sizes]
        if missing:
            raise ValueError(f"RetainConfig.vocab_sizes has no size for feature(s) {missing}")
        self.config = config
        self.embed = nn.ModuleDict({f: nn.Embedding(config.vocab_sizes[f], config.d_model, padding_idx=0)
                                    for f in config.features})
        self.dropout = Dropout(config.dropout)
        self.gru_alpha = nn.GRU(config.d_model, config.hidden, batch_first=True)
        self.gru_beta = nn.GRU(config.d_model, config.hidden, batch_first=True)
        self.alpha = nn.Linear(config.hidden, 1)
        self.beta = nn.Linear(config.hidden, config.d_model)
        self.head = nn.Linear(config.d_model, config.n_labels)

    def _visits(self, batch: dict) -> tuple[Tensor, Tensor]:
        """Visit embeddings [B, T, D] (chronological) and the number of real visits [B]."""
        nvisits = batch[f"{self.config.features[0]}_nvisits"].clamp(min=1)
        n_steps = int(nvisits.max())
        v = sum(visit_embeddings(self.embed[f](batch[f"{f}_ids"]), batch[f"{f}_visit"], batch[f"{f}_mask"], n_steps)
                for f in self.config.features)
        return v, nvisits

    def attend(self, v: Tensor, nvisits: Tensor) -> tuple[Tensor, Tensor]:
        """alpha [B, T] (softmax over real visits) and beta [B, T, D], both in chronological order."""
        order = reverse_index(nvisits, v.shape[1])
        v_rev = time_gather(v, order)
        g, h = run_recurrent(self.gru_alpha, v_rev, nvisits), run_recurrent(self.gru_beta, v_rev, nvisits)
        hidden = ~real_steps(nvisits, v.shape[1])
        scores = self.alpha(g).squeeze(-1).float().masked_fill(hidden, torch.finfo(torch.float32).min)
        alpha_rev, beta_rev = scores.softmax(-1), torch.tanh(self.beta(h))
        alpha = alpha_rev.gather(1, order)  # reverse_index is its own inverse
        beta = time_gather(beta_rev, order)
        return alpha, beta

    def forward(self, batch: dict, output_attentions: bool = False) -> ModelOutput:
        v, nvisits = self._visits(batch)
        v = self.dropout(v)
        alpha, beta = self.attend(v, nvisits)
        context = (alpha.unsqueeze(-1) * beta * v).sum(1)
        logits = self.head(self.dropout(context))
        loss = multilabel_loss(logits, batch["labels"]) if "labels" in batch else None
        if not output_attentions:
            return ModelOutput(logits=logits, loss=loss)
        attentions, tokens = self._export(batch, alpha, beta)
        return ModelOutput(logits=logits, loss=loss, attentions=attentions, attention_tokens=tokens)

    def code_weights(self, batch: dict, alpha: Tensor, beta: Tensor) -> Tensor:
        """[B, codes] share of each code in sum_labels |omega_j| (features concatenated; padding 0)."""
        parts, masks = [], []
        for f in self.config.features:
            visit = batch[f"{f}_visit"].clamp(0, alpha.shape[1] - 1)
            a = alpha.gather(1, visit)  # [B, L] weight of each code's visit
            b = beta.gather(1, visit.unsqueeze(-1).expand(-1, -1, beta.shape[-1]))  # [B, L, D]
            omega = a.unsqueeze(-1) * (b * self.embed[f](batch[f"{f}_ids"])) @ self.head.weight.T  # [B, L, labels]
            parts.append(omega.abs().sum(-1).float())
            masks.append(batch[f"{f}_mask"])
        weights = torch.cat(parts, 1) * torch.cat(masks, 1)
        return weights / weights.sum(1, keepdim=True).clamp(min=1e-12)

    def _export(self, batch: dict, alpha: Tensor, beta: Tensor) -> tuple[dict, dict]:
        n = alpha.shape[0]
        nvisits = batch[f"{self.config.features[0]}_nvisits"].clamp(min=1).tolist()
        visit_tokens = [[f"v{i + 1}" for i in range(k)] for k in nvisits]
        code_tokens = [[t for f in self.config.features for t in batch["tokens"][f][i]] for i in range(n)]
        codes = self.code_weights(batch, alpha, beta)
        # each sample's real codes first: cat() put feature blocks with their padding side by side
        mask = torch.cat([batch[f"{f}_mask"] for f in self.config.features], 1)
        packed = torch.zeros_like(codes)
        for i in range(n):
            real = codes[i][mask[i]]
            packed[i, : real.shape[0]] = real
        attentions = {"visits": (alpha[:, None, None, :],), "codes": (packed[:, None, None, :],)}
        tokens = {"visits": ([["alpha"]] * n, visit_tokens), "codes": ([["contribution"]] * n, code_tokens)}
        return attentions, tokens

    @torch.no_grad()
    def init_from_train(self, batches: Iterable[dict]) -> None:
        """Output bias = each label's training log-odds: training starts at the label prior."""
        self.head.bias.copy_(initial_output_bias(batches, None, lambda batch: batch).to(self.head.bias.dtype))


def build(ctx: ModelContext) -> EHRModelBundle:
    sizes = {f: len(index) for f, index in history_codec(ctx.task, ctx.vocabs, ctx.labels, 1, 1).index.items()}
    fixed = {"n_labels": len(ctx.labels), "vocab_sizes": sizes, "features": ctx.task.samples.features}
    config = make_config(RetainConfig, fixed, ctx.overrides)
    model = RetainModel(config)
    codec = history_codec(ctx.task, ctx.vocabs, ctx.labels, config.max_visits, config.max_codes)
    return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba, label_names=ctx.labels.names,
                          init_from_train=chunked_init(model, codec.collate))


register_model(ModelSpec(name="retain", family="ehr", kinds=("multilabel", "binary"), config=RetainConfig,
                         build=build, rank=80))
