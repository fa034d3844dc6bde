"""`medtx map-codes` and `medtx build-samples`: NDC -> ATC-3 mapping and task sample tables.

Both call medtx directly (fast, no server); under Prefect they are pipeline steps (`medtx run-task NAME`).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from flows.cli import app
from flows.cli.locking import writes_warehouse
from medtx.store.db import open_warehouse
from medtx.tasks.build import EmptyCohortError, buildable_tasks
from medtx.settings import get_settings

_console = Console(stderr=True)
_DB = typer.Option(None, "--db", help="Warehouse file (default: settings `db`).")
_DATASET = typer.Option(None, "--dataset", help="EHR dataset (repeatable; default: every dataset in raw.admissions).")


def _fail(exc: Exception) -> None:
    _console.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


@app.command("map-codes")
@writes_warehouse("medtx map-codes")
def map_codes_cmd(db: Path = _DB, dataset: list[str] = _DATASET) -> None:
    """Load ref.* dictionaries and map prescriptions to ATC-3, with a coverage report per dataset."""
    from medtx.codes import map_codes

    settings = get_settings(db=db)
    try:
        with open_warehouse(settings.db) as con:
            coverage = map_codes(con, settings.data_dir, dataset or None)
    except (FileNotFoundError, ValueError) as exc:
        _fail(exc)
    table = Table("dataset", "route", "NDCs", "rows", "% of rows with NDC", title="NDC -> ATC-3 coverage")
    for name, routes in coverage.items():
        for route, (n_ndc, n_rows, pct) in sorted(routes.items()):
            table.add_row(name, route, str(n_ndc), str(n_rows), f"{100 * (pct or 0):.1f}")
    _console.print(table)


@app.command("build-samples")
@writes_warehouse("medtx build-samples")
def build_samples_cmd(
    task: str = typer.Option(None, "--task", help=f"One of {', '.join(buildable_tasks())} (default: all)."),
    db: Path = _DB,
    dataset: list[str] = _DATASET,
    seed: int = typer.Option(42, "--seed", help="Split seed (the same seed gives the same split)."),
    min_count: int = typer.Option(1, "--min-count", min=1, help="Vocabulary: minimum training count of a token."),
) -> None:
    """Build samples.* task tables, splits, vocabularies and summaries."""
    from medtx.tasks.build import build_samples

    settings = get_settings(db=db)
    if task is not None and task not in buildable_tasks():
        _fail(ValueError(f"unknown task {task!r}; expected one of {', '.join(buildable_tasks())}"))
    try:
        with open_warehouse(settings.db) as con:
            raw = build_samples(con, settings.data_dir, [task] if task else None, dataset or None,
                                seed=seed, min_count=min_count)
        counts = {f"{t}/{d}": n for (t, d), n in raw.items()}
    except (EmptyCohortError, FileNotFoundError, ValueError) as exc:
        _fail(exc)
    table = Table("task/dataset", "samples", title="samples built")
    for key, n in counts.items():
        table.add_row(key, str(n))
    _console.print(table)
