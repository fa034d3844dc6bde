"""Where drug_rec's transformer training step goes: batch, forward (encoders / label head / copy gate / loss),
backward, optimizer step, validation per epoch; then the padding share, the aten ops per step, an upper bound for
batching the three feature encoders into one (`--stacked`), and the step time fitted against padded tokens, with
what no padding at all would give (`--padding-cost`).

A map for optimisation work (issue #18), not a ratio: run it before and after a change. The cohort is built as
for benchmarks/train_vs_pyhealth.py (`medtx synth mimic3`, `ingest mimic3`, `map-codes`, `build-samples --task
drug_rec`).

    .venv/bin/python benchmarks/archive/train_step_phases.py --db W.duckdb --dataset synth_10000 [--threads 1] [--epochs 3] \\
        [--stacked] [--padding-cost] [--set joint_sequence=False]

Since round 7 (2026-11-25) drug_rec's transformer reads one joint sequence with one encoder, so the encoder parts
and the padding shares print for `codes`; `--set joint_sequence=False` profiles the per-feature layout.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.archive.drug_rec_setup import encoded_drug_rec  # noqa: E402
from medtx.models.layers import multilabel_loss  # noqa: E402
from medtx.tasks import get_task  # noqa: E402
from medtx.training.ehr_evaluation import validation_score  # noqa: E402
from medtx.training.experiment import task_train_defaults  # noqa: E402
from medtx.training.trainer import TrainConfig, _batches, _validate, make_optimizer  # noqa: E402


def _forward_parts(model, batches: list[dict]) -> dict[str, float]:
    """Mean ms per forward pass of each part of TransformerModel.forward (training mode)."""
    totals = {"encoders": 0.0, "label head": 0.0, "copy gate": 0.0, "loss": 0.0}
    for b in batches:
        t0 = time.perf_counter()
        states, masks = [], []
        for f, encoder in model.encoders.items():
            s, m, _ = encoder(b[f"{f}_ids"], b[f"{f}_visit"], b[f"{f}_nvisits"], b[f"{f}_mask"], need_weights=False)
            states.append(s)
            masks.append(m)
        t1 = time.perf_counter()
        logits = model.head([model.dropout(s) for s in states], masks)
        t2 = time.perf_counter()
        if model.copy is not None:
            logits = logits + model.copy(model.copy_presence(b))
        t3 = time.perf_counter()
        multilabel_loss(logits, b["labels"])
        t4 = time.perf_counter()
        for key, dt in zip(totals, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            totals[key] += dt
    return {k: 1000 * v / len(batches) for k, v in totals.items()}


def _stacked_against_separate(model, batches: list[dict], rounds: int = 5) -> dict[str, list[float]]:
    """ms per batch, forward + backward of the feature encoders: each over its own batch (as the model runs) against
    ONE encoder over the three batches stacked and padded to the longest feature. The stacked run shares one
    encoder's weights, so it is an upper bound for any batched-encoder rewrite (which would also stack weights)."""
    feats = list(model.encoders)
    shared = model.encoders[feats[0]]
    top = shared.embed.num_embeddings - 1

    def separate(b: dict) -> None:
        total = 0
        for f in feats:
            s, _, _ = model.encoders[f](b[f"{f}_ids"], b[f"{f}_visit"], b[f"{f}_nvisits"], b[f"{f}_mask"],
                                        need_weights=False)
            total = total + s.sum()
        total.backward()

    def stacked(b: dict) -> None:
        width = max(b[f"{f}_ids"].shape[1] for f in feats)

        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]))

        ids = torch.cat([pad(b[f"{f}_ids"].clamp(max=top)) for f in feats])
        visit = torch.cat([pad(b[f"{f}_visit"]) for f in feats])
        mask = torch.cat([pad(b[f"{f}_mask"]) for f in feats])
        s, _, _ = shared(ids, visit, torch.cat([b[f"{f}_nvisits"] for f in feats]), mask, need_weights=False)
        s.sum().backward()

    times: dict[str, list[float]] = {"separate": [], "stacked": []}
    for _ in range(rounds):  # interleaved
        for name, run in (("separate", separate), ("stacked", stacked)):
            started = time.perf_counter()
            for b in batches:
                run(b)
            times[name].append(1000 * (time.perf_counter() - started) / len(batches))
    model.zero_grad(set_to_none=True)
    return times


def _padding_cost(model, opt, train, batch_size: int, rounds: int = 2) -> None:
    """Fit ms per training step = fixed + per padded token, over plain shuffled and length-bucketed batches
    (interleaved rounds), and print what a batch without padding would cost: the most any padding work can give."""
    import numpy as np

    from medtx.models.encoded import bucket_pool, length_buckets, shuffled_batches

    feats = list(model.encoders)
    points: list[tuple[float, int, int]] = []  # (ms, padded tokens, real tokens) per full batch
    model.train()
    for r in range(rounds):
        for name in ("shuffled", "buckets"):
            g = torch.Generator().manual_seed(100 + r)
            order = (shuffled_batches(len(train), batch_size, g) if name == "shuffled"
                     else length_buckets(train.lengths, batch_size, g, bucket_pool(len(train), batch_size, 16)))
            mine = []
            for index in order:
                if len(index) < batch_size:
                    continue
                b = train.batch(index)
                t0 = time.perf_counter()
                out = model(b)
                opt.zero_grad(set_to_none=True)
                out.loss.backward()
                opt.step()
                mine.append((1000 * (time.perf_counter() - t0), sum(b[f"{f}_ids"].numel() for f in feats),
                             sum(int(b[f"{f}_mask"].sum()) for f in feats)))
            ms, padded, real = (float(np.mean([m[i] for m in mine])) for i in range(3))
            print(f"  round {r + 1} {name:9s}: {ms:5.1f} ms/step, {padded:5.0f} padded tokens per batch, "
                  f"{real / padded:.0%} real; load {os.getloadavg()[0]:.2f}")
            points += mine
    data = np.array(points)
    fixed, per_token = np.linalg.lstsq(np.c_[np.ones(len(data)), data[:, 1]], data[:, 0], rcond=None)[0]
    floor = fixed + per_token * data[:, 2].mean()
    print(f"  fit: ms/step = {fixed:.1f} + {1000 * per_token:.2f} per 1,000 padded tokens; no padding at all: "
          f"{floor:.1f} ms/step = {1000 * batch_size / floor:.0f} training samples/s before validation")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--dataset", default="synth_10000")
    ap.add_argument("--model", default="transformer")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--stacked", action="store_true", help="also time the three encoders stacked into one batch "
                    "(per-feature encoders only: `--set joint_sequence=False`)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="model override, a Python literal (e.g. joint_sequence=False: one encoder per feature)")
    ap.add_argument("--padding-cost", action="store_true",
                    help="also fit step time against padded tokens (shuffled and length-bucketed batches)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    overrides = {k: ast.literal_eval(v) for k, v in (item.split("=", 1) for item in args.set)}
    bundle, enc = encoded_drug_rec(args.db, args.dataset, args.model, overrides)
    cfg = TrainConfig(batch_size=args.batch_size, seed=42, monitor="pr_auc_samples", device="cpu", progress=False,
                      **task_train_defaults(get_task("drug_rec"), args.model))  # e.g. the transformer's length buckets
    model, cpu = bundle.model, torch.device("cpu")
    opt = make_optimizer(model, cfg, cpu)
    score = validation_score(get_task("drug_rec"))
    print(f"{args.model} on {args.dataset} drug_rec: {len(enc['train'])} training samples, batch {args.batch_size}, "
          f"{args.threads} thread(s), length_buckets {cfg.length_buckets}, load {os.getloadavg()[0]:.2f}")
    for epoch in range(1, args.epochs + 1):
        model.train()
        phases = {"batch": 0.0, "forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        started, steps = time.perf_counter(), 0
        batches = iter(_batches(enc["train"], bundle.collate, args.batch_size, True, epoch, cfg.length_buckets))
        while True:
            t0 = time.perf_counter()
            batch = next(batches, None)
            if batch is None:
                break
            t1 = time.perf_counter()
            out = model(batch)
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            t3 = time.perf_counter()
            opt.step()
            float(out.loss.detach())
            t4 = time.perf_counter()
            for key, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                phases[key] += dt
            steps += 1
        train_s = time.perf_counter() - started
        t0 = time.perf_counter()
        _validate(model, enc["val"], bundle.collate, cpu, cfg, score, None)
        val_s = time.perf_counter() - t0
        print(f"epoch {epoch}: {1000 * train_s / steps:.1f} ms/step ("
              + ", ".join(f"{k} {1000 * v / steps:.1f}" for k, v in phases.items())
              + f"); validation {val_s:.2f} s = {100 * val_s / (train_s + val_s):.0f}% of the epoch; "
              f"{len(enc['train']) / (train_s + val_s):.0f} training samples/s, validation included")

    batches = iter(_batches(enc["train"], bundle.collate, args.batch_size, True, 99, cfg.length_buckets))
    sample = [next(batches) for _ in range(min(50, len(enc["train"]) // args.batch_size))]
    model.train()
    if hasattr(model, "encoders") and hasattr(model, "head"):
        parts = _forward_parts(model, sample)
        print("forward parts, ms: " + ", ".join(f"{k} {v:.2f}" for k, v in parts.items()))
        real = {f: float(sum(b[f"{f}_mask"].float().mean() for b in sample) / len(sample)) for f in model.encoders}
        print("real share of padded positions: " + ", ".join(f"{f} {v:.0%}" for f, v in real.items()))
        if args.stacked and len(model.encoders) < 2:
            print("--stacked: this model has one encoder (drug_rec's joint sequence); nothing to stack. "
                  "`--set joint_sequence=False` times the per-feature layout.")
        elif args.stacked:
            import statistics

            times = _stacked_against_separate(model, sample[:40])
            print("encoders, forward + backward, ms per batch (5 interleaved rounds):")
            for name, values in times.items():
                print(f"  {name:9s} " + " ".join(f"{v:.1f}" for v in values) + f"  median {statistics.median(values):.1f}")
            print(f"  separate / stacked: {statistics.median(times['separate']) / statistics.median(times['stacked']):.2f}x")
    if args.padding_cost and hasattr(model, "encoders"):
        print("step time against padding:")
        _padding_cost(model, opt, enc["train"], args.batch_size)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for b in sample[:20]:
            out = model(b)
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"aten ops per step: {sum(e.count for e in events if e.key.startswith('aten::')) / 20:.0f}; "
          "largest self-CPU shares:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
        print(f"  {e.key[:60]:60s} {100 * e.self_cpu_time_total / total:5.1f}%  ({e.count / 20:.0f} calls/step)")


if __name__ == "__main__":
    main()
