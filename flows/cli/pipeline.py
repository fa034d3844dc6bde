"""`medtx pipeline`, `medtx run-task NAME`, `medtx serve`: the whole flow, one step of it, or deployments.

All three run through Prefect (a temporary local server unless PREFECT_API_URL points at one), so every
run shows up in the Prefect UI with its task runs, logs and artifacts.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from flows.cli import app
from medtx.settings import get_settings

_console = Console(stderr=True)
_CONFIG = typer.Option(None, "--config", help="Pipeline YAML config (default: config/default.yaml).")
_DB = typer.Option(None, "--db", help="Warehouse file (default: settings `db`).")
_STATE_STYLE = {"completed": "green", "cached": "cyan", "failed": "red", "skipped": "yellow"}


def _config(config: Path | None) -> Path:
    from flows.pipeline import DEFAULT_CONFIG

    return config or DEFAULT_CONFIG


def _run(config: Path, db: Path | None, steps_only: list[str] | None, refresh: list[str] | None) -> None:
    from flows.pipeline import run_pipeline
    from medtx.pipeline_runs import step_table

    state = run_pipeline(config, db, steps_only=steps_only, refresh=refresh, return_state=True)
    rows = step_table(get_settings(db=db).db, str(state.state_details.flow_run_id))
    table = Table(title=f"pipeline run {state.state_details.flow_run_id}: {state.name}")
    for col in ("step", "state", "seconds", "error"):
        table.add_column(col, justify="right" if col == "seconds" else "left", overflow="fold")
    for r in rows:
        style = _STATE_STYLE.get(r["state"], "")
        table.add_row(r["step"], f"[{style}]{r['state']}[/{style}]", f"{r['seconds'] or 0:.1f}", r["error"])
    Console().print(table)
    if not state.is_completed():
        _console.print(f"[red]pipeline failed:[/red] {state.message}", highlight=False)
        raise typer.Exit(1)


@app.command("pipeline")
def pipeline_command(config: Path = _CONFIG, db: Path = _DB) -> None:
    """Run the whole pipeline: ingest -> map codes -> samples -> train/evaluate every model -> publish."""
    _run(_config(config), db, None, None)


@app.command("run-task")
def run_task_command(
    name: str = typer.Argument(None, help="Step name, e.g. ingest.mimic3_demo.admissions or "
                               "train.drug_rec.mimic3_demo.logreg.s42 (omit to list them)."),
    refresh: bool = typer.Option(False, "--refresh", help="Recompute even when a valid cached result exists."),
    config: Path = _CONFIG,
    db: Path = _DB,
) -> None:
    """Rerun one pipeline step through Prefect (cached unless --refresh), then republish the snapshot."""
    from flows.pipeline import plan_for
    from medtx.pipeline_config import load_config

    plan = plan_for(load_config(_config(config)), get_settings(db=db))
    if name is None or name not in plan.names:
        if name is not None:
            _console.print(f"[red]no step named {name!r}[/red]")
        Console().print("\n".join(plan.names))
        raise typer.Exit(0 if name is None else 2)
    _run(_config(config), db, [name], [name] if refresh else None)


@app.command("serve")
def serve_command(config: Path = _CONFIG, db: Path = _DB) -> None:
    """Serve the pipeline as two deployments: `scheduled` (cron from the config) and `on-demand`.

    Start a server first (`prefect server start`, UI on http://127.0.0.1:4200) and set
    PREFECT_API_URL=http://127.0.0.1:4200/api; trigger a run with
    `prefect deployment run 'medtx-pipeline/on-demand'`.
    """
    from flows.pipeline import serve_pipeline

    serve_pipeline(_config(config), db)
