"""Step kind `ingest`: load a dataset's tables into raw.* as one unit (medtx/ingest/staging.py: all staged and
checked, then swapped in by one transaction), or a MEDS folder, a synthetic cohort's oracle files, or the
MTSamples corpus."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from medtx.pipeline.config import PipelineConfig
from medtx.pipeline.kinds import Paths, PlanContext, Spec, StepKind
from medtx.pipeline.kinds.synth import cohort_folder
from medtx.pipeline.step import Step
from medtx.store.db import open_warehouse
from medtx.synth.oracle import WRITES as SYNTH_ORACLE

MIMIC_TABLES = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents")
RAW_MIMIC = tuple(f"raw.{t}" for t in MIMIC_TABLES)


def plan(cfg: PipelineConfig, ctx: PlanContext, earlier: Sequence[Step]) -> list[Step]:
    """One step per dataset (plus its oracle tables when synthetic), and one for MTSamples."""
    guard = {"allow_shrink": cfg.ingest.allow_shrink, "max_shrink": cfg.ingest.max_shrink,
             "plausibility": cfg.ingest.plausibility}
    generated = {s.dataset: s.name for s in earlier if s.kind.name == "synth"}
    steps = []
    for ds in cfg.datasets:
        scope = {"dataset": ds.key}
        source = cohort_folder(ds, ctx.synth_dir) if ds.kind == "synth" else cfg.resolve(ds.source)
        needs = (generated[ds.key],) if ds.key in generated else ()
        if ds.kind == "meds":
            steps.append(_meds_step(ds, source, scope, guard))
            continue
        files = () if ds.kind == "url" else (source,)
        tables = list(ds.tables or MIMIC_TABLES)
        steps.append(Step(f"ingest.{ds.key}", KIND, {"source": source, "tables": tables, **guard}, ds.key,
                          needs=needs, writes=tuple(f"raw.{t}" for t in tables), files=files, scope=scope))
        if ds.kind == "synth":
            steps.append(Step(f"ingest.{ds.key}.oracle", KIND, {"source": source, "table": "oracle"}, ds.key,
                              needs=needs, writes=SYNTH_ORACLE, files=files, scope=scope))
    if cfg.mtsamples:
        src = cfg.resolve(cfg.mtsamples.source)
        steps.append(Step("ingest.mtsamples", KIND, {"source": src, "table": "mtsamples", **guard}, "mtsamples",
                          writes=("raw.mtsamples",), files=(src,)))
    return steps


def _meds_step(ds: Any, source: str, scope: dict, guard: dict) -> Step:
    """A MEDS folder loads in one step (one transaction over every raw table, under the same row-count guard
    as a CSV dataset); its cache key covers each shard (symlinked folders included, as the import reads
    them) and metadata file (the folder itself has no top-level files)."""
    from medtx.meds.validate import MedsFormatError, shard_files

    root = Path(source)
    try:
        shards = shard_files(root / "data") if (root / "data").is_dir() else []
    except MedsFormatError:  # a dangling link or a loop: the import says so; the key then covers the folder
        shards = []
    files = tuple(str(p) for p in sorted([*shards, *root.glob("metadata/*")]))
    params = {"source": source, "table": "meds", "codes": ds.codes, **({"cast_types": True} if ds.cast_types else {}),
              **guard}
    return Step(f"ingest.{ds.key}.meds", KIND, params, ds.key,
                writes=(*RAW_MIMIC, "raw.meds_splits", "raw.meds_codes"), files=files or (source,), scope=scope)


def steps_of(steps: Sequence[Step], dataset: str) -> tuple[str, ...]:
    """The names of a dataset's ingest steps."""
    return tuple(s.name for s in steps if s.kind.name == "ingest" and s.dataset == dataset)


def run(spec: Spec, paths: Paths) -> dict[str, Any]:
    from medtx.ingest import ShrinkGuard, ingest_mimic3, ingest_mtsamples

    db, cache_dir, p = Path(paths["db"]), Path(paths["cache_dir"]), spec["params"]
    if p.get("table") == "oracle":
        from medtx.synth.oracle import load_oracle

        with open_warehouse(db) as con:
            return {"rows": load_oracle(con, Path(p["source"]), dataset=spec["dataset"])}
    guard = ShrinkGuard(p.get("allow_shrink", False), p.get("max_shrink", 0.5))
    policy = p.get("plausibility", "warn")
    if p.get("table") == "meds":
        from medtx.meds import ingest_meds

        meds = ingest_meds(db, p["source"], spec["dataset"], p.get("codes"), guard=guard, command="medtx pipeline",
                           plausibility=policy, cast_types=p.get("cast_types", False))
        return {"rows": meds.rows, "events": meds.events, "events_mapped": meds.events_mapped}
    if p.get("table") == "mtsamples":
        results = [ingest_mtsamples(db, p["source"], cache_dir, guard=guard, plausibility=policy)]
    else:
        results = ingest_mimic3(db, p["source"], spec["dataset"], cache_dir, p["tables"], guard=guard,
                                plausibility=policy)
    return {r.table: {"rows_loaded": r.rows_loaded, "rows_rejected": r.rows_rejected, "status": r.status}
            for r in results}


def code(step: Step) -> tuple[str, ...]:
    table = step.params.get("table")
    return {"oracle": ("medtx.synth.oracle",), "meds": ("medtx.meds.ingest",)}.get(table, ("medtx.ingest",))


KIND = StepKind("ingest", plan, run, code)
