"""The samples stage: build the registered tasks' samples (`samples.*`), then gate each EHR task for leakage.

    from medtx.tasks.build import build_samples, buildable_tasks
    build_samples(con, data_dir)                      # every task, every EHR dataset in raw.admissions

The entry point the flow, the CLI and the pipeline's samples step call. It sits above the task registry (it
reads it) and the sample-building kit (medtx.samples: visits, history, splits, vocabularies), which never
imports medtx.tasks; each task's builder is its own file's `build` (medtx/tasks/<name>.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import duckdb

from medtx.samples.common import EmptyCohortError, create_visits, ehr_datasets
from medtx.samples.splits import DEFAULT_FRACTIONS, DEFAULT_SEED
from medtx.tasks import BuildContext, Task, all_tasks
from medtx.tasks.leakage import gate_all

log = logging.getLogger("medtx.samples")  # the stage's name in the logs, as before the entry point moved here

__all__ = ["EmptyCohortError", "build_samples", "buildable_tasks"]


def buildable_tasks() -> tuple[str, ...]:
    """Tasks with a sample builder of their own (a task trained on another's samples builds nothing)."""
    return tuple(t.name for t in all_tasks() if t.lineage.build is not None)


def build_samples(
    con: duckdb.DuckDBPyConnection,
    data_dir: Path,
    tasks: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    *,
    seed: int = DEFAULT_SEED,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    min_count: int = 1,
    k_folds: int = 5,
    acknowledge: Mapping[str, str] | Mapping[str, Mapping[str, str]] | None = None,
) -> dict[tuple[str, str], int]:
    """Build the given tasks (default: all) for the given EHR datasets (default: every dataset in
    raw.admissions). Returns sample counts per (task, dataset).

    A task asked for by name fails with `EmptyCohortError` when it has nothing to build from; when building
    everything, such a task is logged and skipped so the others still run.

    After each EHR task is built, the leakage gate (medtx.tasks.leakage) checks it and every task trained on its
    samples, and records the verdict in samples.leakage_gate. `acknowledge`: the feature families whose shortcut
    a person acknowledged in the pipeline config (`tasks.<task>.samples.acknowledge`, docs/TASKS.md), as a
    mapping family -> reason (for the tasks built here) or task -> (family -> reason). A blocked task is
    recorded, not raised here: its trainings refuse to start (medtx.tasks.leakage.require_pass).
    """
    explicit = tasks is not None
    known = buildable_tasks()
    tasks = list(tasks) if explicit else list(known)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; expected one of {list(known)}")
    chosen = [t for t in all_tasks() if t.name in tasks]
    if acknowledge and not any(isinstance(v, Mapping) for v in acknowledge.values()):
        acknowledge = {t.name: dict(acknowledge) for t in chosen}
    ctx = BuildContext(None, Path(data_dir), seed, tuple(fractions), min_count, k_folds)
    counts: dict[tuple[str, str], int] = {}
    ehr = [t for t in chosen if t.family == "ehr"]
    if ehr:
        datasets = list(datasets) if datasets is not None else ehr_datasets(con)
        if not datasets:
            message = "raw.admissions is empty: ingest an EHR dataset (`medtx ingest mimic3` loads the bundled demo) before building EHR samples"
            if explicit:
                raise EmptyCohortError(message)
            log.warning("%s; skipping %s", message, ", ".join(t.name for t in ehr))
        for dataset in datasets:
            create_visits(con, dataset)
            for task in ehr:
                counts[(task.name, dataset)] = _guarded(explicit, task, replace(ctx, dataset=dataset), con)
                if counts[(task.name, dataset)] is not None:
                    gate_all(con, [task], dataset, acknowledge)
            con.execute("DROP TABLE IF EXISTS _samples_visits")
    for task in (t for t in chosen if t.family != "ehr"):
        dataset = task.samples.dataset
        counts[(task.name, dataset)] = _guarded(explicit, task, replace(ctx, dataset=dataset), con)
    return {k: v for k, v in counts.items() if v is not None}


def _guarded(explicit: bool, task: Task, ctx: BuildContext, con: duckdb.DuckDBPyConnection) -> int | None:
    """Run one builder; when building everything, an empty cohort is a warning, not a failure."""
    try:
        return task.lineage.build(con, ctx)
    except EmptyCohortError as exc:
        if explicit:
            raise
        log.warning("skipping %s: %s", task.name, exc)
        return None
