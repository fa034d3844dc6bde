"""Step kind `train`: train and evaluate one (task, dataset, model, seed). The executor exports the step's
training package; the step trains from it alone (never the warehouse) through the worker's entry point
(`medtx.worker.train_run`, what `python -m medtx.worker` calls) and writes a result package, which the executor,
the single writer, records (medtx.pipeline.exchange)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from medtx.evaluation.groups import READS as TRUST_READS
from medtx.evaluation.trust import applies as trust_applies
from medtx.pipeline.config import ModelEntry, PipelineConfig, resolve_devices
from medtx.pipeline.kinds import PlanContext, Spec, StepKind
from medtx.pipeline.kinds.samples import step_name as sample_step_name
from medtx.pipeline.kinds.samples import task_datasets
from medtx.pipeline.step import Step
from medtx.synth.oracle import WRITES as SYNTH_ORACLE
from medtx.tasks import Task, get_task

# Tables every train step reads besides its task's: the split, the vocabularies and the leakage gate's record (a
# blocked task's trainings refuse to start: medtx.tasks.leakage.require_pass), plus the synthetic generator's
# oracle tables, SYNTH_ORACLE: the "is this dataset synthetic" rule and the oracle baseline read them.
TRAIN_READS = ("samples.splits", "samples.vocab", "samples.leakage_gate")


def train_step(task: Task, dataset: str, model: str, *, label: str | None = None,
               overrides: dict[str, Any] | None = None, seed: int = 0, device: str = "cpu") -> Step:
    """The step that trains `model` on (task, dataset) with one seed: what the pipeline plans and what
    `medtx train` runs (same reads, so the same training package)."""
    return Step(
        f"train.{task.name}.{dataset}.{label or model}.s{seed}",
        KIND,
        {"model": model, "overrides": dict(overrides or {}), "seed": seed},
        dataset,
        task,
        label or model,
        needs=(sample_step_name(get_task(task.samples_task), dataset),),
        # every family's run reads the oracle tables: one "is this dataset synthetic" rule (medtx.training.runs)
        # a binary/multi-label run on admissions reads its test admissions' demographics (its subgroups)
        reads=(task.samples.table, *TRAIN_READS, *task.lineage.train_reads, *SYNTH_ORACLE,
               *(TRUST_READS if trust_applies(task) else ())),
        writes=("ml.runs", "ml.metrics"),  # scoped to the run ids the step wrote
        device=device,
        scope={"dataset": dataset, "task": task.samples_task},
    )


def samples_read(step: Step) -> tuple[str, str]:
    """The tables whose fingerprint is a training run's data fingerprint: its task's samples and their split."""
    assert step.task is not None
    return (step.task.samples.table, "samples.splits")


def runs_on(spec: ModelEntry, dataset: str, cfg: PipelineConfig) -> bool:
    """A model spec runs on a dataset unless it names others; a model reading the synthetic generator's tables
    (the oracle) needs a synthetic cohort."""
    from medtx.models.registry import reads_generator

    if spec.datasets is not None and dataset not in spec.datasets:
        return False
    if reads_generator(spec.model):
        return any(d.key == dataset and d.kind == "synth" for d in cfg.datasets)
    return True


def plan(cfg: PipelineConfig, ctx: PlanContext, earlier: Sequence[Step]) -> list[Step]:
    """One step per (task, dataset, model entry, seed); devices assigned round-robin."""
    devices = itertools.cycle(resolve_devices(cfg.devices))
    steps = []
    for name, tc in cfg.tasks.items():
        task = get_task(name)
        for dataset, spec in itertools.product(task_datasets(cfg, task), tc.models):
            if not runs_on(spec, dataset, cfg):
                continue
            for seed in spec.seeds or cfg.seeds:
                steps.append(train_step(task, dataset, spec.model, label=spec.label, overrides=spec.overrides,
                                        seed=seed, device=next(devices)))
    return steps


def run(spec: Spec, package: str, result_dir: str, *, pipeline_run_id: str | None, device: str,
        torch_threads: int | None = None, package_digest: str | None = None,
        cache_dir: str | None = None, run_id: str | None = None) -> dict[str, Any]:
    """Worker side of a training step: train from a training package alone and publish a result package at
    `result_dir`. Runs anywhere that mounts the exchange folder: the flow's process, a local Dask worker,
    another machine. Every run, EHR, notes or FAQ, goes through `medtx.worker.train_run` (no DuckDB, no polars).
    `package_digest`: what the executor recorded when it dispatched the step (ml.dispatches); a package that
    differs is refused before anything trains."""
    from medtx import worker

    return worker.train_run(package, spec, result_dir, device=device, pipeline_run_id=pipeline_run_id,
                            torch_threads=torch_threads, package_digest=package_digest, cache_dir=cache_dir,
                            run_id=run_id)


def code(step: Step) -> tuple[str, ...]:
    """The package format, the runner of the model's family (medtx.training.runners; not the whole worker, whose
    closure holds every runner: an edit to the text runner does not retrain the EHR models), the model's own files
    (the registry finds them by name, so no import names them) and the task's own module(s)."""
    from medtx.models.registry import model_modules
    from medtx.training.runners import runner_for

    task = step.task
    assert task is not None
    model = step.params["model"]
    return ("medtx.training.packages", *runner_for(task, model).modules, *model_modules(model, task), task.module,
            *((f"medtx.tasks.{task.lineage.builds}",) if task.lineage.builds else ()))


KIND = StepKind("train", plan, run, code)
