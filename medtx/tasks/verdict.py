"""The leakage gate's verdict as training reads it: refuse a task whose record is blocked or missing.

Pure Python over the record's rows (medtx.tasks.leakage writes them into samples.leakage_gate), so the training
worker, which has no DuckDB (medtx.worker), checks the rows of its training package with the same rule as a run
reading the warehouse (medtx.tasks.leakage.require_pass).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from medtx.tasks.base import Task


class LeakageError(ValueError):
    """The gate blocks this task's trainings; the message is one line naming task, dataset and first offence."""


def gated(task: Task) -> bool:
    """The gate covers tasks split by patient (every EHR task and the note view of readmission)."""
    return task.split_unit == "patient"


def check_gate_rows(rows: Sequence[Mapping[str, Any]] | None, task: Task, dataset: str) -> str:
    """Refuse (LeakageError, one line) a task whose gate record among `rows` (samples.leakage_gate rows) is
    `blocked` or missing; else return its status ('pass' or 'suspect'), or 'ungated' for a task the gate does
    not cover."""
    if not gated(task):
        return "ungated"
    mine = [r for r in rows or () if r["dataset"] == dataset and r["task"] == task.name]
    if not mine:
        raise LeakageError(f"leakage gate: no record for task {task.name!r} on dataset {dataset!r}; rebuild its "
                           f"samples (`medtx build-samples --task {task.samples_task} --dataset {dataset}`) so the "
                           f"gate runs before any training")
    if mine[0]["status"] == "blocked":
        raise LeakageError(mine[0]["message"])
    return str(mine[0]["status"])
