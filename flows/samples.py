"""Prefect wiring of the code-mapping and sample-building stage: one-line tasks calling medtx.

`map_codes` reloads ref.* and maps prescriptions for the given datasets; `build_samples(task)` builds one
task (or all). Tasks take the warehouse path, never a connection; writes are transactional, so a retry after
a locked-file error is safe.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from medtx.codes import map_codes as _map_codes
from medtx.store.db import open_warehouse
from medtx.tasks.build import build_samples as _build_samples
from medtx.settings import get_settings


def retry_on_lock(task, task_run, state) -> bool:
    """Retry only I/O failures (the warehouse file locked by another process), never bad input."""
    exc = state.data if isinstance(state.data, BaseException) else None
    return isinstance(exc, (OSError, duckdb.IOException))


_WRITE_TASK = dict(retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE, retry_condition_fn=retry_on_lock)


def _map(db: Path, data_dir: Path, datasets: list[str] | None) -> dict:
    with open_warehouse(db) as con:
        return _map_codes(con, data_dir, datasets)


def _build(db: Path, data_dir: Path, task_name: str | None, datasets: list[str] | None, seed: int,
           fractions: tuple[float, float, float], min_count: int) -> dict[str, int]:
    with open_warehouse(db) as con:
        counts = _build_samples(con, data_dir, [task_name] if task_name else None, datasets,
                                seed=seed, fractions=fractions, min_count=min_count)
    return {f"{t}/{d}": n for (t, d), n in counts.items()}


@task(name="map-codes", task_run_name="map-codes", **_WRITE_TASK)
def map_codes(db: Path, data_dir: Path, datasets: list[str] | None = None) -> dict:
    return _map(db, data_dir, datasets)


@task(name="build-samples", task_run_name="build-samples-{task_name}", **_WRITE_TASK)
def build_samples(db: Path, data_dir: Path, task_name: str | None = None, datasets: list[str] | None = None,
                  seed: int = 42, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
                  min_count: int = 1) -> dict[str, int]:
    return _build(db, data_dir, task_name, datasets, seed, fractions, min_count)


@flow(name="samples")
def samples_flow(db: Path | None = None, task_name: str | None = None, datasets: list[str] | None = None,
                 seed: int = 42, min_count: int = 1, map_first: bool = True) -> dict[str, int]:
    """map_codes (optional) then build_samples, for the CLI's `--prefect` runs and tests."""
    settings = get_settings(db=db)
    if map_first:
        map_codes(settings.db, settings.data_dir, datasets)
    return build_samples(settings.db, settings.data_dir, task_name, datasets, seed, (0.7, 0.1, 0.2), min_count)
