"""The kinds of pipeline step, one module each, in the order their layers run.

A kind module declares `KIND = StepKind(name, plan, run, code)`:
- `plan(cfg, ctx, earlier)`: the steps of this kind a config implies (what each reads, writes, needs and hashes
  into its cache key), given the steps planned before it;
- `run(spec, paths)`: what one step does (a short call into the stage that owns the work; returns a small
  JSON-able dict); training steps take (spec, package, result_dir, ...) instead (kinds/train.py);
- `code(step)`: the medtx modules whose source (import closure) is in the step's cache key.

Adding a kind is adding a module here and naming it in ORDER below (docs/EXTENDING.md, "Add a step kind").
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from medtx.pipeline.config import PipelineConfig
    from medtx.pipeline.step import Step

Spec = dict[str, Any]
Paths = dict[str, str]

# Layers run in this order; steps inside a layer do not depend on each other.
ORDER = ("synth", "ingest", "reference", "codes", "samples", "train")
KIND_NAMES = ORDER


@dataclass(frozen=True)
class PlanContext:
    """Where planned steps find their files: generated cohorts (`synth_dir`) and the bundled data (`data_dir`)."""

    synth_dir: Path
    data_dir: Path


@dataclass(frozen=True)
class StepKind:
    name: str
    plan: Callable[[PipelineConfig, PlanContext, Sequence[Step]], list[Step]]
    run: Callable[..., dict[str, Any]]
    code: Callable[[Step], tuple[str, ...]]


def kinds() -> tuple[StepKind, ...]:
    """Every step kind, in layer order."""
    found = []
    for name in ORDER:
        kind = getattr(importlib.import_module(f"{__name__}.{name}"), "KIND", None)
        if not isinstance(kind, StepKind) or kind.name != name:
            raise TypeError(f"medtx/pipeline/kinds/{name}.py must define KIND = StepKind({name!r}, ...)")
        found.append(kind)
    return tuple(found)


def kind_named(name: str) -> StepKind:
    """The step kind called `name`; an unknown one fails naming the known kinds."""
    if name not in ORDER:
        raise ValueError(f"unknown step kind {name!r}; expected one of {', '.join(ORDER)}")
    return kinds()[ORDER.index(name)]
