"""The task registry: every module in this package that defines `TASK = Task(...)` is a task, and so is every
ACES task a pipeline config declares (medtx.aces.task: `tasks: {NAME: {aces: task.yaml}}`).

    from medtx.tasks import get_task, all_tasks, tasks_of_family
    get_task("readmission").samples.table     # "samples.readmission"

A task module holds its record and its sample builder (SQL); it imports the sample-building kit
(medtx.samples) and DuckDB only inside `build`, because this registry loads on the torch-only training worker
(medtx.worker). The kit never imports medtx.tasks; the samples stage's entry point is medtx.tasks.build.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from medtx.tasks.base import EHR_VISIT_READS, SAMPLE_EXTRAS, BuildContext, Task

__all__ = [
    "EHR_VISIT_READS", "SAMPLE_EXTRAS", "BuildContext", "Task", "all_tasks", "find_task", "get_task", "reload_registry", "task_names",
    "tasks_of_family", "tasks_of_kind",
]

_NOT_TASKS = {"audit", "base", "build", "history", "leakage", "verdict", "outcome"}  # library modules of the package, not tasks


@lru_cache(maxsize=1)
def _registry() -> dict[str, Task]:
    found: dict[str, Task] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in _NOT_TASKS or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        task = getattr(module, "TASK", None)
        if not isinstance(task, Task):
            raise TypeError(f"medtx/tasks/{info.name}.py defines no `TASK = Task(...)`")
        if task.name != info.name:
            raise ValueError(f"medtx/tasks/{info.name}.py declares task {task.name!r}: the name must be the file's")
        found[task.name] = task
    aces = importlib.import_module("medtx.aces.task")  # loaded by name, like the task modules (its builder needs DuckDB)
    for spec in aces.declared():  # config-declared ACES tasks (MEDTX_ACES_TASKS)
        if spec.name in found:
            raise ValueError(f"ACES task {spec.name!r} ({spec.config}): a built-in task has that name; choose another")
        found[spec.name] = aces.aces_task(spec)
    for task in found.values():
        if task.lineage.builds is not None and task.lineage.builds not in found:
            raise ValueError(f"task {task.name!r} trains on the samples of unknown task {task.lineage.builds!r}")
    return dict(sorted(found.items(), key=lambda item: (item[1].order, item[0])))


def reload_registry() -> None:
    """Forget the loaded registry (after `medtx.aces.task.declare` changed the declared ACES tasks)."""
    _registry.cache_clear()


def all_tasks() -> tuple[Task, ...]:
    """Every registered task, by name."""
    return tuple(_registry().values())


def task_names() -> tuple[str, ...]:
    return tuple(_registry())


def get_task(name: str) -> Task:
    """The task called `name`; an unknown name fails with the list of known ones."""
    tasks = _registry()
    if name not in tasks:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(tasks)}")
    return tasks[name]


def find_task(name: str) -> Task | None:
    """The task called `name`, or None for a name the registry does not know (a recorded run of a task since
    removed, a snapshot from another version): where a stored name is read back, not where a user names one."""
    return _registry().get(name)


def tasks_of_kind(*kinds: str) -> tuple[Task, ...]:
    return tuple(t for t in _registry().values() if t.kind in kinds)


def tasks_of_family(family: str) -> tuple[Task, ...]:
    return tuple(t for t in _registry().values() if t.family == family)


def names_of_family(family: str) -> tuple[str, ...]:
    """Task names of one family (`ehr`, `text`), e.g. for CLI help and config validation."""
    return tuple(t.name for t in tasks_of_family(family))
