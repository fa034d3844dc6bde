"""Training throughput (samples/s) and peak memory of every EHR model, on CPU here and on CUDA when present.

    .venv/bin/python benchmarks/train.py                       # all EHR models, auto device, prints a table
    .venv/bin/python benchmarks/train.py --device cpu --models transformer,gru --batches 20
    .venv/bin/python benchmarks/train.py --readme benchmarks/README.md   # also (re)write our README section

Each model runs in its own subprocess so its peak RSS (CPU) / `torch.cuda.max_memory_allocated` (GPU) is its
own. Input: a deterministic in-memory drug_rec cohort shaped like the synthetic one (history of 1-6 visits,
~12 diagnoses, ~4 procedures and ~14 ATC-3 drugs per visit; 1,500 / 500 / 150 codes). Timed: forward +
backward + AdamW step over `--batches` batches of `--batch-size` after 2 warm-up batches (train), and
forward-only probabilities (infer); `behrt_mlm` is BEHRT's masked-LM pre-training step (forward with its loss as
infer). Text-model rows come from `benchmarks/text_throughput.py` when present (`--no-text`: EHR rows only).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ("transformer", "transformer_rope", "behrt", "behrt_mlm", "rnn", "gru", "lstm", "retain", "seq2seq")
# behrt_mlm: BEHRT's masked-LM pre-training step (its MLM head over the encoder, fresh masks per batch); infer is
# its forward pass with the loss


def synthetic_drug_rec(n: int, seed: int = 0):
    """A drug_rec sample frame (samples.drug_rec columns) with realistic list sizes, plus its vocabularies."""
    import numpy as np
    import polars as pl

    rng = np.random.default_rng(seed)
    sizes = {"conditions": (1500, 12), "procedures": (500, 4), "drugs": (150, 14)}
    rows = []
    for i in range(n):
        n_visits = int(rng.integers(1, 7))
        visits = {f: [[f"{f[0]}{c}" for c in rng.choice(v, size=max(1, rng.poisson(k)), replace=False)]
                      for _ in range(n_visits)] for f, (v, k) in sizes.items()}
        rows.append({"subject_id": i, "hadm_id": i, "conditions": visits["conditions"],
                     "procedures": visits["procedures"], "drugs_hist": visits["drugs"][:-1] + [[]],
                     "drugs": visits["drugs"][-1]})
    frame = pl.DataFrame(rows)
    specials = ["<pad>", "<unk>"]
    vocab = {f: specials + [f"{f[0]}{c}" for c in range(v)] for f, (v, _) in sizes.items()}
    vocabs = {"conditions": vocab["conditions"], "procedures": vocab["procedures"], "drugs_hist": vocab["drugs"]}
    return frame, vocabs, vocab["drugs"]


def measure(model: str, device: str, n_batches: int, batch_size: int, seed: int = 0) -> dict:
    """Train/infer throughput and peak memory of one model (run inside a fresh worker process)."""
    import torch

    from medtx.models.registry import build_ehr_model
    from medtx.training.trainer import autocast_for, resolve_device, set_seed, to_device

    set_seed(seed)
    dev = resolve_device(device)
    frame, vocabs, labels = synthetic_drug_rec(batch_size * (n_batches + 2), seed)
    bundle = build_ehr_model("behrt" if model == "behrt_mlm" else model, "drug_rec", vocabs, labels)
    items = bundle.encode(frame)
    collate, net, infer = bundle.collate, bundle.model, bundle.predict_proba
    if model == "behrt_mlm":
        from medtx.training.pretrain import MLMCollator

        collate, net = MLMCollator(bundle.mlm.collate, bundle.mlm.config), bundle.mlm.make_model()
        infer = lambda mlm, batch: mlm(batch).loss  # noqa: E731
    batches = [collate(items[i: i + batch_size]) for i in range(0, len(items), batch_size)]
    n_params = sum(p.numel() for p in net.parameters())
    net = net.to(dev).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)

    def step(batch):
        with autocast_for(dev):
            out = net(to_device(batch, dev))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()

    for b in batches[:2]:
        step(b)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    started = time.perf_counter()
    for b in batches[2:]:
        step(b)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    train_s = time.perf_counter() - started
    net.eval()
    started = time.perf_counter()
    with torch.no_grad():
        for b in batches[2:]:
            with autocast_for(dev):
                infer(net, to_device(b, dev))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    infer_s = time.perf_counter() - started
    n = batch_size * n_batches
    peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"model": model, "device": str(dev), "params": n_params, "batch_size": batch_size,
            "train_samples_per_s": n / train_s, "infer_samples_per_s": n / infer_s,
            "peak_mb": peak / 2**20, "peak_kind": "cuda allocated" if dev.type == "cuda" else "process RSS"}


def run_worker(model: str, device: str, n_batches: int, batch_size: int, threads: int | None) -> dict:
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    cmd = [sys.executable, __file__, "--worker", model, "--device", device, "--batches", str(n_batches),
           "--batch-size", str(batch_size)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        return {"model": model, "device": device, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def text_rows(threads: int | None = None) -> list[dict]:
    """Rows from the text stage's benchmark, when it exists (same keys), with the same torch threads."""
    try:
        from benchmarks import text_throughput
    except ImportError:
        return []
    return list(getattr(text_throughput, "rows", lambda **_: [])(num_threads=threads))


def _rate(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def markdown(rows: list[dict]) -> str:
    lines = ["| model | device | params | batch | train samples/s | infer samples/s | peak MB (kind) |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['device']} | — | — | failed: {r['error']} | | |")
            continue
        lines.append(f"| {r['model']} | {r['device']} | {r.get('params', 0):,} | {r.get('batch_size', '')} | "
                     f"{_rate(r['train_samples_per_s'])} | {_rate(r['infer_samples_per_s'])} | "
                     f"{r['peak_mb']:.0f} ({r.get('peak_kind', '')}) |")
    return "\n".join(lines)


def write_section(path: Path, body: str, key: str) -> None:
    """Replace one section of a shared README between `<!-- BEGIN key -->` / `<!-- END key -->`, keeping the rest."""
    BEGIN, END = f"<!-- BEGIN {key} -->", f"<!-- END {key} -->"
    text = path.read_text() if path.exists() else ""
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="OMP/torch threads per worker (CPU)")
    ap.add_argument("--no-text", action="store_true", help="EHR rows only (skip text_throughput's rows)")
    ap.add_argument("--readme", type=Path, default=None, help="write the table into this README's train section")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.device, args.batches, args.batch_size)))
        return
    load_before = os.getloadavg()[0]
    rows = [run_worker(m, args.device, args.batches, args.batch_size, args.threads) for m in args.models.split(",")]
    rows += [] if args.no_text else text_rows(args.threads)
    table = markdown(rows)
    print(table)
    if args.readme:
        import torch

        on_gpu = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
        host = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
        if on_gpu:
            host += f", {torch.cuda.get_device_name(0)}"
        threads = f" --threads {args.threads}" if args.threads else ""
        body = (f"### EHR training throughput ({time.strftime('%Y-%m-%d')}, {host})\n\n"
                f"`benchmarks/train.py --device {args.device} --batches {args.batches} "
                f"--batch-size {args.batch_size}{threads}`, load average {load_before:.2f} at the start and "
                f"{os.getloadavg()[0]:.2f} at the end (the machine may be shared: rates at a higher load are lower "
                f"bounds).\n\n{table}\n")
        write_section(args.readme, body, "train-gpu" if on_gpu else "train-cpu")


if __name__ == "__main__":
    main()
