"""Step kind `synth`: generate a synthetic MIMIC-III-format cohort (CSV files + oracle files) for a
`synth:N` dataset; its ingest steps then load the folder like any other (kinds/ingest.py)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medtx.pipeline.config import PipelineConfig
from medtx.pipeline.kinds import Paths, PlanContext, Spec, StepKind
from medtx.pipeline.step import Step


def cohort_folder(ds: Any, synth_dir: Path) -> str:
    """Where a synthetic dataset's files are generated (and read back by its ingest steps)."""
    return str(synth_dir / f"{ds.key}-n{ds.n_patients}-seed{ds.seed}{'-notes' if ds.notes else ''}")


def plan(cfg: PipelineConfig, ctx: PlanContext, earlier: Sequence[Step]) -> list[Step]:
    """One step per synthetic dataset; generation writes files only."""
    return [Step(f"synth.{ds.key}", KIND,
                 {"n_patients": ds.n_patients, "seed": ds.seed, "notes": ds.notes,
                  "out_dir": cohort_folder(ds, ctx.synth_dir)},
                 ds.key, scope={"dataset": ds.key})
            for ds in cfg.datasets if ds.kind == "synth"]


def run(spec: Spec, paths: Paths) -> dict[str, Any]:
    from medtx.synth.generate import generate_mimic3

    p = spec["params"]
    summary = generate_mimic3(Path(p["out_dir"]), n_patients=p["n_patients"], seed=p["seed"], notes=p["notes"])
    return {"out_dir": str(summary.out_dir), "rows": summary.rows, "seconds": summary.seconds}


KIND = StepKind("synth", plan, run, lambda step: ("medtx.synth.generate",))
