"""Prefect wiring of the ingest stage: one task per dataset (its tables are one atomic unit, see
medtx/ingest/staging.py), each a one-line call into medtx.ingest.

Tasks retry on I/O errors only (network, locked warehouse file); bad input (IngestError) fails at once.
Results are `IngestResult`s, usable by later flows.
"""

from __future__ import annotations

from pathlib import Path

from dataclasses import asdict

import duckdb
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from medtx.ingest import (
    DEFAULT_MAX_SHRINK,
    IngestResult,
    ShrinkGuard,
    dataset_name,
    ingest_mimic3,
    ingest_mtsamples,
)
from medtx.settings import get_settings


def retry_on_io_error(task, task_run, state) -> bool:
    """Retry I/O failures (downloads, a warehouse file locked by another process), never bad input:
    unreadable source files surface as IngestError, so duckdb.IOException here means the warehouse file."""
    exc = state.data if isinstance(state.data, BaseException) else None
    return isinstance(exc, (OSError, duckdb.IOException))


# NO_CACHE: the same path can hold a changed file, and re-ingest must then replace the table.
_IO_TASK = dict(retries=2, retry_delay_seconds=5, retry_condition_fn=retry_on_io_error, cache_policy=NO_CACHE)


@task(name="ingest-mimic3", task_run_name="ingest-{dataset}", **_IO_TASK)
def ingest_mimic3_task(
    db: Path, source: str, dataset: str, tables: list[str] | None, cache_dir: Path, guard: ShrinkGuard,
    plausibility: str = "warn",
) -> list[IngestResult]:
    return ingest_mimic3(db, source, dataset, cache_dir, tables, guard=guard, plausibility=plausibility)


@task(name="ingest-mtsamples", task_run_name="ingest-mtsamples", **_IO_TASK)
def ingest_mtsamples_task(
    db: Path, source: str, cache_dir: Path, limit: int | None, guard: ShrinkGuard, plausibility: str = "warn"
) -> IngestResult:
    return ingest_mtsamples(db, source, cache_dir, limit=limit, guard=guard, plausibility=plausibility)


@flow(name="ingest", log_prints=True)
def ingest(
    mimic3_source: str | None = None,
    mtsamples_source: str | None = None,
    dataset: str | None = None,
    tables: list[str] | None = None,
    db: Path | None = None,
    mtsamples_limit: int | None = None,
    allow_shrink: bool = False,
    max_shrink: float = DEFAULT_MAX_SHRINK,
    plausibility: str = "warn",
) -> list[IngestResult]:
    """Ingest a MIMIC-III source (folder or URL prefix) and/or an MTSamples file into the warehouse."""
    settings = get_settings(db=db)
    guard = ShrinkGuard(allow_shrink, max_shrink)
    results = []
    if mimic3_source:
        name = dataset or dataset_name(mimic3_source)
        results += ingest_mimic3_task(settings.db, mimic3_source, name, tables, settings.cache_dir, guard,
                                      plausibility)
    if mtsamples_source:
        results.append(
            ingest_mtsamples_task(settings.db, mtsamples_source, settings.cache_dir, mtsamples_limit, guard,
                                  plausibility)
        )
    create_table_artifact(key="ingest-summary", table=[asdict(r) for r in results], description="rows per table")
    return results
