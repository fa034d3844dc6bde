"""`medtx status`, `medtx leaderboard`, `medtx --version`: what the warehouse holds, from the terminal.

`status` reads the live warehouse read-only (the dashboard marts' own SELECTs, so the figures match the
overview page); while a pipeline holds the file it reads the published snapshot instead and says so.
`leaderboard` is the dashboard's leaderboard (same queries over the published snapshot) as a rich table.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import duckdb
import typer
from rich.console import Console
from rich.table import Table

from flows.cli import app
from medtx.store.db import open_warehouse
from medtx.publish.marts import MARTS
from medtx.settings import get_settings
from medtx.tasks import all_tasks



def _out() -> Console:
    """stdout; piped or captured output is not cut to 80 columns (a table's cells would become `…`)."""
    import sys

    return Console(width=None if sys.stdout.isatty() else 160)
_err = Console(stderr=True)
_DB = typer.Option(None, "--db", help="Warehouse file (default: settings `db`).")


def _version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"medtx {version('medtx')}")
        except PackageNotFoundError:  # running from a checkout that was never pip-installed
            typer.echo("medtx (not installed: version unknown)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the medtx version and exit."),
) -> None:
    """Clinical-transformer pipeline: ingest -> map codes -> samples -> train/evaluate -> dashboard."""


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    try:
        return con.execute(sql).fetchall()
    except duckdb.CatalogException:  # a stage that has not run yet in an old warehouse
        return []


def _status_tables(con: duckdb.DuckDBPyConnection) -> list[Table]:
    cohort = Table("dataset", "table", "rows", title="Raw tables per dataset")
    for dataset, name, n in _rows(con, MARTS["cohort_counts"].select + " ORDER BY 1, 2"):
        cohort.add_row(dataset, name, f"{n:,}")
    samples = Table("dataset", "task", "split", "samples", title="Samples per task and split")
    for dataset, task, split, n in _rows(con, MARTS["sample_counts"].select + " ORDER BY 1, 2, 3"):
        samples.add_row(dataset, task, split, f"{n:,}")
    runs = Table("dataset", "task", "status", "runs", title="Training runs")
    for dataset, task, status, n in _rows(con, "SELECT coalesce(dataset, ''), task, status, count(*) FROM ml.runs "
                                               "GROUP BY ALL ORDER BY 1, 2, 3"):
        runs.add_row(dataset, task, status, str(n))
    last = Table("pipeline run", "status", "started", "finished", "steps", "error", title="Last pipeline run")
    for rid, status, started, finished, steps, error in _rows(con, """
            SELECT r.pipeline_run_id, r.status, r.started_at, r.finished_at,
                   (SELECT string_agg(n || ' ' || state, ', ' ORDER BY state) FROM
                      (SELECT state, count(*) AS n FROM ml.pipeline_steps s
                       WHERE s.pipeline_run_id = r.pipeline_run_id GROUP BY state)), r.error
            FROM ml.pipeline_runs r ORDER BY r.started_at DESC LIMIT 1"""):
        last.add_row(rid, status, f"{started:%Y-%m-%d %H:%M:%S}",
                     f"{finished:%Y-%m-%d %H:%M:%S}" if finished else "—",
                     steps or "—", (error or "")[:120])
    return [t for t in (cohort, samples, runs, last) if t.row_count] or []


@app.command("status")
def status(db: Path = _DB) -> None:
    """What the warehouse holds per dataset: raw tables and rows, samples per task and split, runs, last
    pipeline run."""
    settings = get_settings(db=db)
    source = settings.db
    try:
        with open_warehouse(source, read_only=True) as con:
            tables = _status_tables(con)
    except FileNotFoundError:
        _err.print(f"[red]no warehouse at {source}[/red]: run `medtx pipeline --db {source}` "
                   f"or `medtx ingest mimic3 --db {source}`", highlight=False)
        raise typer.Exit(1) from None
    except duckdb.IOException:  # a pipeline is writing: read what it last published
        source = settings.snapshot
        if not source.exists():
            _err.print(f"[red]{settings.db} is locked by a running writer and nothing is published yet[/red]")
            raise typer.Exit(1) from None
        _err.print(f"{settings.db} is being written; showing the published snapshot {source}", highlight=False)
        with open_warehouse(source, read_only=True) as con:
            tables = _status_tables(con)
    _out().print(f"warehouse {source}", highlight=False)
    if not tables:
        _out().print(f"empty: run `medtx pipeline --db {settings.db}` to fill it", highlight=False)
    for table in tables:
        _out().print(table)


def _plain_model(markdown: str) -> str:
    """The leaderboard rows link the model name for the web page; the terminal shows the text."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown)


@app.command("leaderboard")
def leaderboard(
    task: str = typer.Option(..., "--task",
                             help=", ".join(t.name for t in all_tasks()) + "."),
    dataset: str = typer.Option(None, "--dataset", help="Dataset (default: the one with the most test patients)."),
    averaging: str = typer.Option(None, "--averaging", help="visit or patient (default: the first present)."),
    n_metrics: int = typer.Option(2, "--metrics", min=1, help="How many metrics to show (the dashboard's order)."),
    safedrug_sd: bool = typer.Option(False, "--safedrug-sd",
                                     help="Also show the SafeDrug convention (sd over 10 subsamples of 80% of test "
                                          "patients, about half as wide), for comparing with papers."),
    db: Path = _DB,
) -> None:
    """The dashboard's leaderboard of a task as a terminal table: each test metric with its 95% interval (bootstrap
    with replacement over test patients), the paired verdict against the reference baseline, n test patients."""
    from dashboard import intervals as ci
    from dashboard import queries
    from dashboard.pages.leaderboard import _field, headline_metric, leaderboard_rows

    snapshot = get_settings(db=db).snapshot
    if not queries.has_snapshot(snapshot):
        _err.print(f"[red]no published snapshot at {snapshot}[/red]: run `medtx pipeline` first", highlight=False)
        raise typer.Exit(1)
    pairs = queries.task_datasets(snapshot)
    present = sorted(set(pairs.filter(pairs["task"] == task)["dataset"].to_list())) if pairs.height else []
    if not present:
        tasks = sorted(set(pairs["task"].to_list())) if pairs.height else []
        _err.print(f"[red]no runs of task {task!r}[/red]; tasks with runs: {', '.join(tasks) or 'none'}",
                   highlight=False)
        raise typer.Exit(1)
    if dataset is None:
        dataset = queries.default_leaderboard_dataset(snapshot, task)
    elif dataset not in present:
        _err.print(f"[red]no runs of {task} on dataset {dataset!r}[/red]; datasets: {', '.join(present)}",
                   highlight=False)
        raise typer.Exit(1)
    conventions = queries.averaging_options(snapshot, task, dataset)
    averaging = averaging or (conventions[0] if conventions else None)
    headline = headline_metric(task)
    rows, metrics = leaderboard_rows(queries.leaderboard_runs(snapshot, task, dataset),
                                     queries.leaderboard_metrics(snapshot, task, dataset, averaging),
                                     queries.leaderboard_sizes(snapshot, task, dataset), headline)
    if metrics:  # best first on the first preferred metric, as the web grid sorts
        rows.sort(key=lambda r: (r.get(_field(metrics[0])) is None, -(r.get(_field(metrics[0])) or 0)))
    title = (f"{task} on {dataset or '(no dataset)'}" + (f" · {averaging}-averaged" if averaging else "")
             + " · test: value [95% interval]")
    out = _out()
    out.print(_leaderboard_table(rows, metrics[:n_metrics], title, safedrug_sd))
    out.print("95% interval: bootstrap with replacement over test patients (text groups, FAQ pairs), 1,000 "
              "resamples; no interval where none is valid." + (
                  f" vs reference: paired bootstrap on {headline} against the best non-neural baseline on "
                  "validation." if headline and any(r.get("verdict") for r in rows) else ""), highlight=False)
    n_units = max((r.get("n_test_patients") or 0 for r in rows), default=0)
    if rows and ci.too_small(n_units):
        out.print(f"[yellow]Too small to compare models: at most {n_units} test patients (groups) in this dataset; "
                  f"a comparison needs at least {ci.MIN_UNITS}. Intervals are shown, verdicts are not.[/yellow]",
                  highlight=False)


_SHORT_VERDICTS = {"no_detectable_difference": "no detectable diff.", "reference": "reference",
                   "too_small": "too small to compare"}


def _verdict_cells(row: dict) -> tuple[str, str]:
    """The paired verdict in two terminal cells: its word(s), and the difference with its 95% interval."""
    verdict = row.get("verdict")
    if not verdict:
        return "", ""
    from dashboard import intervals as ci

    label = _SHORT_VERDICTS.get(verdict, verdict)
    diff = row.get("verdict_diff")
    if verdict in ("reference", "too_small") or diff is None:
        return label, ""
    return label, ci.fmt_diff(diff, row.get("verdict_diff_low"), row.get("verdict_diff_high"))


def _leaderboard_table(rows: list[dict], metrics: list[str], title: str, safedrug_sd: bool = False) -> Table:
    from dashboard import intervals as ci
    from dashboard.pages.leaderboard import _field

    table = Table(title=title)
    table.add_column("model", no_wrap=True)
    table.add_column("seed", justify="right", no_wrap=True)
    verdicts = any(row.get("verdict") for row in rows)
    if verdicts:
        table.add_column("vs reference", no_wrap=True)
        table.add_column("difference [95%]", justify="right", no_wrap=True)
    for m in metrics:
        table.add_column(m, justify="right", no_wrap=True, min_width=13)
        if safedrug_sd:
            table.add_column("SafeDrug sd", justify="right", no_wrap=True)
    table.add_column("n test", justify="right", no_wrap=True)
    # the flags wrap, so a narrow terminal folds them before it cuts a number
    table.add_column("flags", overflow="fold", min_width=10, max_width=40)
    for row in rows:
        cells = []
        for m in metrics:
            field = _field(m)
            value, lo, hi = row.get(field), row.get(field + "_lo"), row.get(field + "_hi")
            text = ci.fmt_ci(value, lo, hi)
            cells.append(text + (" (no interval)" if value is not None and (lo is None or hi is None) else ""))
            if safedrug_sd:
                sd = row.get(field + "_sd")
                cells.append("" if sd is None else f"{sd:.3f}")
        style = "red" if row["status"] == "failed" else "yellow" if row["collapsed"] else ""
        n_units = row.get("n_test_patients")
        verdict = list(_verdict_cells(row)) if verdicts else []
        table.add_row(_plain_model(row["model"]), str(row["seed"]), *verdict, *cells,
                      "" if n_units is None else str(n_units), row["flags"], style=style)
    return table
