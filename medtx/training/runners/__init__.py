"""The runners: one per family of models, each training one run from its training package's tables.

Every run trains the same way (medtx.worker.train_run, what the pipeline, `medtx train`, benchmarks and tests
reach through a training package): `runner_for(task, model)` picks the runner through the model registry's
family (ModelSpec.family: ehr and ehr_baseline -> EHR, text and text_baseline -> text classification, faq ->
FAQ), `prepare` checks the run's settings and returns a `Run`, which reads its samples from the package's tables,
says what ml.runs.config records, and trains and evaluates (a `RunResults`). Nothing outside this folder names a
family or a model to decide how a run trains.

Imports torch, numpy, pyarrow, scikit-learn and transformers, never polars or DuckDB (the worker's import
contract in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from medtx.tasks import Task
from medtx.training.results import RunResults

OnEpoch = Callable[[int, Mapping[str, float]], None]  # one epoch's figures, written as ml.epochs rows


class Run(Protocol):
    """One prepared run: its task, model, seed and checked settings."""

    def samples(self, tables: Mapping[str, pa.Table], dataset: str) -> Any: ...  # from the package's tables

    def describe(self, samples: Any) -> dict[str, Any]: ...  # its ml.runs.config

    def train(self, samples: Any, folder: Path, on_epoch: OnEpoch, cache: Path | None = None) -> RunResults: ...


class Runner(Protocol):
    """How the runs of one family of models train."""

    model_families: tuple[str, ...]  # the model registry's families it trains (ModelSpec.family)
    modules: tuple[str, ...]  # its code: a training step's cache key holds their import closure
    code_parts: tuple[str, ...]  # the medtx subpackages whose source is a run's ml.runs.code_version (() = all)

    def serves(self, task: Task) -> bool: ...  # the tasks it trains

    def prepare(self, task: Task, model: str, seed: int, overrides: Mapping[str, Any], *,
                device: str = "auto") -> Run: ...  # an unknown model or setting: ValueError naming the known ones

    def config_classes(self, spec: Any, task: Task) -> list[tuple[type, dict[str, Any]]]: ...
    # (config dataclass, its defaults for the task) for each config a run's overrides go to (medtx.pipeline.checks)


def runners() -> tuple[Runner, ...]:
    from medtx.training.runners import ehr, faq, text

    return (ehr.RUNNER, text.RUNNER, faq.RUNNER)


def runner_for(task: Task, model: str | None = None) -> Runner:
    """The runner of `model`'s family (the registry's model serving `task` under that name); without a model, or
    for a model that does not serve the task, the runner that trains the task (whose `prepare` names the models
    it knows). A task no runner trains is a ValueError."""
    from medtx.models.registry import specs

    if model is not None:
        family = next((s.family for s in specs() if s.name == model and s.serves(task)), None)
        chosen = next((r for r in runners() if family in r.model_families), None)
        if chosen is not None and chosen.serves(task):
            return chosen
    chosen = next((r for r in runners() if r.serves(task)), None)
    if chosen is None:
        raise ValueError(f"no runner trains task {task.name!r} ({task.family}, {task.kind})")
    return chosen


def trains(task: Task) -> bool:
    """Whether a runner trains the task."""
    return any(r.serves(task) for r in runners())
