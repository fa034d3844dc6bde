"""Step kind `codes`: map one dataset's prescriptions NDC -> ATC-3 into core.* (with the coverage report)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from medtx.codes import mapping
from medtx.pipeline.config import PipelineConfig
from medtx.pipeline.kinds import Paths, PlanContext, Spec, StepKind
from medtx.pipeline.step import Step
from medtx.store.db import open_warehouse


def plan(cfg: PipelineConfig, ctx: PlanContext, earlier: Sequence[Step]) -> list[Step]:
    """One step per dataset, after the ingest that loads its prescriptions and the reference tables."""
    steps = []
    for ds in cfg.datasets:
        rx = tuple(s.name for s in earlier
                   if s.kind.name == "ingest" and s.dataset == ds.key and "raw.prescriptions" in s.writes)
        steps.append(Step(f"codes.{ds.key}", KIND, {}, ds.key, needs=(*rx, "reference"),
                          reads=mapping.READS, writes=mapping.WRITES, scope={"dataset": ds.key}))
    return steps


def run(spec: Spec, paths: Paths) -> dict[str, Any]:
    with open_warehouse(paths["db"]) as con:
        return {"mapped_rows": mapping.map_prescriptions(con, spec["dataset"])}


KIND = StepKind("codes", plan, run, lambda step: ("medtx.codes.mapping",))
