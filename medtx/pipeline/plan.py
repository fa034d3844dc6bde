"""The pipeline as data: every step a config implies, with what it reads, writes and depends on.

Each kind of step plans its own steps (medtx/pipeline/kinds/<kind>.py), in layer order; the flow walks the plan
layer by layer, the cache key of a step is built from the fingerprints named here, and `medtx run-task NAME` looks
a step up by its name. Step names read like paths: `ingest.mimic3_demo`, `samples.drug_rec.synth_2000`,
`train.drug_rec.mimic3_demo.logreg.s42`.
"""

from __future__ import annotations

from pathlib import Path

from medtx.pipeline.config import PipelineConfig
from medtx.pipeline.kinds import PlanContext, kinds
from medtx.pipeline.step import Plan, Step

__all__ = ["Plan", "Step", "build_plan"]


def build_plan(cfg: PipelineConfig, synth_dir: Path, data_dir: Path) -> Plan:
    """Every step of a config, in dependency order (synth, ingest, reference, codes, samples, train).

    `synth_dir` is where generated cohorts are written; `data_dir` holds the bundled dictionaries, drug
    maps and FAQ, whose files are hashed into the cache keys of the steps that read them.
    """
    ctx = PlanContext(Path(synth_dir), Path(data_dir))
    steps: list[Step] = []
    for kind in kinds():
        steps += kind.plan(cfg, ctx, tuple(steps))
    return Plan(tuple(steps))
