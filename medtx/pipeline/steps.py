"""Running steps: `call_step` (what every backend calls: the step's kind runs it, medtx/pipeline/kinds/),
`train_here` (`medtx train`: the pipeline's training path in this process) and `train_in_process` (the same path
for one run named by task, model and seed: what tests and benchmarks call). No Prefect here: flows/pipeline.py
wraps `call_step` in its one Prefect task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def train_in_process(db: Path | str, task: Any, model: str, seed: int = 0, overrides: dict[str, Any] | None = None,
                     *, dataset: str | None = None, device: str = "auto", models_dir: Path | str | None = None,
                     exchange_dir: Path | str | None = None, run_id: str | None = None,
                     torch_threads: int | None = None) -> str:
    """One run of `task` (the Task record) in this process, on the one training path: the step `medtx train` and
    the pipeline plan (medtx.pipeline.kinds.train.train_step), its training package, its dispatch record, the
    worker's `train_run` and the recording of its result package (`train_here`). What tests and benchmarks call.

    `dataset` defaults to the task's own corpus (MTSamples, the FAQ); the exchange and models folders to the
    warehouse's settings. Run options (n_boot, n_showcase, ...) go in `overrides` (medtx.training.runners.ehr.RUN_KEYS).
    `run_id` names the run (default: a fresh one); a run id the warehouse holds is refused, never replaced.
    Returns the run id; a failed training is recorded (status 'failed', error text), then raised."""
    from medtx.pipeline.kinds.train import train_step
    from medtx.settings import get_settings

    dataset = dataset or task.samples.dataset
    if dataset is None:
        raise ValueError(f"{task.name} needs a dataset (the EHR cohort it trains on)")
    settings = get_settings(db=Path(db))
    step = train_step(task, dataset, model, overrides=overrides, seed=seed, device=device)
    return train_here(db, step, exchange_dir or settings.exchange_dir, models_dir or settings.models_dir,
                      device=device, torch_threads=torch_threads, run_id=run_id)[0]


def train_here(db: Path | str, step: Any, exchange_dir: Path | str, models_dir: Path | str, *, device: str,
               torch_threads: int | None = None, run_id: str | None = None) -> list[str]:
    """`medtx train`: the pipeline's training path, in this process. Export the step's training package,
    train from it (the worker's entry point), then record the result package in one transaction — the only write
    to the warehouse. A failed training is recorded too (its failed run), then the error is raised. Caches a task's
    runs share (a text model's MLM encoder, note vectors) live under `models_dir`."""
    import uuid

    from medtx.pipeline import runs
    from medtx.pipeline.exchange import (dispatch_training, export_training_package, package_key,
                                         record_result_package)
    from medtx.pipeline.kinds import train as train_kind

    prints = runs.input_fingerprints(db, step)
    key = package_key(step.reads, step.scope, prints)
    package = export_training_package(db, step.reads, step.scope, exchange_dir, key,
                                      samples=train_kind.samples_read(step))
    call = f"cli-{uuid.uuid4().hex[:12]}"
    dispatch_id = f"{call}/{step.name}"
    digest = dispatch_training(db, dispatch_id, step, package, key, prints, None)
    result_dir = Path(exchange_dir) / "results" / call / step.name
    try:
        return train_kind.run(step.spec(), str(package), str(result_dir), pipeline_run_id=None, device=device,
                              torch_threads=torch_threads, package_digest=digest, cache_dir=str(models_dir),
                              run_id=run_id)["run_ids"]
    finally:
        if (result_dir / "manifest.json").exists():
            record_result_package(db, result_dir, models_dir, dispatch_id=dispatch_id)


def call_step(kind: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """Run one step from the keyword arguments the executor hands a backend (medtx.pipeline.executor): the data
    steps take (spec, paths), a training step (spec, package, result_dir, pipeline_run_id, device, torch_threads).
    `name` and `fingerprints` are for the backend's cache key and display only."""
    from medtx.pipeline.kinds import kind_named

    from medtx.runtime.train_processes import call_in_active

    p = {k: v for k, v in parameters.items() if k not in ("name", "fingerprints")}
    run = kind_named(kind).run
    if kind == "train":  # in a training process of the run's pool when it has one (executor.run_resources)
        return call_in_active(run, p.pop("spec"), p.pop("package"), p.pop("result_dir"), **p)
    return run(p["spec"], p["paths"])
