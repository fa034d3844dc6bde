"""Recurrent layers, packed against padded (issue #18): forward + backward time per batch, side by side.

    .venv/bin/python benchmarks/archive/recurrent_kernels.py [--threads 1] [--rounds 3] [--batch 32]

For each module shape (the EHR visit GRU / LSTM, the text BiLSTM) and sequence length T, runs
`medtx.models.recurrent.run_recurrent` over the same batch with `packed=True` (a PackedSequence: torch's generic
CPU path, what medtx used before) and `packed=False` (the padded batch on the fused kernel, the reverse
direction over each row reversed within its length; medtx's CPU path now), interleaved, `--rounds` times, and
prints the best ms per batch of each and packed / padded. Row lengths are drawn from 1..T (one row of T).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn

from medtx.models.recurrent import run_recurrent

SHAPES = (("GRU", 64, False), ("LSTM", 64, False), ("LSTM", 128, True))  # (cell, hidden = input, bidirectional)


def time_batch(rnn: nn.Module, x: torch.Tensor, lengths: torch.Tensor, packed: bool, steps: int) -> float:
    """Mean ms of forward + backward over `steps` repetitions."""
    started = time.perf_counter()
    for _ in range(steps):
        run_recurrent(rnn, x, lengths, packed=packed).sum().backward()
    return (time.perf_counter() - started) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lengths", default="3,8,32,128,512")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, load {os.getloadavg()[0]:.2f}")
    print(f"| module | T | packed ms | padded ms | packed / padded |\n|---|---:|---:|---:|---:|")
    for cell, hidden, bidirectional in SHAPES:
        rnn = getattr(nn, cell)(hidden, hidden, batch_first=True, bidirectional=bidirectional)
        name = f"{'Bi' if bidirectional else ''}{cell} {hidden}"
        for n_steps in (int(t) for t in args.lengths.split(",")):
            x = torch.randn(args.batch, n_steps, hidden, requires_grad=True)
            lengths = torch.randint(1, n_steps + 1, (args.batch,))
            lengths[0] = n_steps
            steps = max(2, 400 // n_steps)
            time_batch(rnn, x, lengths, False, 1)  # warm-up
            best = {True: float("inf"), False: float("inf")}
            for _ in range(args.rounds):
                for packed in (True, False):
                    best[packed] = min(best[packed], time_batch(rnn, x, lengths, packed, steps))
            print(f"| {name} | {n_steps} | {best[True]:.2f} | {best[False]:.2f} | {best[True] / best[False]:.2f}x |",
                  flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
