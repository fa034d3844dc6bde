"""Step kind `samples`: build one task's samples, split, vocabularies and summary (for one dataset, or the
text corpora); what it reads, writes and hashes comes from the task's declaration (medtx/tasks/<task>.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medtx.pipeline.config import PipelineConfig
from medtx.pipeline.kinds import Paths, PlanContext, Spec, StepKind
from medtx.pipeline.kinds.ingest import steps_of
from medtx.pipeline.step import Step
from medtx.store.db import open_warehouse
from medtx.tasks import Task, get_task


def task_datasets(cfg: PipelineConfig, task: Task) -> list[str]:
    """The warehouse datasets a configured task runs on: its fixed corpus, or the config's EHR datasets."""
    return [task.samples.dataset] if task.samples.dataset is not None else [d.key for d in cfg.datasets_for(task.name)]


def step_name(builder: Task, dataset: str) -> str:
    """The samples step of a building task (`get_task(task.samples_task)`) on a dataset."""
    return f"samples.{builder.name}" if builder.samples.dataset is not None else f"samples.{builder.name}.{dataset}"


def plan(cfg: PipelineConfig, ctx: PlanContext, earlier: Sequence[Step]) -> list[Step]:
    """One step per (building task, dataset); tasks sharing a builder (readmission, readmission_notes) share it."""
    steps: dict[str, Step] = {}
    seed = cfg.split_seed  # the dataset's patient split: every model, task and training seed sees the same one
    for name, tc in cfg.tasks.items():
        task = get_task(name)  # the config's task name, resolved once
        builder = get_task(task.samples_task)
        for dataset in task_datasets(cfg, task):
            name_ = step_name(builder, dataset)
            if name_ in steps:
                continue
            mapped = any(t.startswith("core.") for t in builder.lineage.reads)
            steps[name_] = Step(
                name_, KIND, {"options": tc.samples.builder_options(), "seed": seed}, dataset, builder,
                needs=(*((f"codes.{dataset}",) if mapped else ()), *steps_of(earlier, dataset)),
                reads=builder.lineage.reads, writes=builder.lineage.writes,
                files=tuple(str(ctx.data_dir / f) for f in builder.lineage.files),
                scope={"dataset": dataset, "task": builder.name},
            )
    return list(steps.values())


def run(spec: Spec, paths: Paths) -> dict[str, Any]:
    """`params.options` may set `fractions` (train/val/test, default 70/10/20), `min_count` and `k_folds`."""
    from medtx.tasks.build import build_samples

    p, task = spec["params"], get_task(spec["task"])  # a name across the JSON boundary, resolved once
    datasets = [spec["dataset"]] if task.family == "ehr" else None
    with open_warehouse(paths["db"]) as con:
        counts = build_samples(con, Path(paths["data_dir"]), [task.name], datasets, seed=p["seed"], **p["options"])
    return {"samples": sum(counts.values())}


def code(step: Step) -> tuple[str, ...]:
    task = step.task
    assert task is not None
    return ("medtx.tasks.build", task.module, *((f"medtx.tasks.{task.lineage.builds}",) if task.lineage.builds else ()))


KIND = StepKind("samples", plan, run, code)
