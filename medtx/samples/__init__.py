"""Task sample builders (`samples.*`): one module per task, plus splits, vocabularies and the reference.

`build_samples(con, ...)` is the entry point the flow and the CLI call.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb

from medtx.samples.common import EmptyCohortError, create_visits, ehr_datasets
from medtx.samples.drug_rec import build_drug_rec
from medtx.samples.faq import build_faq
from medtx.samples.next_visit import build_next_visit
from medtx.samples.readmission import build_readmission
from medtx.samples.specialty import build_specialty
from medtx.samples.splits import DEFAULT_FRACTIONS, DEFAULT_SEED
from medtx.samples.vocab import Vocab, load_vocab

log = logging.getLogger("medtx.samples")

EHR_TASKS = ("drug_rec", "next_visit", "readmission")
TEXT_TASKS = ("specialty", "faq")
TASKS = EHR_TASKS + TEXT_TASKS
_EHR_BUILDERS = {"drug_rec": build_drug_rec, "next_visit": build_next_visit, "readmission": build_readmission}

__all__ = ["EHR_TASKS", "TASKS", "EmptyCohortError", "Vocab", "build_samples", "load_vocab"]


def build_samples(
    con: duckdb.DuckDBPyConnection,
    data_dir: Path,
    tasks: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    *,
    seed: int = DEFAULT_SEED,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    min_count: int = 1,
    k_folds: int = 5,
) -> dict[tuple[str, str], int]:
    """Build the given tasks (default: all) for the given EHR datasets (default: every dataset in
    raw.admissions). Returns sample counts per (task, dataset).

    A task asked for by name fails with `EmptyCohortError` when it has nothing to build from; when building
    everything, such a task is logged and skipped so the others still run.
    """
    explicit = tasks is not None
    tasks = list(tasks) if explicit else list(TASKS)
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; expected one of {list(TASKS)}")
    counts: dict[tuple[str, str], int] = {}
    ehr = [t for t in tasks if t in EHR_TASKS]
    if ehr:
        datasets = list(datasets) if datasets is not None else ehr_datasets(con)
        if not datasets:
            message = "raw.admissions is empty: ingest an EHR dataset (`medtx ingest mimic3` loads the bundled demo) before building EHR samples"
            if explicit:
                raise EmptyCohortError(message)
            log.warning("%s; skipping %s", message, ", ".join(ehr))
        for dataset in datasets:
            create_visits(con, dataset)
            for task in ehr:
                counts[(task, dataset)] = _guarded(explicit, task, lambda t=task, d=dataset: _EHR_BUILDERS[t](
                    con, d, seed=seed, fractions=fractions, min_count=min_count))
            con.execute("DROP TABLE IF EXISTS _samples_visits")
    if "specialty" in tasks:
        counts[("specialty", "mtsamples")] = _guarded(explicit, "specialty", lambda: build_specialty(
            con, seed=seed, fractions=fractions, min_count=min_count))
    if "faq" in tasks:
        counts[("faq", "mental_health_faq")] = _guarded(explicit, "faq", lambda: build_faq(
            con, data_dir, seed=seed, k_folds=k_folds))
    return {k: v for k, v in counts.items() if v is not None}


def _guarded(explicit: bool, task: str, build) -> int | None:
    """Run one builder; when building everything, an empty cohort is a warning, not a failure."""
    try:
        return build()
    except EmptyCohortError as exc:
        if explicit:
            raise
        log.warning("skipping %s: %s", task, exc)
        return None
