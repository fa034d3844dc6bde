"""Training throughput (samples/s) and peak memory of every EHR model, on CPU here and on CUDA when present.

    .venv/bin/python benchmarks/train.py                       # all EHR models, auto device, prints a table
    .venv/bin/python benchmarks/train.py --device cpu --models transformer,gru --batches 20
    .venv/bin/python benchmarks/train.py --notes benchmarks/notes/   # also write a dated notes file there
    python3 benchmarks/train.py --device cuda --batch-size 64,256,1024,4096 --precision fp32,bf16 --no-text

On a GPU, a list of batch sizes fills it: each model runs at each size in turn, largest last, and stops at its
first failure (out of memory is reported as such), so the table shows where samples/s levels off and what each
size holds on the card. `--precision auto` is what training uses (`autocast_for`: bf16 autocast on CUDA GPUs
that support it, fp32 elsewhere); `fp32` and `bf16` force one, so both can be compared in one run.

Each model runs in its own subprocess so its peak RSS (CPU) / `torch.cuda.max_memory_allocated` (GPU) is its
own. Input: a deterministic in-memory drug_rec cohort shaped like the synthetic one (history of 1-6 visits,
~12 diagnoses, ~4 procedures and ~14 ATC-3 drugs per visit; 1,500 / 500 / 150 codes). Timed: forward +
backward + AdamW step over `--batches` batches of `--batch-size` after 2 warm-up batches (train), and
forward-only probabilities (infer); `behrt_mlm` is BEHRT's masked-LM pre-training step (forward with its loss as
infer). Text-model rows come from `benchmarks/text_throughput.py` when present (`--no-text`: EHR rows only).
"""

from __future__ import annotations

import argparse
import contextlib
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
    import pyarrow as pa  # not polars: this runs on a GPU image that has pyarrow and torch only

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
    frame = pa.Table.from_pylist(rows)
    specials = ["<pad>", "<unk>"]
    vocab = {f: specials + [f"{f[0]}{c}" for c in range(v)] for f, (v, _) in sizes.items()}
    vocabs = {"conditions": vocab["conditions"], "procedures": vocab["procedures"], "drugs_hist": vocab["drugs"]}
    return frame, vocabs, vocab["drugs"]


PRECISIONS = ("auto", "fp32", "bf16")


def precision_context(dev, precision: str):
    """The autocast of one precision: 'auto' is training's own rule (`autocast_for`), 'fp32' none, 'bf16' bf16."""
    import torch

    from medtx.training.trainer import autocast_for

    if precision not in PRECISIONS:
        raise ValueError(f"--precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if precision == "auto":
        return autocast_for(dev)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)


def precision_name(dev, precision: str) -> str:
    """What 'auto' resolves to on this device, for the table: read off the autocast training would use."""
    import torch

    if precision != "auto":
        return precision
    context = precision_context(dev, precision)
    bf16 = isinstance(context, torch.autocast) and context.fast_dtype == torch.bfloat16
    return "bf16 (auto)" if bf16 else "fp32 (auto)"


def measure(model: str, device: str, n_batches: int, batch_size: int, seed: int = 0,
            precision: str = "auto") -> dict:
    """Train/infer throughput and peak memory of one model (run inside a fresh worker process)."""
    import torch

    from medtx.models.registry import build_ehr_model
    from medtx.tasks import get_task
    from medtx.training.trainer import resolve_device, set_seed, to_device

    set_seed(seed)
    dev = resolve_device(device)
    autocast = lambda: precision_context(dev, precision)  # noqa: E731
    frame, vocabs, labels = synthetic_drug_rec(batch_size * (n_batches + 2), seed)
    bundle = build_ehr_model("behrt" if model == "behrt_mlm" else model, get_task("drug_rec"), vocabs, labels)
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
        with autocast():
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
            with autocast():
                infer(net, to_device(b, dev))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    infer_s = time.perf_counter() - started
    n = batch_size * n_batches
    peak = (torch.cuda.max_memory_allocated(dev) if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"model": model, "device": str(dev), "params": n_params, "batch_size": batch_size,
            "precision": precision_name(dev, precision), "train_samples_per_s": n / train_s, "infer_samples_per_s": n / infer_s,
            "peak_mb": peak / 2**20, "peak_kind": "cuda allocated" if dev.type == "cuda" else "process RSS"}


def run_worker(model: str, device: str, n_batches: int, batch_size: int, threads: int | None,
               precision: str = "auto") -> dict:
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    cmd = [sys.executable, __file__, "--worker", model, "--device", device, "--batches", str(n_batches),
           "--batch-size", str(batch_size), "--precision", precision]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        error = f"out of memory at batch {batch_size}" if "out of memory" in out.stderr.lower() else last
        return {"model": model, "device": device, "batch_size": batch_size, "precision": precision, "error": error}
    return json.loads(out.stdout.strip().splitlines()[-1])


def sweep(model: str, device: str, n_batches: int, batch_sizes: list[int], threads: int | None,
          precision: str) -> list[dict]:
    """One model at each batch size, smallest first, stopping at its first failure (a larger size would fail too)."""
    rows = []
    for size in sorted(batch_sizes):
        rows.append(run_worker(model, device, n_batches, size, threads, precision))
        if "error" in rows[-1]:
            break
    return rows


def int_list(text: str) -> list[int]:
    """'64,256' -> [64, 256]; each value a positive integer."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def precision_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in PRECISIONS]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"--precision {text!r}: each of {', '.join(PRECISIONS)}")
    return values


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
    lines = ["| model | device | precision | params | batch | train samples/s | infer samples/s | peak MB (kind) |",
             "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['device']} | {r.get('precision', '')} | — | {r.get('batch_size', '—')} "
                         f"| failed: {r['error']} | | |")
            continue
        lines.append(f"| {r['model']} | {r['device']} | {r.get('precision', 'fp32')} | {r.get('params', 0):,} | "
                     f"{r.get('batch_size', '')} | "
                     f"{_rate(r['train_samples_per_s'])} | {_rate(r['infer_samples_per_s'])} | "
                     f"{r['peak_mb']:.0f} ({r.get('peak_kind', '')}) |")
    return "\n".join(lines)



def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--batch-size", type=int_list, default=[64],
                    help="one size, or several separated by commas (a sweep per model, e.g. 64,256,1024,4096)")
    ap.add_argument("--precision", type=precision_list, default=["auto"],
                    help="auto (training's rule), fp32, bf16, or several separated by commas")
    ap.add_argument("--threads", type=int, default=None, help="OMP/torch threads per worker (CPU)")
    ap.add_argument("--no-text", action="store_true", help="EHR rows only (skip text_throughput's rows)")
    ap.add_argument("--notes", type=Path, default=None,
                    help="write the table as a dated notes file into this folder (benchmarks/notes/; link it from "
                         "benchmarks/README.md's index)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.device, args.batches, args.batch_size[0],
                                 precision=args.precision[0])))
        return
    load_before = os.getloadavg()[0]
    rows = [row for m in args.models.split(",") for p in args.precision
            for row in sweep(m, args.device, args.batches, args.batch_size, args.threads, p)]
    rows += [] if args.no_text else text_rows(args.threads)
    table = markdown(rows)
    print(table)
    if args.notes:
        import torch

        on_gpu = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
        host = f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
        if on_gpu:
            host += f", {torch.cuda.get_device_name(0)}"
        threads = f" --threads {args.threads}" if args.threads else ""
        sizes = ",".join(map(str, args.batch_size))
        body = (f"### EHR training throughput ({time.strftime('%Y-%m-%d')}, {host})\n\n"
                f"`benchmarks/train.py --device {args.device} --batches {args.batches} "
                f"--batch-size {sizes} --precision {','.join(args.precision)}{threads}`, load average {load_before:.2f} at the start and "
                f"{os.getloadavg()[0]:.2f} at the end (the machine may be shared: rates at a higher load are lower "
                f"bounds).\n\n{table}\n")
        name = f"{time.strftime('%Y-%m-%d')}-train-throughput-{'gpu' if on_gpu else 'cpu'}.md"
        (args.notes / name).write_text(body.replace("### ", "# ", 1))
        print(f"wrote {args.notes / name}")


if __name__ == "__main__":
    main()
