"""The GPU run in one call: CUDA tests, a bf16/fp32 throughput sweep per EHR model, and full-scale trainings of
every neural family (EHR and text) from the packed training packages through `python -m medtx.worker`; results
into --out.

On the GPU machine (run.sh installs the carried wheels first, then calls this):

    bash benchmarks/gpu/run.sh                       # = run.py --payload benchmarks/gpu/payload --out $OUT --device cuda

Here, on CPU at small scale (what tests/test_gpu_bench.py runs):

    .venv/bin/python benchmarks/gpu/run.py --payload P --out O --device cpu --epochs 1 --families gru --budget-s 60

Phases, each with its share of `--budget-s` (default 540 s, under the device's 590 s timeout_s; the plan:
benchmarks/notes/2026-11-28-gpu-plan.md):
1. the tests marked `gpu` (every tests/ file with `pytest.mark.gpu`: test_cuda.py, test_training_trainer.py) in a
   subprocess;
2. the throughput sweep of benchmarks/train.py (`measure`: train + inference samples/s, peak memory) per attention
   model (the bf16 fix), precision and batch size, smallest size first, stopping a model at its first failure;
3. one run per (task package, family serving the task, seed in `--seeds`, default 0,1,2) and one per reference
   baseline serving the task (`--baselines`, seed 0, CPU): `--jobs` worker processes at once, each a
   `python -m medtx.worker --task <package's task>` with `--threads` CPU threads, seed by seed and longest first
   (EXPECTED_S); no new run starts after the budget, and a run still going at the hard stop is killed (a killed
   worker publishes nothing, so nothing half-written comes back). A text package (specialty on MTSamples; also
   readmission_notes when packed) trains each of `--text-families` (bert_scratch, bilstm, minilm) with
   `--text-overrides`;
4. the result packages, without checkpoints (they stay on the GPU machine), in at most 5 tar files of <= 12 MiB
   (the device tool returns at most 8 files of 16 MiB, 64 MiB in all): `benchmarks/gpu/record.py` records them here
   and prints each seed's paired verdict against the reference baseline and the claim the seeds support.
`report.json`, `report.md` and `logs.txt` say what ran, how long each phase took, and what did not run and why.

Precision: every training goes through medtx.training.trainer.fit, whose rule (`autocast_for`) is bf16 autocast
on a CUDA GPU that supports it and fp32 elsewhere; neither the EHR nor the text trainer has a setting to force
fp32, so on the GPU the trainings (EHR and text) run bf16 autocast, and fp32 against bf16 is compared in the
sweep (phase 2, EHR models). Each training row says the precision it ran at. Attention avoids cuDNN's kernel
under bf16 on CUDA (medtx's own and transformers' BERT: medtx.models.layers.fused_attention_kernels).

MiniLM trains from the payload's compact copy (benchmarks/gpu/pack.py: bf16 matrices, the packed notes' embedding
rows, zstd, sha256-checked; medtx.models.minilm_compact), named to the worker by MEDTX_MINILM_COMPACT; without one
a `minilm` in --text-families is reported as not run, with the reason.
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

# The attention models: the sweep re-takes bf16 against fp32 after the cuDNN attention fix (the recurrent ones were
# swept in the first GPU run, benchmarks/README.md; --sweep-models adds them).
SWEEP_MODELS = ("transformer", "transformer_rope", "behrt", "behrt_mlm", "seq2seq")
# The device tool returns at most 8 files of 16 MiB, 64 MiB in all: report.json, report.md, logs.txt and the tars.
TAR_LIMIT = 12 * (1 << 20)
MAX_TARS = 5
SHARES = {"tests": 0.12, "sweep": 0.15}  # of the budget; the trainings get what is left, less the bundling


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


def gpu_test_files() -> list[str]:
    """The test files with tests marked `gpu` (only those: the others import polars or DuckDB, absent there)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text())


def run_tests(out: Path, timeout: float) -> dict:
    """The `gpu`-marked tests (skipped without CUDA), in their own process; its summary line and log."""
    started = _now()
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *gpu_test_files()]
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


# The compact copy of MiniLM in the payload (benchmarks/gpu/pack.py); the `minilm` runs read it through this
# environment variable (medtx.models.bert_text.MINILM_COMPACT_ENV).
MINILM_FOLDER = "minilm"
MINILM_ENV = "MEDTX_MINILM_COMPACT"
# Expected seconds of one run on the GPU machine, for the order the runs start in (longest first within a seed, so
# the long ones do not start last) and the budget plan (benchmarks/notes/2026-11-28-gpu-plan.md): the EHR figures
# are the first GPU run's train seconds (H100, 6 runs at once, bf16 autocast, before the cuDNN attention fix),
# the rest are estimates (no text run has been on a GPU yet). A run missing here counts 30 s.
EXPECTED_S = {
    ("drug_rec", "transformer"): 18, ("drug_rec", "transformer_rope"): 17, ("drug_rec", "behrt"): 17,
    ("drug_rec", "rnn"): 13, ("drug_rec", "gru"): 14, ("drug_rec", "lstm"): 14, ("drug_rec", "retain"): 15,
    ("drug_rec", "seq2seq"): 85,
    ("readmission", "transformer"): 46, ("readmission", "transformer_rope"): 47, ("readmission", "behrt"): 33,
    ("readmission", "rnn"): 27, ("readmission", "gru"): 27, ("readmission", "lstm"): 24, ("readmission", "retain"): 22,
    ("mortality", "transformer"): 53, ("mortality", "transformer_rope"): 48, ("mortality", "rnn"): 24,
    ("mortality", "gru"): 25, ("mortality", "lstm"): 26, ("mortality", "retain"): 23,
    ("specialty", "bert_scratch"): 60, ("specialty", "bilstm"): 40, ("specialty", "minilm"): 45,
    ("specialty", "tfidf_logreg"): 47, ("specialty", "majority"): 5,
    # the baselines on the GPU machine's CPUs (RESULTS.md's CPU train s/run: logreg 20 s on drug_rec, 3 s elsewhere)
    **{(t, m): 5 for t in ("drug_rec", "readmission", "mortality") for m in ("most_frequent", "copy_last")},
    ("drug_rec", "logreg"): 20, ("readmission", "logreg"): 10, ("mortality", "logreg"): 10,
}
# Non-neural baselines trained once (seed 0; CPU) beside the neural runs: the candidates for the reference
# baseline every paired verdict is against (medtx.evaluation.comparisons), so the recorded GPU runs get verdicts
# in any warehouse. lightgbm is not a reference candidate and is left out by default (CPU minutes at full scale).
BASELINES = ("most_frequent", "copy_last", "logreg", "majority", "tfidf_logreg")


def training_runs(payload: Path, families: list[str], epochs: int, seeds: list[int], overrides: dict,
                  text_families: list[str] = (), text_overrides: dict | None = None,
                  baselines: list[str] = ()) -> tuple[list[dict], list[dict]]:
    """One run per (task package, family serving the task, seed), and one per (task package, baseline serving it):
    seed by seed, each seed's runs longest first (EXPECTED_S), the baselines after the first seed's. Returns
    (runs, rows of the runs that cannot run here, with the reason)."""
    from medtx.models.registry import model_names, models_for
    from medtx.tasks import find_task, get_task

    neural = set(model_names("ehr")) | set(model_names("text"))
    minilm = payload / MINILM_FOLDER
    by_seed: dict[int, list[dict]] = {seed: [] for seed in seeds}
    first, not_run = [], []
    for package in sorted((payload / "packages").iterdir()):
        # the package's task: its folder's name (pack.py), else its scope's (readmission_notes reads readmission's)
        task = package.name if find_task(package.name) else json.loads((package / "manifest.json").read_text())[
            "scope"]["task"]
        spec = get_task(task)
        text = spec.family == "text"
        asked = text_families if text else families
        for family in asked:
            if family not in neural:
                raise ValueError(f"{'--text-families' if text else '--families'} {family!r}: not a neural "
                                 f"{spec.family} model (one of {', '.join(sorted(model_names(spec.family)))})")
            if family not in models_for(spec):
                continue
            if family == "minilm" and not (minilm / "compact.json").exists():
                not_run.append({"task": task, "model": family, "status": f"not run: {payload / MINILM_FOLDER} "
                                "holds no compact MiniLM (pack.py --no-minilm, or no minilm extra where packed)"})
                continue
            run_overrides = dict(text_overrides or {}) if text else {"epochs": epochs, **overrides}
            for seed in seeds:
                run = {"task": task, "package": str(package), "model": family, "seed": seed,
                       "overrides": run_overrides}
                if family == "minilm":
                    run["env"] = {MINILM_ENV: str(minilm.resolve())}
                by_seed[seed].append(run)
        for baseline in baselines:
            if baseline in models_for(spec):
                first.append({"task": task, "package": str(package), "model": baseline, "seed": seeds[0],
                              "overrides": {}})
    longest = lambda r: -EXPECTED_S.get((r["task"], r["model"]), 30)  # noqa: E731
    ordered = []
    for i, seed in enumerate(seeds):
        ordered += sorted(by_seed[seed] + (first if i == 0 else []), key=longest)
    return ordered, not_run


def expected_seconds(runs: list[dict]) -> float:
    """The plan's worker-seconds for these runs (EXPECTED_S; 30 s where it has no figure)."""
    return float(sum(EXPECTED_S.get((r["task"], r["model"]), 30) for r in runs))


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
                spec = results / f"{run['task']}.{run['model']}.s{run['seed']}.json"
                spec.write_text(json.dumps([{k: run[k] for k in ("model", "seed", "overrides")}]))
                cmd = [sys.executable, "-m", "medtx.worker", run["package"], "--runs", str(spec), "--out",
                       str(results), "--device", device, "--threads", str(threads), "--task", run["task"]]
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, **run.get("env", {})})
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
                log.write(f"=== {run['task']} {run['model']} s{run['seed']} rc={proc.returncode}\n{stderr[-4000:]}\n")
                line = next((json.loads(x) for x in stdout.splitlines() if x.startswith("{")), {})
                status = line.get("status") or ("killed at the budget" if proc.returncode in (-9, 137) else
                                                f"exit {proc.returncode}")
                rows.append({"task": run["task"], "model": run["model"], "seed": run["seed"], "status": status,
                             "seconds": round(_now() - began, 1), "result": line.get("result"),
                             "error": line.get("error")})
                running.remove(item)
        for run in pending:
            rows.append({"task": run["task"], "model": run["model"], "seed": run["seed"],
                         "status": "not started (budget)"})
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
    lines += ["", "| task | model | seed | precision | status | seconds | test (point estimates) |",
              "|---|---|---:|---|---|---:|---|"]
    for r in report["trainings"]:
        lines.append(f"| {r['task']} | {r['model']} | {r.get('seed', '')} | {r.get('precision', '')} | {r['status']} | "
                     f"{r.get('seconds', '')} | " + ", ".join(f"{k} {v}" for k, v in r.get("test", {}).items()) + " |")
    lines += ["", ("Precision of the trainings: the trainer's own rule (bf16 autocast on a CUDA GPU that supports "
                   "it, fp32 elsewhere); it has no setting to force fp32, so fp32 against bf16 is in the sweep only.")]
    plan = report.get("plan", {})
    if plan:
        lines += [f"Plan: {plan['runs']} runs, {plan['expected_worker_s']:,.0f} expected worker-seconds over "
                  f"{plan['jobs']} workers (~{plan['expected_worker_s'] / plan['jobs']:,.0f} s), "
                  f"{plan['training_s']:,.0f} s for the trainings."]
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
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="seconds for everything (run.sh runs under the device's 590 s timeout_s)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seeds", default="0,1,2", help="training seeds of every neural run (3: seed-level verdicts)")
    ap.add_argument("--baselines", default=",".join(BASELINES),
                    help="non-neural baselines, one run each (seed: the first of --seeds), where they serve the task")
    ap.add_argument("--families", default="transformer,transformer_rope,behrt,rnn,gru,lstm,retain,seq2seq")
    ap.add_argument("--train-overrides", default='{"batch_size": 256}', help="JSON, for every EHR training run")
    ap.add_argument("--text-families", default="bert_scratch,bilstm,minilm",
                    help="neural text models trained on each text package (minilm: from the payload's compact copy)")
    ap.add_argument("--text-overrides", default='{"batch_size": 64, "mlm_batch_size": 128}',
                    help="JSON, TextConfig keys for every text run (epochs: each model's default unless given)")
    ap.add_argument("--jobs", type=int, default=8, help="worker processes at once (x --threads: the 16 CPUs)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads per worker")
    ap.add_argument("--sweep-models", default=",".join(SWEEP_MODELS),
                    help="default: the attention models (the bf16 fix); the recurrent ones were swept on 2026-11-27")
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
    runs, not_trained = training_runs(args.payload, [f for f in args.families.split(",") if f], args.epochs,
                                      [int(s) for s in args.seeds.split(",")], json.loads(args.train_overrides),
                                      [f for f in args.text_families.split(",") if f], json.loads(args.text_overrides),
                                      [b for b in args.baselines.split(",") if b])
    bundling_s = 20.0
    report["plan"] = {"runs": len(runs), "expected_worker_s": expected_seconds(runs), "jobs": args.jobs,
                      "training_s": round(deadline - bundling_s - _now())}
    rows = run_trainings(runs, results, args.device, args.jobs, args.threads,
                         start_until=deadline - bundling_s - 30, kill_at=deadline - bundling_s, out=args.out)
    precision = training_precision(args.device)
    for r in rows:
        r["test"], r["precision"] = headline(r.get("result")), precision
    report["trainings"] = rows + not_trained
    report["not_run"] += [f"{r['task']} {r['model']} s{r['seed']}: {r['status']}" for r in rows
                          if r["status"] not in ("completed", "failed")]
    report["not_run"] += [f"{r['task']} {r['model']}: {r['status']}" for r in not_trained]
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
