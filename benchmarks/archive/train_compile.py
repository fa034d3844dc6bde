"""Does `torch.compile` pay for EHR training on this machine? Eager against compiled, side by side (issue #18).

Trains drug_rec's `transformer` (its task defaults) for `--epochs` epochs of shuffled batches of 32 on a
warehouse's stored training split, with the trainer's own optimizer (fused AdamW) and gradient clipping, once
eagerly and once through `torch.compile(model, dynamic=True)` (batch lengths vary, so shapes are dynamic), each
in its own subprocess, alternating for `--rounds` rounds. Printed per run: the first step (compilation happens
there), the rest of the first epoch, the last epoch's samples/s; then the ratio of the steady-state samples/s
and the compile time against the training time it would have to save.

    .venv/bin/python benchmarks/archive/train_compile.py --db W.duckdb --dataset synth_10000 [--threads 2] [--epochs 3]

Validation is left out on both sides: this measures the training step only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def worker(db: str, dataset: str, threads: int, epochs: int, compiled: bool) -> dict:
    import torch

    from medtx.store.db import open_warehouse
    from medtx.models.encoded import EncodedSet
    from medtx.models.registry import build_ehr_model
    from medtx.tasks import get_task
    from medtx.training.experiment import load_ehr_samples
    from medtx.training.trainer import TrainConfig, make_optimizer, set_seed

    torch.set_num_threads(threads)
    with open_warehouse(db, read_only=True) as con:
        data = load_ehr_samples(con, dataset, get_task("drug_rec"), "transformer")
    set_seed(42)
    bundle = build_ehr_model("transformer", get_task("drug_rec"), data.vocabs, data.label_vocab, None)
    train = EncodedSet(bundle.encode(data.parts["train"]), bundle.collate)
    model = bundle.model.train()
    forward = torch.compile(model, dynamic=True) if compiled else model
    optimizer = make_optimizer(model, TrainConfig(), torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)

    def step(batch: dict) -> None:
        batch = {k: v for k, v in batch.items() if k != "tokens"}  # labels only for the export pass
        loss = forward(batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    result: dict = {}
    for epoch in range(epochs):
        batches = [train.batch(i) for i in torch.randperm(len(train), generator=generator).split(32)]
        started = time.perf_counter()
        if epoch == 0:
            step(batches[0])
            result["first_step_s"] = time.perf_counter() - started
            batches = batches[1:]
        for batch in batches:
            step(batch)
        seconds = time.perf_counter() - started
        result[f"epoch_{epoch}_s"] = seconds
        result["samples_per_s"] = len(train) / seconds
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--worker", choices=("eager", "compiled"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.db, args.dataset, args.threads, args.epochs, args.worker == "compiled")))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs: dict[str, list[dict]] = {"eager": [], "compiled": []}
    for round_no in range(1, args.rounds + 1):
        for kind in runs:
            out = subprocess.run([sys.executable, __file__, "--db", args.db, "--dataset", args.dataset,
                                  "--threads", str(args.threads), "--epochs", str(args.epochs), "--worker", kind],
                                 check=True, capture_output=True, text=True, env=env)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            runs[kind].append(r)
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            print(f"round {round_no} {kind:8s}: first step {r['first_step_s']:.1f} s, epoch 1 {r['epoch_0_s']:.1f} s, "
                  f"last epoch {r['samples_per_s']:.0f} samples/s (load {load})", flush=True)
    eager = sum(r["samples_per_s"] for r in runs["eager"]) / len(runs["eager"])
    compiled = sum(r["samples_per_s"] for r in runs["compiled"]) / len(runs["compiled"])
    extra = (sum(r["epoch_0_s"] for r in runs["compiled"]) - sum(r["epoch_0_s"] for r in runs["eager"])) / args.rounds
    print(f"\nsteady state: eager {eager:.0f}, compiled {compiled:.0f} samples/s; "
          f"compiled / eager = {compiled / eager:.2f}x")
    print(f"first epoch costs compiled {extra:.0f} s more than eager" + (
        "; the compiled steady state is not faster, so it never pays back" if compiled <= eager else
        f"; it pays back after {extra / (1 / eager - 1 / compiled) :.0f} training samples"))


if __name__ == "__main__":
    main()
