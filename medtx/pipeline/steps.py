"""Running steps: `call_step` (what every backend calls: the step's kind runs it, medtx/pipeline/kinds/),
`train_here` (`medtx train`: the pipeline's training path in this process), and the in-process `run_train` that
tests/test_lineage.py uses. No Prefect here: flows/pipeline.py wraps `call_step` in its one Prefect task.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

from medtx.store.db import open_warehouse

log = logging.getLogger("medtx.pipeline")

Spec = dict[str, Any]
Paths = dict[str, str]


def run_train(
    spec: Spec, paths: Paths, *, pipeline_run_id: str | None, device: str, torch_threads: int | None = None
) -> dict[str, Any]:
    """Train and evaluate one (dataset, task, model, seed) against the warehouse itself (the in-process
    experiments, no package; the pipeline trains from packages: medtx.pipeline.kinds.train.run); returns the run ids it
    wrote to ml.runs.

    A failure is recorded in ml.runs (status 'failed', error text) and re-raised, so Prefect marks the task
    failed while the flow carries on with the other models. `torch_threads` caps torch's CPU threads (the
    setting is per process; trainings in one process run one after another unless train_concurrency > 1).
    """
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    from medtx.text.experiment import run_text_experiment
    from medtx.tasks import get_task
    from medtx.training.experiment import ExperimentOptions, run_ehr_experiment

    p, db = spec["params"], Path(paths["db"])
    try:
        task = get_task(spec["task"])  # the step's task name, resolved once: the Task travels from here
        if task.family != "ehr":  # text runner (notes, FAQ)
            overrides = {"device": device, **p["overrides"]}
            run_id = run_text_experiment(db, task, p["model"], p["seed"], overrides,
                                         dataset=spec["dataset"], pipeline_run_id=pipeline_run_id,
                                         models_dir=Path(paths["models_dir"]))
        else:
            options = ExperimentOptions(models_dir=Path(paths["models_dir"]), pipeline_run_id=pipeline_run_id)
            run_id = run_ehr_experiment(db, spec["dataset"], task, p["model"], p["seed"], p["overrides"],
                                        device=device, options=options)
    except Exception as exc:
        record_failure(db, spec, pipeline_run_id, device, exc)
        raise
    return {"run_ids": [run_id]}


def train_here(db: Path | str, step: Any, exchange_dir: Path | str, models_dir: Path | str, *, device: str,
               torch_threads: int | None = None) -> list[str]:
    """`medtx train`: the pipeline's training path, in this process. Export the step's training package,
    train from it (the worker's entry point), then record the result package in one transaction — the only write
    to the warehouse. A failed training is recorded too (its failed run), then the error is raised."""
    import uuid

    from medtx.pipeline import runs
    from medtx.pipeline.exchange import export_training_package, package_key, record_result_package
    from medtx.pipeline.kinds import train as train_kind

    prints = runs.input_fingerprints(db, step)
    package = export_training_package(db, step.reads, step.scope, exchange_dir,
                                      package_key(step.reads, step.scope, prints))
    result_dir = Path(exchange_dir) / "results" / f"cli-{uuid.uuid4().hex[:12]}" / step.name
    try:
        return train_kind.run(step.spec(), str(package), str(result_dir), pipeline_run_id=None, device=device,
                              torch_threads=torch_threads)["run_ids"]
    finally:
        if (result_dir / "manifest.json").exists():
            record_result_package(db, result_dir, models_dir)


def record_failure(db: Path | str, spec: Spec, pipeline_run_id: str | None, device: str, exc: BaseException) -> None:
    """Make sure a failed training shows up in ml.runs: the experiment records its own failures once it has
    started a run; this covers a failure before that (bad config, missing samples)."""
    from medtx.training import records
    from medtx.training.runs import is_synthetic

    p = spec["params"]
    with open_warehouse(db) as con:
        already = con.execute(
            "SELECT count(*) FROM ml.runs WHERE pipeline_run_id IS NOT DISTINCT FROM ? AND task = ?"
            " AND model = ? AND dataset = ? AND seed = ? AND status = 'failed'",
            [pipeline_run_id, spec["task"], p["model"], spec["dataset"], p["seed"]],
        ).fetchall()[0][0]
        if already:
            return
        run_id = records.new_run_id(spec["task"], p["model"], spec["dataset"], p["seed"])
        records.start_run(
            con, run_id, task=spec["task"], model=p["model"], dataset=spec["dataset"], seed=p["seed"],
            config={"overrides": p["overrides"]}, device=device, pipeline_run_id=pipeline_run_id,
            is_synthetic=is_synthetic(con, spec["dataset"]),
        )
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        records.fail_run(con, run_id, error)
    log.warning("%s/%s/%s failed before recording a run: %s", spec["task"], spec["dataset"], p["model"], error)


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
