"""Prefect wiring of MEDS export and import: one task each, a one-line call into medtx.meds."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from medtx.ingest import ShrinkGuard
from medtx.store.db import open_warehouse
from medtx.meds import ExportResult, MedsIngestResult, export_meds, ingest_meds
from medtx.meds.export import protected_paths
from medtx.settings import get_settings


@task(name="export-meds", task_run_name="export-meds-{dataset}", cache_policy=NO_CACHE)
def export_meds_task(db: Path, dataset: str, out: Path, shard_rows: int, labels: list[str],
                     overwrite: bool) -> ExportResult:
    with open_warehouse(db) as con:
        return export_meds(con, dataset, out, shard_rows=shard_rows, labels=labels, overwrite=overwrite,
                           protected=protected_paths(get_settings(db=db)))


@task(name="ingest-meds", task_run_name="ingest-meds-{dataset}", cache_policy=NO_CACHE)
def ingest_meds_task(db: Path, source: str, dataset: str | None, codes: str | None,
                     guard: ShrinkGuard, plausibility: str = "warn", cast_types: bool = False) -> MedsIngestResult:
    return ingest_meds(db, source, dataset, codes, guard=guard, plausibility=plausibility, cast_types=cast_types)


@flow(name="meds", log_prints=True)
def meds_flow(*, export_dataset: str | None = None, out: Path | None = None, shard_rows: int = 2_000_000,
              labels: list[str] | None = None, overwrite: bool = False, source: str | None = None,
              dataset: str | None = None, codes: str | None = None, db: Path | None = None,
              guard: ShrinkGuard | None = None, plausibility: str = "warn", cast_types: bool = False):
    """Export a dataset as MEDS (export_dataset + out) or import a MEDS folder (source)."""
    settings = get_settings(db=db)
    if export_dataset:
        result = export_meds_task(settings.db, export_dataset, out, shard_rows, labels or [], overwrite)
    else:
        result = ingest_meds_task(settings.db, source, dataset, codes, guard or ShrinkGuard(), plausibility, cast_types)
    create_table_artifact(key="meds-summary", table=[{k: str(v) for k, v in asdict(result).items()}])
    return result
