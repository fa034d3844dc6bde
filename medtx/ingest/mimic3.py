"""Ingest MIMIC-III-format tables (the bundled demo, a synthetic cohort, a user's full MIMIC-III, or a URL
prefix such as PyHealth's Synthetic_MIMIC-III bucket) into `raw.*`, one table per call.

A source is a folder or an http(s) URL prefix holding `<TABLE>.csv` or `<TABLE>.csv.gz` (any name case),
or a single table file. Each call replaces one dataset's rows of all the tables asked for in one transaction.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from medtx.ingest.loader import IngestError, IngestResult
from medtx.ingest.schema import CORE_MIMIC3_TABLES, MIMIC3_TABLES, OPTIONAL_MIMIC3_TABLES
from medtx.ingest.sources import SourceFile, SourceNotFound, dataset_name, fetch, is_url
from medtx.ingest.staging import ShrinkGuard, TableSource, ingest_tables

log = logging.getLogger("medtx.ingest")

_DATASET_NAME = re.compile(r"^[a-z0-9_]+$")
_TABLE_FILE = re.compile(r"^(?P<stem>[A-Za-z_]+)\.csv(?:\.gz)?$", re.I)


def check_dataset(dataset: str) -> str:
    """Dataset names are `[a-z0-9_]+` (they become keys in every later table and in file names)."""
    if not _DATASET_NAME.match(dataset or ""):
        raise ValueError(f"dataset name {dataset!r} must match [a-z0-9_]+")
    return dataset


def _spec(table: str):
    try:
        return MIMIC3_TABLES[table.lower()]
    except KeyError:
        raise IngestError(f"unknown MIMIC-III table {table!r}; expected one of {', '.join(MIMIC3_TABLES)}") from None


def resolve_mimic3_source(
    source: str | Path,
    table: str,
    cache_dir: Path,
    *,
    progress: Callable[[int, int | None], None] | None = None,
) -> SourceFile | None:
    """The file holding `table` in `source`, downloaded into `cache_dir` for URLs; None when the source has
    no such table. A folder is searched case-insensitively for `<table>.csv[.gz]` (`.csv` preferred: DuckDB
    reads it in parallel); a URL prefix is tried as `<TABLE>.csv.gz`, `<TABLE>.csv`, then lower-case names.
    A source that is itself a table file is returned only for its own table."""
    spec = _spec(table)
    text = str(source)
    single = _TABLE_FILE.match(text.rstrip("/").rsplit("/", 1)[-1])
    if single:  # a file (path or URL) named after one table
        if single["stem"].lower() != spec.name:
            return None
        try:
            return fetch(text, cache_dir, progress=progress)
        except SourceNotFound:
            return None
    if is_url(text):
        prefix = text.rstrip("/")
        for stem in (spec.file_stem, spec.name):
            for ext in (".csv.gz", ".csv"):
                try:
                    return fetch(f"{prefix}/{stem}{ext}", cache_dir, progress=progress)
                except SourceNotFound:
                    continue
        return None
    folder = Path(text).expanduser()
    if not folder.is_dir():
        raise IngestError(f"{folder}: MIMIC-III source folder does not exist")
    found = sorted(
        (p for p in folder.iterdir() if p.is_file() and p.name.lower() in (f"{spec.name}.csv", f"{spec.name}.csv.gz")),
        key=lambda p: (p.name.lower().endswith(".gz"), p.name),
    )
    if len(found) > 1:
        log.info("%s: several files for %s (%s); using %s", folder, table, [p.name for p in found], found[0].name)
    return fetch(found[0], cache_dir) if found else None


def ingest_mimic3_table(
    db: Path,
    table: str,
    source: str | Path,
    dataset: str | None = None,
    cache_dir: Path | None = None,
    *,
    guard: ShrinkGuard = ShrinkGuard(),
    progress: Callable[[int, int | None], None] | None = None,
) -> IngestResult:
    """Load one MIMIC-III table of `source` into `raw.<table>` as `dataset` (default: derived from the
    source name): `ingest_mimic3` for one table."""
    return ingest_mimic3(db, source, dataset, cache_dir, [table], guard=guard, progress=progress)[0]


def ingest_mimic3(
    db: Path,
    source: str | Path,
    dataset: str | None = None,
    cache_dir: Path | None = None,
    tables: Iterable[str] | None = None,
    *,
    guard: ShrinkGuard = ShrinkGuard(),
    progress: Callable[[int, int | None], None] | None = None,
    plausibility: str = "warn",
) -> list[IngestResult]:
    """Replace `dataset`'s rows of every table of a MIMIC-III source (default: all tables) as one unit:
    all are staged and checked, then swapped in by one transaction, or nothing changes (see staging.py).

    A core table missing from the source is an error; NOTEEVENTS missing is logged as 'absent' and leaves
    the dataset with no notes (subject to the row-count guard like any other table).
    """
    names = [t.lower() for t in tables] if tables is not None else [*CORE_MIMIC3_TABLES, *OPTIONAL_MIMIC3_TABLES]
    dataset = check_dataset(dataset or dataset_name(source))
    cache_dir = cache_dir or Path(db).parent / "cache"
    items = []
    for table in names:
        spec = _spec(table)
        resolved = resolve_mimic3_source(source, spec.name, cache_dir, progress=progress)
        if resolved is None and spec.name not in OPTIONAL_MIMIC3_TABLES:
            raise IngestError(f"{source}: no {spec.file_stem}.csv or {spec.file_stem}.csv.gz found (required table)")
        items.append(TableSource(spec, resolved, str(source)))
    return ingest_tables(Path(db), dataset, items, others=MIMIC3_TABLES, guard=guard,
                         command="medtx ingest mimic3", plausibility=plausibility)
