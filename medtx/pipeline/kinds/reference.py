"""Step kind `reference`: (re)build the ref.* code dictionaries and drug maps from the bundled data, once per
warehouse (not per dataset)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medtx.codes.reference import WRITES
from medtx.pipeline.config import PipelineConfig
from medtx.pipeline.kinds import Paths, PlanContext, Spec, StepKind
from medtx.pipeline.step import Step
from medtx.store.db import open_warehouse


def plan(cfg: PipelineConfig, ctx: PlanContext, earlier: Sequence[Step]) -> list[Step]:
    from medtx.codes.reference import reference_files

    if not cfg.datasets:
        return []
    files = tuple(str(p) for p in reference_files(ctx.data_dir).values())
    return [Step("reference", KIND, {}, writes=WRITES, files=files)]


def run(spec: Spec, paths: Paths) -> dict[str, Any]:
    from medtx.codes.reference import load_reference_tables

    with open_warehouse(paths["db"]) as con:
        return load_reference_tables(con, Path(paths["data_dir"]))


KIND = StepKind("reference", plan, run, lambda step: ("medtx.codes.reference",))
