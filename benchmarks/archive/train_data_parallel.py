"""Two data-parallel processes against one, for drug_rec's transformer on CPU (issue #18; a measurement, not a
medtx feature).

At drug_rec's model size the second core buys nothing through torch's intra-op threads (benchmarks/README.md,
round 3). This measures the other way to use it: two processes of 1 thread each, each taking half of every
batch of 32 (torch DistributedDataParallel over gloo, gradients averaged: the same batch-32 step), against one
process of 1 thread taking the whole batch. Same samples, same initial weights, same shuffled batches, the
trainer's own optimizer, gradient clipping and validation (on rank 0, every epoch, inside the timed epoch, as in
benchmarks/train_vs_pyhealth.py). Printed: samples/s of each, the ratio, and each one's best validation PR-AUC.
The two runs are alternated `--rounds` times.

    .venv/bin/python benchmarks/archive/train_data_parallel.py --db W.duckdb --dataset synth_10000 [--epochs 3] [--rounds 2]
        [--set key=value ...]

W holds drug_rec samples (see benchmarks/train_vs_pyhealth.py for building one).
"""

from __future__ import annotations

import argparse
import ast
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.archive.drug_rec_setup import encoded_drug_rec  # noqa: E402


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: dict) -> None:
    from medtx.models.encoded import shuffled_batches
    from medtx.tasks import get_task
    from medtx.training.ehr_evaluation import validation_score
    from medtx.training.trainer import TrainConfig, _validate, make_optimizer, set_seed

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    bundle, sets = encoded_drug_rec(args.db, args.dataset, overrides=args.overrides)
    model = bundle.model
    cfg = TrainConfig(batch_size=32, seed=42, monitor="pr_auc_samples", device="cpu", progress=False)
    optimizer = make_optimizer(model, cfg, torch.device("cpu"))
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 and not args.flat else model
    params = [p for p in model.parameters() if p.requires_grad]
    reduce_s = 0.0
    score, train = validation_score(get_task("drug_rec")), sets["train"]
    seconds, best = 0.0, float("-inf")
    for epoch in range(1, args.epochs + 1):
        set_seed(1000 * epoch + rank)  # dropout draws differ per rank, as in any data-parallel run
        batches = shuffled_batches(len(train), cfg.batch_size, torch.Generator().manual_seed(epoch))
        if world > 1:
            dist.barrier()
        started = time.perf_counter()
        model.train()
        for index in batches:
            part = index.chunk(world)[rank] if len(index) >= world else index
            loss = trained(train.batch(part)).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if world > 1 and args.flat:  # one all-reduce of every gradient, flattened, instead of DDP's hooks
                t = time.perf_counter()
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                dist.all_reduce(flat)
                flat /= world
                for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
                    p.grad.copy_(g.view_as(p))
                reduce_s += time.perf_counter() - t
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
        if rank == 0:
            metrics = _validate(model, sets["val"], bundle.collate, torch.device("cpu"), cfg, score, None)
            best = max(best, metrics["val_pr_auc_samples"])
        if world > 1:
            dist.barrier()
        seconds += time.perf_counter() - started
    if rank == 0:
        out.update(samples_per_s=len(train) * args.epochs / seconds, best_val=best, seconds=seconds, reduce_s=reduce_s)
    if world > 1:
        dist.destroy_process_group()


def run(world: int, args: argparse.Namespace) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(world, port, args, out), nprocs=world, join=True)
        return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--dataset", default="synth_10000")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--flat", action="store_true", help="all-reduce the flattened gradients by hand instead of DDP")
    ap.add_argument("--set", action="append", default=[], help="model override key=value (e.g. max_codes=32)")
    args = ap.parse_args()
    args.overrides = {k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in args.set)}
    print(f"drug_rec transformer, {args.dataset}, batch 32, {args.epochs} epochs, overrides {args.overrides}")
    results: dict[int, list[dict]] = {1: [], 2: []}
    for round_ in range(1, args.rounds + 1):
        for world in (1, 2):
            load = os.getloadavg()[0]
            r = run(world, args)
            results[world].append(r)
            print(f"round {round_}, {world} process(es) x 1 thread: {r['samples_per_s']:.0f} samples/s "
                  f"({r['seconds']:.1f} s, all-reduce {r.get('reduce_s', 0):.1f} s), "
                  f"best val PR-AUC {r['best_val']:.4f}, load {load:.2f}", flush=True)
    one = sorted(r["samples_per_s"] for r in results[1])
    two = sorted(r["samples_per_s"] for r in results[2])
    print(f"median: 1 process {one[len(one) // 2]:.0f}, 2 processes {two[len(two) // 2]:.0f} samples/s, "
          f"ratio {two[len(two) // 2] / one[len(one) // 2]:.2f}x; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
