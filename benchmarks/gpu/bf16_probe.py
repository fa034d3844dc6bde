"""Why is bf16 autocast slower than fp32 for the transformers in the GPU sweep (benchmarks/README.md, first GPU run)?

    bash benchmarks/gpu/run.sh ...   # installs the carried wheels; then, on the GPU machine:
    PYTHONPATH=/tmp/medtx-site python3 benchmarks/gpu/bf16_probe.py --out $OUT

Times one model's training steps on synthetic drug_rec batches (benchmarks/train.py's data) in fp32 and in bf16
autocast, with torch.profiler, and prints the top operators by CUDA and CPU time of each; then bf16 again with the
fused attention kernels switched off one at a time (flash, memory-efficient), to see which path is slow.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def steps(model: str, batch_size: int, n: int, precision: str, sdp: str = "all", device: str = "cuda") -> tuple[float, str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks import train as tb
    from medtx.models.registry import build_ehr_model
    from medtx.tasks import get_task
    from medtx.training.trainer import to_device

    torch.manual_seed(0)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    frame, vocabs, labels = tb.synthetic_drug_rec(batch_size * (n + 2), 0)
    bundle = build_ehr_model(model, get_task("drug_rec"), vocabs, labels)
    items = bundle.encode(frame)
    batches = [to_device(bundle.collate(items[i: i + batch_size]), dev) for i in range(0, len(items), batch_size)]
    net = bundle.model.to(dev).train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    ctx = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if precision == "bf16" else None
    kernels = {"all": {}, "no_flash": {"enable_flash": False}, "no_mem_efficient": {"enable_mem_efficient": False},
               "math_only": {"enable_flash": False, "enable_mem_efficient": False}}[sdp]

    def step(b):
        if ctx is None:
            out = net(b)
        else:
            with ctx():
                out = net(b)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()

    with torch.backends.cuda.sdp_kernel(**kernels) if kernels and cuda else _null():
        for b in batches[:2]:
            step(b)
        sync()
        started = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
            for b in batches[2:]:
                step(b)
            sync()
        seconds = time.perf_counter() - started
    table = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=12, max_name_column_width=60)
    cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8, max_name_column_width=60)
    return batch_size * n / seconds, table + "\n" + cpu


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu-out"))
    ap.add_argument("--models", default="transformer,gru")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (args.out / "bf16_probe.txt").open("w") as log:
        for model in args.models.split(","):
            for precision, sdp in (("fp32", "all"), ("bf16", "all"), ("bf16", "no_flash"), ("bf16", "no_mem_efficient"),
                                   ("bf16", "math_only"), ("fp32", "math_only")):
                try:
                    rate, table = steps(model, args.batch_size, args.batches, precision, sdp, args.device)
                except Exception as exc:  # a kernel switched off that the model needs: say so, go on
                    rate, table = float("nan"), f"{type(exc).__name__}: {exc}"
                rows.append({"model": model, "precision": precision, "sdp": sdp, "train_samples_per_s": round(rate)})
                print(json.dumps(rows[-1]), flush=True)
                log.write(f"=== {model} {precision} sdp={sdp}: {rate:,.0f} samples/s\n{table}\n")
    (args.out / "bf16_probe.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
