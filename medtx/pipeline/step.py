"""One pipeline step and a plan of them: the data the planner writes and the executor walks.

A step holds objects: its kind (`StepKind`, medtx/pipeline/kinds/<kind>.py: what the kind plans, runs and hashes)
and its task (`Task`, medtx/tasks/). They become names only where a step crosses a process or Prefect boundary
as JSON: `Step.spec()` (what the step function receives) and the rows of ml.pipeline_steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from medtx.store.fingerprint import import_closure

if TYPE_CHECKING:
    from medtx.pipeline.kinds import StepKind
    from medtx.tasks import Task


@lru_cache(maxsize=None)
def _closure(entries: tuple[str, ...]) -> tuple[str, ...]:
    return import_closure(*entries)


@dataclass(frozen=True)
class Step:
    """One unit of work: one Prefect task run, one row in ml.pipeline_steps."""

    name: str
    kind: StepKind  # what plans, runs and hashes it (medtx.pipeline.kinds)
    params: dict[str, Any]  # JSON-able arguments of the step function (source, overrides, seed, ...)
    dataset: str | None = None  # warehouse dataset key the step reads/writes (None: dataset-independent)
    task: Task | None = None  # the task it builds samples for or trains (None: not a task's step)
    model: str | None = None  # model spec label (train steps)
    needs: tuple[str, ...] = ()  # names of upstream steps; a failed upstream skips this step
    reads: tuple[str, ...] = ()  # warehouse tables fingerprinted (filtered by dataset) into the cache key
    writes: tuple[str, ...] = ()  # warehouse tables fingerprinted after the step (filtered by dataset)
    device: str = "cpu"  # train steps: where to train (not part of the cache key)
    files: tuple[str, ...] = ()  # local files/folders hashed into the cache key
    # Column filters for fingerprinting `reads`/`writes` (applied to tables that have the column).
    scope: dict[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> tuple[str, ...]:
        """The medtx modules (import closure of what the step's kind runs for it) whose source is in its cache
        key: an edit to the models redoes training but not ingest, and editing one task's builder redoes that
        task's samples only."""
        return _closure(self.kind.code(self))

    @property
    def task_name(self) -> str | None:
        return None if self.task is None else self.task.name

    def spec(self) -> dict[str, Any]:
        """What the step function needs (and the cache key covers), as JSON: names, not objects; not its place
        in the plan."""
        return {"dataset": self.dataset, "task": self.task_name, "model": self.model, "params": self.params}


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    def __getitem__(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"no pipeline step named {name!r}; known steps:\n  " + "\n  ".join(self.names))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def layers(self) -> list[list[Step]]:
        """Steps grouped by kind, in execution order (medtx.pipeline.kinds.KIND_NAMES)."""
        from medtx.pipeline.kinds import KIND_NAMES

        return [[s for s in self.steps if s.kind.name == kind] for kind in KIND_NAMES
                if any(s.kind.name == kind for s in self.steps)]

    def downstream(self, name: str) -> list[str]:
        """Every step that (transitively) needs `name`."""
        found: list[str] = []
        frontier = {name}
        for step in self.steps:  # steps are in topological order
            if frontier & set(step.needs):
                found.append(step.name)
                frontier.add(step.name)
        return found
