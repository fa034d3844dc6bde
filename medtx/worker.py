"""A training worker that needs only torch, numpy, pyarrow, scikit-learn and transformers (and small wheels such
as pydantic): `python -m medtx.worker`.

It reads a training package (Parquet tables + manifest, written by the flow: medtx.pipeline.exchange), trains the
runs it is given, and writes one result package per run (medtx.training.packages), which the flow records into the
warehouse (the pipeline itself, or benchmarks/gpu/record.py for results trained elsewhere). It never opens the warehouse, and its whole import
closure has no polars, DuckDB, Prefect, Dash or Dask (an import-linter contract in pyproject.toml; a test runs
it where importing those raises), so it runs on a GPU machine whose image lacks them.

    python -m medtx.worker PACKAGE --run transformer --run gru:1 --out results/ --device cuda \
        --package-digest SHA256     # as ml.dispatches recorded it: a changed package is refused
    python -m medtx.worker PACKAGE --runs runs.json --out results/      # [{"model", "seed", "overrides"}, ...]

The pipeline's own workers (its thread, its training processes, Dask workers) call `train_run`, the function
`main` calls for each run. Every task trains here, from the tables of its training step's package, through the
runner of its model's family (medtx.training.runners: EHR, text classification, FAQ).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("medtx.worker")

EXIT_BAD_INPUT = 2


def supports(task: str) -> bool:
    """Whether a runner trains this task's runs from a package alone (medtx.training.runners)."""
    from medtx.tasks import get_task
    from medtx.training.runners import trains

    return trains(get_task(task))


def data_fingerprint(manifest: dict[str, Any]) -> str:
    """A run's ml.runs.data_fingerprint: its task's samples and split as the flow fingerprinted them when it
    exported the package (what an imported run records too); an older package's key where it has none."""
    return manifest.get("samples_fingerprint") or f"package {manifest.get('key')}"


def run_name(spec: dict[str, Any]) -> str:
    """The result package's folder name of a run: `<task>.<dataset>.<model>.s<seed>` (a pipeline step's)."""
    p = spec["params"]
    return f"{spec['task']}.{spec['dataset']}.{spec.get('label') or p['model']}.s{p['seed']}"


def train_run(package: Path | str, spec: dict[str, Any], result_dir: Path | str, *, device: str = "auto",
              pipeline_run_id: str | None = None, torch_threads: int | None = None,
              package_digest: str | None = None, cache_dir: Path | str | None = None,
              run_id: str | None = None) -> dict[str, Any]:
    """Train one run (`spec`: {"dataset", "task", "params": {"model", "seed", "overrides"}}) from the training
    package and publish its result package at `result_dir` — also when the training failed, so the failed run
    reaches the warehouse; the error is raised after. Returns {"run_ids", "result"}.

    `package_digest`: the package's content digest as the flow recorded it when it handed the package out
    (ml.dispatches), given out of band; a package whose files, tables or scope differ is a PackageError before
    anything trains (a table rewritten with its manifest hash recomputed). Whatever was given, the digest of what
    was read goes into the result package (`trained_on`), which the flow checks against its dispatch.
    `cache_dir`: where caches that a task's runs share live (a text model's MLM encoder, note vectors); default
    the run's own temporary folder (nothing shared). `run_id`: the run's id (default: a fresh one)."""
    import torch

    from medtx.store.hashing import code_version
    from medtx.tasks import get_task
    from medtx.training.integrity import manifest_digest, safe_name
    from medtx.training.packages import (PackageError, is_synthetic_tables, now, read_training_package,
                                         replaceable_result, run_tables, write_result_package)
    from medtx.training.results import epoch_rows, new_run_id
    from medtx.training.runners import runner_for, trains
    from medtx.training.trainer import resolve_device

    if not replaceable_result(Path(result_dir)):
        raise PackageError(f"{result_dir}: exists and is not a result package; a worker never replaces it")
    manifest, tables = read_training_package(package)
    trained_on = manifest_digest(manifest)  # the manifest was just checked against every file it lists
    if package_digest is not None and trained_on != package_digest:
        raise PackageError(f"{package}: its content digest {trained_on[:16]}... is not the one the flow handed out "
                           f"({package_digest[:16]}...): the package was changed; nothing was trained")
    dataset, task_name, p = spec["dataset"], spec["task"], spec["params"]
    model, seed, overrides = p["model"], int(p["seed"]), dict(p.get("overrides") or {})
    task = get_task(task_name)  # the stored name, resolved once: the Task travels from here
    if not trains(task):
        raise ValueError(f"task {task_name!r} ({task.family}, {task.kind}): no runner trains it from a package")
    scope = manifest.get("scope", {})
    if scope.get("dataset") not in (None, dataset):
        raise ValueError(f"{package}: the package holds dataset {scope.get('dataset')!r}, the run asks for {dataset!r}")
    if torch_threads:
        torch.set_num_threads(torch_threads)
    runner = runner_for(task, model)  # the runner of the model's family (medtx.training.runners)
    run_id = run_id or new_run_id(task_name, model, dataset, seed)
    safe_name(run_id, "run id")  # a result folder and checkpoint folder are named by it
    run = {"run_id": run_id, "task": task_name, "model": model, "status": "running", "seed": seed,
           "config": json.dumps({"overrides": overrides}), "data_fingerprint": data_fingerprint(manifest),
           "code_version": code_version(*runner.code_parts), "dataset": dataset,
           "is_synthetic": is_synthetic_tables(tables, dataset), "started_at": now(), "pipeline_run_id": pipeline_run_id}
    epochs: list[tuple] = []
    error: BaseException | None = None
    results = None
    with tempfile.TemporaryDirectory(prefix="medtx-worker-") as work:
        models_root = Path(work) / "models"
        try:
            run["device"] = str(resolve_device(device))

            def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
                epochs.extend(epoch_rows(run_id, epoch, metrics))

            prepared = runner.prepare(task, model, seed, overrides, device=device)
            samples = prepared.samples(tables, dataset)
            run["config"] = json.dumps(prepared.describe(samples), default=str)
            results = prepared.train(samples, models_root / run_id, on_epoch, Path(cache_dir) if cache_dir else None)
            run.update(status="completed", finished_at=now())
        except Exception as exc:  # published as the failed run, then raised
            error = exc
            run.update(status="failed", finished_at=now(),
                       error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"[:4000])
        write_result_package(result_dir, [run_tables(run, results, epochs)], models_root,
                             None if error is None else f"{type(error).__name__}: {error}", trained_on=trained_on,
                             trained_on_data={"fingerprint": manifest.get("data_fingerprint"),
                                              "tables": sorted(manifest.get("tables", {})), "scope": scope})
    if error is not None:
        raise error
    return {"run_ids": [run_id], "result": str(result_dir)}


_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def _parse_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The run specs from --run MODEL[:SEED] (with --overrides) and/or --runs FILE.json, and every other argument
    checked, before the package is read: ValueError naming the first bad one."""
    from medtx.training.integrity import PackageDamaged, safe_name

    if args.package_digest is not None and not _DIGEST.match(args.package_digest):
        raise ValueError(f"--package-digest {args.package_digest!r}: expected 64 lowercase hex digits (the digest "
                         "the flow recorded in ml.dispatches)")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out}: exists and is not a folder")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads {args.threads}: expected a whole number >= 1")
    if args.task:
        from medtx.tasks import task_names

        if args.task not in task_names():
            raise ValueError(f"--task {args.task!r}: unknown task; expected one of {task_names()}")
    specs = []
    try:
        base = json.loads(args.overrides) if args.overrides else {}
    except json.JSONDecodeError as exc:
        raise ValueError(f"--overrides {args.overrides!r}: not JSON ({exc.msg})") from None
    if not isinstance(base, dict):
        raise ValueError(f"--overrides must be a JSON object, got {args.overrides!r}")
    for text in args.run or []:
        model, _, seed = text.partition(":")
        if not model or (seed and not seed.lstrip("-").isdigit()):
            raise ValueError(f"--run {text!r}: expected MODEL or MODEL:SEED, e.g. transformer:0")
        specs.append({"params": {"model": model, "seed": int(seed or 0), "overrides": dict(base)}})
    if args.runs:
        try:
            listed = json.loads(Path(args.runs).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"--runs {args.runs}: not JSON ({exc.msg})") from None
        if not isinstance(listed, list) or not all(isinstance(r, dict) and "model" in r for r in listed):
            raise ValueError(f"--runs {args.runs}: expected a JSON list of objects with a 'model' key")
        for r in listed:
            if not isinstance(r.get("overrides", {}), dict):
                raise ValueError(f"--runs {args.runs}: 'overrides' of {r['model']!r} is not a JSON object")
            specs.append({"label": r.get("label"), "params": {
                "model": r["model"], "seed": int(r.get("seed", 0)), "overrides": {**base, **r.get("overrides", {})}}})
    if not specs:
        raise ValueError("no run given: pass --run MODEL[:SEED] or --runs FILE.json")
    for spec in specs:  # a result folder's name stays inside --out (a label `x/..` would not)
        try:
            safe_name(spec.get("label") or spec["params"]["model"], "run label")
        except PackageDamaged as exc:
            raise ValueError(f"--runs/--run: {exc}") from None
    return specs


def _scoped(specs: list[dict[str, Any]], args: argparse.Namespace, scope: dict[str, Any]) -> list[dict[str, Any]]:
    """Each spec with the package's dataset and the task to train. A package is scoped by the samples it holds,
    not by the task trained on them: readmission_notes trains on readmission's samples, so its package says task
    'readmission' and --task names the note task."""
    task = args.task or scope.get("task")
    for s in specs:
        s.update(dataset=scope.get("dataset"), task=task)
    return specs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m medtx.worker",
        description="Train runs (EHR, note classification or FAQ) from a training package and write one result "
                    "package per run. Needs torch, numpy, pyarrow, scikit-learn and transformers only. The "
                    "pipeline (`medtx pipeline`, `medtx train`) writes the training packages into its exchange "
                    "folder and records the result packages it dispatched; results trained elsewhere are "
                    "recorded with benchmarks/gpu/record.py.")
    parser.add_argument("package", type=Path, help="training package folder (manifest.json + <table>.parquet) "
                                                   "from the pipeline's exchange folder (<exchange>/packages/<key>)")
    parser.add_argument("--run", action="append", metavar="MODEL[:SEED]",
                        help="a run to train (repeatable), e.g. transformer or gru:1 (seed 0 by default)")
    parser.add_argument("--runs", metavar="FILE.json",
                        help='runs as a JSON list: [{"model": "gru", "seed": 0, "overrides": {"epochs": 3}}, ...]')
    parser.add_argument("--overrides", metavar="JSON", help='trainer/model overrides for every run, e.g. \'{"epochs": 1}\'')
    parser.add_argument("--task", help="the task to train (default: the package's own, its manifest's scope); "
                                       "e.g. readmission_notes on a readmission package")
    parser.add_argument("--out", type=Path, required=True, help="folder that receives one result package per run")
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:1 ...")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--pipeline-run-id", help="recorded on each run (the pipeline run it belongs to)")
    parser.add_argument("--package-digest", metavar="SHA256",
                        help="the package's content digest as the flow recorded it (ml.dispatches.package_digest); "
                             "a package that differs is refused before anything trains")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Train every run given; print one JSON line per run. Exit 0 when all completed, 1 when a training
    failed (its failed run is in its result package), 2 for bad input (one line naming what): the command line
    is checked first, then the package."""
    from medtx.training.packages import PackageError, read_training_package

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        specs = _parse_runs(args)
        manifest, _ = read_training_package(args.package)
        specs = _scoped(specs, args, manifest.get("scope", {}))
        if not supports(specs[0]["task"]):
            raise ValueError(f"{args.package}: task {specs[0]['task']!r}: no runner trains it (medtx.training.runners)")
    except (PackageError, ValueError, OSError) as exc:
        print(f"medtx.worker: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    failed = 0
    for spec in specs:
        started = time.perf_counter()
        result_dir = args.out / run_name(spec)
        try:
            out = train_run(args.package, spec, result_dir, device=args.device, pipeline_run_id=args.pipeline_run_id,
                            torch_threads=args.threads, package_digest=args.package_digest)
            status, run_ids, error = "completed", out["run_ids"], None
        except PackageError as exc:  # the package changed, or --out holds something else: bad input
            print(f"medtx.worker: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        except Exception as exc:
            failed += 1
            status, error = "failed", f"{type(exc).__name__}: {exc}"
            manifest_path = result_dir / "manifest.json"
            run_ids = json.loads(manifest_path.read_text())["run_ids"] if manifest_path.exists() else []
        print(json.dumps({"run": run_name(spec), "status": status, "run_ids": run_ids, "result": str(result_dir),
                          "seconds": round(time.perf_counter() - started, 2), "error": error}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
