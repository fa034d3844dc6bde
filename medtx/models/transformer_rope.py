"""Transformer encoder with rotary position embedding (RoFormer, Su et al. 2021) for EHR visit histories.

Identical to medtx.models.transformer (per-feature encoders or one joint sequence, [CLS] + codes, the same pooling
options, copy gate and multi-label head: one implementation, inherited) except for how position enters: nothing is
added to the code embeddings; instead every
attention layer rotates each query and key by an angle proportional to its position (the visit's distance
from the current visit). The score q_m . k_n then depends on positions only through n - m, so the model
sees *how many visits apart* two codes are, not where the history started.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from medtx.models.registry import ModelSpec, register_model
from medtx.models.transformer import (
    CHECKPOINT_DEFAULTS,
    TransformerConfig,
    TransformerModel,
    history_builder,
)


@dataclass
class TransformerRoPEConfig(TransformerConfig):
    rope_base: float = 10000.0  # RoFormer's theta: wavelengths from 2*pi to 2*pi*base across the head dims


class RotaryEmbedding(nn.Module):
    """Rotates pairs of head dimensions (i, i + Dh/2) by position * frequency_i (the GPT-NeoX layout)."""

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """x [B, H, L, Dh], positions [B, L] -> x rotated, same shape and dtype."""
        angles = positions.float().unsqueeze(-1) * self.inv_freq  # [B, L, Dh/2]
        cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)  # broadcast over heads
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class TransformerRoPEModel(TransformerModel):
    """`TransformerModel` whose attention layers use rotary positions instead of added sinusoids."""

    config: TransformerRoPEConfig

    def _rotary(self) -> nn.Module | None:
        return RotaryEmbedding(self.config.d_model // self.config.n_heads, self.config.rope_base)


register_model(ModelSpec(
    name="transformer_rope", family="ehr", kinds=("multilabel", "binary"), config=TransformerRoPEConfig,
    build=history_builder(TransformerRoPEModel, TransformerRoPEConfig),
    task_defaults_of="transformer",  # the tasks' transformer defaults (e.g. the copy gate) hold for it too
    checkpoint_defaults=CHECKPOINT_DEFAULTS, rank=20,
))
