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
    return task.samples.split_unit == "patient"


def samples_fingerprint(samples: Any, splits: Any, task: Task, dataset: str) -> str:
    """A hash of what the gate judges and training reads: the task's sample rows of `dataset` (its own rows of a
    shared table; every column of `Task.samples.columns` the table has) and its patient split. `samples`, `splits`:
    pyarrow tables (the warehouse's rows, or a training package's), so the gate and the torch-only worker compute
    it alike. Row order does not matter."""
    import hashlib
    import json

    import pyarrow as pa
    import pyarrow.compute as pc

    def rows(table: Any, columns: Sequence[str], **equal: Any) -> list[str]:
        for column, value in equal.items():
            if column in table.column_names:
                table = table.filter(pc.fill_null(pc.equal(table.column(column), pa.scalar(value)), False))
        present = [c for c in columns if c in table.column_names]
        return sorted(json.dumps([row[c] for c in present], default=str) for row in table.select(present).to_pylist())

    digest = hashlib.sha256()
    for line in rows(samples, [c for c in task.samples.columns if c != "task"], dataset=dataset,
                     task=task.samples_task):
        digest.update(line.encode() + b"\n")
    digest.update(b"--splits--\n")
    for line in rows(splits, ("subject_id", "split"), dataset=dataset, task=task.samples_task):
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()[:16]


def check_gate_rows(rows: Sequence[Mapping[str, Any]] | None, task: Task, dataset: str,
                    fingerprint: str | None = None) -> str:
    """Refuse (LeakageError, one line) a task whose gate record among `rows` (samples.leakage_gate rows) is
    `blocked` or missing, or (given the `fingerprint` of the samples about to train, `samples_fingerprint`) was
    made on other samples; else return its status ('pass'), or 'ungated' for a task the gate does not cover."""
    if not gated(task):
        return "ungated"
    mine = [r for r in rows or () if r["dataset"] == dataset and r["task"] == task.name]
    if not mine:
        raise LeakageError(f"leakage gate: no record for task {task.name!r} on dataset {dataset!r}; rebuild its "
                           f"samples (`medtx build-samples --task {task.samples_task} --dataset {dataset}`) so the "
                           f"gate runs before any training")
    if mine[0]["status"] == "blocked":
        raise LeakageError(mine[0]["message"])
    judged = mine[0].get("fingerprint")
    if fingerprint is not None and judged != fingerprint:
        raise LeakageError(f"leakage gate: the samples of task {task.name!r} on dataset {dataset!r} are not those "
                           f"the gate judged (fingerprint {fingerprint}, the record's {judged or 'none'}); rebuild "
                           f"them (`medtx build-samples --task {task.samples_task} --dataset {dataset}`) so the gate "
                           f"judges what trains")
    return str(mine[0]["status"])
