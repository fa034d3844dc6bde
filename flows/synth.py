"""Prefect wiring of the synthetic-cohort generator: one task that writes the folder, one that loads its
oracle into the warehouse. The end-to-end pipeline (flows/pipeline.py) runs `synth:N` sources through
medtx.pipeline.steps; these tasks serve flows and users that want the generator alone.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from medtx.store.db import open_warehouse
from medtx.synth import SynthSummary, generate_mimic3
from medtx.synth.oracle import load_oracle


# NO_CACHE: generation is cheap next to the risk of a cached result pointing at a deleted or edited folder.
@task(name="synth-mimic3", task_run_name="synth-{n_patients}-seed{seed}", cache_policy=NO_CACHE)
def synth_mimic3(out_dir: Path, n_patients: int, seed: int = 0, notes: bool = False,
                 plant_death_code: bool = False) -> SynthSummary:
    return generate_mimic3(Path(out_dir), n_patients, seed=seed, notes=notes, plant_death_code=plant_death_code)


@task(name="load-synth-oracle", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def load_synth_oracle(db: Path, source_dir: Path, dataset: str) -> dict[str, int]:
    with open_warehouse(db) as con:
        return load_oracle(con, Path(source_dir), dataset)


@flow(name="synth")
def synth(out_dir: Path, n_patients: int, seed: int = 0, notes: bool = False,
          plant_death_code: bool = False) -> SynthSummary:
    """Generate a synthetic MIMIC-III-format cohort (tables, oracle files, README) into `out_dir`."""
    return synth_mimic3(out_dir, n_patients, seed, notes, plant_death_code)
