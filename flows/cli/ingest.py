"""`medtx ingest mimic3|mtsamples`: load sources into the warehouse's raw tables.

The commands call medtx.ingest directly with a rich progress display (fast, no server). Under Prefect, a
dataset's ingest is a step of the pipeline: `medtx run-task ingest.<dataset>` reruns it alone.
"""

from __future__ import annotations

from pathlib import Path

from enum import Enum

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows.cli import app
from flows.cli.locking import writes_warehouse
from medtx.ingest import (
    CORE_MIMIC3_TABLES,
    DEFAULT_MAX_SHRINK,
    MIMIC3_TABLES,
    OPTIONAL_MIMIC3_TABLES,
    IngestError,
    IngestResult,
    check_dataset,
    ShrinkGuard,
    dataset_name,
    ingest_mimic3,
    ingest_mtsamples,
)
from medtx.ingest.plausibility import POLICIES
from medtx.ingest.sources import ChecksumError, DownloadError, SourceNotFound
from medtx.settings import get_settings

ingest_app = typer.Typer(help="Load MIMIC-III-format tables or MTSamples into raw.* tables.", no_args_is_help=True)
app.add_typer(ingest_app, name="ingest")

_console = Console(stderr=True)
_DB = typer.Option(None, "--db", help="Warehouse file (default: settings `db`).")
_ALLOW_SHRINK = typer.Option(
    False, "--allow-shrink", help="Accept a table dropping to 0 rows or by more than --max-shrink of its rows."
)
_MAX_SHRINK = typer.Option(
    DEFAULT_MAX_SHRINK, "--max-shrink", min=0.0, max=1.0, help="Largest accepted fraction of rows lost per table."
)
Plausibility = Enum("Plausibility", {p: p for p in POLICIES}, type=str)  # typer shows and checks the choices
_PLAUSIBILITY = typer.Option(
    Plausibility.warn, "--plausibility", help="Implausible rows (duplicate ids with other data, discharge before "
    "admission, birth after admission, years outside 1750..2300, MTSamples ids twice): warn (keep, report), "
    "reject (move to raw.ingest_rejects) or fail (change nothing). Counts per rule: raw.ingest_checks.")
# Refusals of the input (a cut or empty file, a shrink, a missing source, an implausible row under `fail`, a
# download that failed or does not match its checksum): one line, exit code 2 (bad input), no traceback.
_USER_ERRORS = (IngestError, SourceNotFound, DownloadError, ChecksumError, ValueError)
BAD_INPUT = 2


@ingest_app.command("mimic3")
@writes_warehouse("medtx ingest mimic3")
def mimic3(
    source: str = typer.Option(None, "--source", help="Folder or http(s) URL prefix with <TABLE>.csv[.gz] files "
                               "(default: the bundled MIMIC-III demo)."),
    dataset: str = typer.Option(
        None, "--dataset", help="Dataset name: lower-case letters, digits, _ (default: from the source name)."
    ),
    tables: list[str] = typer.Option(None, "--table", help="Only these tables (repeatable)."),
    db: Path = _DB,
    allow_shrink: bool = _ALLOW_SHRINK,
    max_shrink: float = _MAX_SHRINK,
    plausibility: Plausibility = _PLAUSIBILITY,
) -> None:
    """Ingest PATIENTS, ADMISSIONS, DIAGNOSES_ICD, PROCEDURES_ICD, PRESCRIPTIONS (+ NOTEEVENTS when present)
    as one unit: every table is staged and checked, then all are swapped in by one transaction."""
    settings = get_settings(db=db)
    plausibility = plausibility.value
    source = source or str(settings.data_dir / "mimic3_demo")
    names = [t.lower() for t in tables] if tables else [*CORE_MIMIC3_TABLES, *OPTIONAL_MIMIC3_TABLES]
    try:
        unknown = [t for t in names if t not in MIMIC3_TABLES]
        if unknown:
            raise ValueError(f"unknown table(s) {', '.join(unknown)}; expected {', '.join(MIMIC3_TABLES)}")
        dataset = check_dataset(dataset or dataset_name(source))
        guard = ShrinkGuard(allow_shrink, max_shrink)
        results = _with_progress(
            "mimic3",
            lambda progress: ingest_mimic3(
                settings.db, source, dataset, settings.cache_dir, names, guard=guard, progress=progress,
                plausibility=plausibility,
            ),
        )
    except _USER_ERRORS as exc:
        _fail(exc)
    _summary(results, settings.db)


@ingest_app.command("mtsamples")
@writes_warehouse("medtx ingest mtsamples")
def mtsamples(
    source: str = typer.Option(None, "--source", help="MTSamples CSV/CSV.gz file or URL (default: bundled)."),
    limit: int = typer.Option(None, "--limit", min=1, help="Keep only the first N notes."),
    db: Path = _DB,
    allow_shrink: bool = _ALLOW_SHRINK,
    max_shrink: float = _MAX_SHRINK,
    plausibility: Plausibility = _PLAUSIBILITY,
) -> None:
    """Ingest MTSamples transcriptions into raw.mtsamples (replacing it, in one transaction)."""
    settings = get_settings(db=db)
    plausibility = plausibility.value
    source = source or str(settings.data_dir / "mtsamples" / "mtsamples.csv.gz")
    try:
        guard = ShrinkGuard(allow_shrink, max_shrink)
        results = _with_progress(
            "mtsamples",
            lambda progress: [ingest_mtsamples(
                settings.db, source, settings.cache_dir, limit=limit, guard=guard, progress=progress,
                plausibility=plausibility,
            )],
        )
    except _USER_ERRORS as exc:
        _fail(exc)
    _summary(results, settings.db)


def _with_progress(what: str, run) -> list[IngestResult]:
    """Run `run(progress_callback)` (one whole, atomic ingest) under a rich display; downloads show bytes."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_console, transient=True, disable=not _console.is_terminal) as bar:
        task_id = bar.add_task(f"ingest {what}", total=None)

        def on_bytes(done: int, total: int | None) -> None:
            bar.update(task_id, completed=done, total=total)

        return run(on_bytes)


def _summary(results: list[IngestResult], db: Path) -> None:
    table = Table(title=f"ingested into {db}")
    for col in ("dataset", "table", "status", "rows loaded", "rows rejected", "seconds"):
        table.add_column(col, justify="right" if col.startswith(("rows", "sec")) else "left")
    for r in results:
        table.add_row(r.dataset, r.table, r.status, f"{r.rows_loaded:,}", f"{r.rows_rejected:,}", f"{r.seconds:.2f}")
    Console().print(table)
    if any(r.rows_rejected for r in results):
        _console.print("[yellow]rejected rows are kept in raw.ingest_rejects (file, line, column, error, raw line)")
    plausibility_summary({r.dataset for r in results}, db)


def plausibility_summary(datasets: set[str], db: Path) -> None:
    """One line per plausibility rule that found rows in these datasets at this ingest (raw.ingest_checks)."""
    from medtx.store.db import open_warehouse

    with open_warehouse(db, read_only=True) as con:
        found = con.execute("SELECT dataset, table_name, rule, n_rows, policy, example FROM raw.ingest_checks "
                            "WHERE list_contains(?::VARCHAR[], dataset) ORDER BY ALL", [sorted(datasets)]).fetchall()
    for dataset, table, rule, n, policy, example in found:
        action = "moved to raw.ingest_rejects" if policy == "reject" else "kept"
        line = f"plausibility: {table} [{dataset}]: {n:,} row(s) break rule {rule} (e.g. {example}); {action}"
        _console.print(f"[yellow]{escape(line)}", highlight=False, soft_wrap=True)


def _fail(exc: Exception) -> None:
    _console.print(f"[red]ingest failed:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(BAD_INPUT)
