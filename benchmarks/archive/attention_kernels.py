"""The two attention costs of drug_rec's transformer on CPU, side by side (issue #18, round 3).

1. Self-attention per feature at d_model 32 with 1, 2 and 4 heads: torch's fused `scaled_dot_product_attention`
   (the training path with no attention dropout) and medtx's explicit path (scores, mask, softmax), forward +
   backward, on [32 samples, heads, 65 tokens, 32 / heads] with random padding.
2. BEHRT's attention with attention dropout (the explicit path on CPU), [32, 4 heads, 129 tokens, 16]: the scores
   divided by sqrt(d) and masked_fill'ed (before round 4) against q scaled and the mask added
   (`layers.MultiHeadAttention._explicit` now), forward + backward through softmax and the value product.
3. The label-attention head (`medtx.models.layers.LabelAttentionPooling`) for one feature, 118 labels, 50 tokens:
   its one-GEMM `forward` against its `written_out` definition (per-label pooling, then a dot product).

Each variant runs `--repeats` times in turn (interleaved), `--steps` steps each; printed: ms per step, best and
worst repeat.

    .venv/bin/python benchmarks/archive/attention_kernels.py [--threads 1] [--steps 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from medtx.models.layers import LabelAttentionPooling, additive_mask

BATCH, TOKENS, D_MODEL, LABELS, HEAD_TOKENS = 32, 65, 32, 118, 50


def _time(step: Callable[[], None], steps: int) -> float:
    for _ in range(5):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps * 1e3


def self_attention_steps(heads: int) -> dict[str, Callable[[], None]]:
    dim = D_MODEL // heads
    q, k, v = (torch.randn(BATCH, heads, TOKENS, dim, requires_grad=True) for _ in range(3))
    mask = torch.rand(BATCH, TOKENS) > 0.3
    mask[:, 0] = True
    hidden = ~mask[:, None, None, :]
    bias = torch.zeros(hidden.shape).masked_fill(hidden, torch.finfo(torch.float32).min)

    def fused() -> None:
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias).sum().backward()

    def explicit() -> None:
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dim)
        weights = scores.masked_fill(hidden, torch.finfo(torch.float32).min).softmax(-1)
        (weights @ v).sum().backward()

    return {f"self-attention, {heads} head(s), fused": fused, f"self-attention, {heads} head(s), explicit": explicit}


def explicit_steps() -> dict[str, Callable[[], None]]:
    """BEHRT's shape (d_model 64, 4 heads, 128 codes + [CLS]); the dropout itself is left out of both."""
    heads, dim, tokens = 4, 16, 129
    q, k, v = (torch.randn(BATCH, heads, tokens, dim, requires_grad=True) for _ in range(3))
    mask = torch.rand(BATCH, tokens) > 0.3
    mask[:, 0] = True
    hidden = ~mask[:, None, None, :]

    def filled() -> None:
        scores = ((q @ k.transpose(-2, -1)) / math.sqrt(dim)).float()
        scores = scores.masked_fill(hidden, torch.finfo(torch.float32).min)
        (scores.softmax(-1) @ v).sum().backward()

    def added() -> None:
        scores = ((q * dim ** -0.5) @ k.transpose(-2, -1)).float() + additive_mask(hidden, torch.float32)
        (scores.softmax(-1) @ v).sum().backward()

    return {"explicit, BEHRT shape, masked_fill (before)": filled, "explicit, BEHRT shape, added mask (now)": added}


def head_steps() -> dict[str, Callable[[], None]]:
    torch.manual_seed(0)
    head = LabelAttentionPooling(1, LABELS, D_MODEL)
    states = [torch.randn(BATCH, HEAD_TOKENS, D_MODEL, requires_grad=True)]
    masks = [torch.rand(BATCH, HEAD_TOKENS) > 0.3]
    masks[0][:, 0] = True
    return {"label attention, one GEMM (forward)": lambda: head(states, masks).sum().backward(),
            "label attention, written out": lambda: head.written_out(states, masks).sum().backward()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    steps: dict[str, Callable[[], None]] = {}
    for heads in (1, 2, 4):
        steps.update(self_attention_steps(heads))
    steps.update(explicit_steps())
    steps.update(head_steps())
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            times[name].append(_time(step, args.steps))
    print(f"{args.threads} thread(s), {args.steps} steps x {args.repeats} repeats, forward + backward, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, ms in times.items():
        print(f"  {name:46s} {min(ms):7.3f} - {max(ms):7.3f} ms/step")
    four, one = min(times["self-attention, 4 head(s), fused"]), min(times["self-attention, 1 head(s), fused"])
    gemm, written = min(times["label attention, one GEMM (forward)"]), min(times["label attention, written out"])
    filled, added = (min(times[f"explicit, BEHRT shape, {name}"])
                     for name in ("masked_fill (before)", "added mask (now)"))
    print(f"fused self-attention, 4 heads / 1 head = {four / one:.2f}x; "
          f"label attention, written out / one GEMM = {written / gemm:.2f}x; "
          f"explicit attention, masked_fill / added mask = {filled / added:.2f}x")


if __name__ == "__main__":
    main()
