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
_VERBOSE = typer.Option(False, "--verbose", "-v", help="Also show every log line (per-epoch, Prefect, HTTP) on the "
                        "console; they always go to the log file under var/logs.")
_STATE_STYLE = {"completed": "green", "cached": "cyan", "failed": "red", "skipped": "yellow"}
# Failures first in the summary: they are what the reader has to act on.
_STATE_ORDER = {"failed": 0, "skipped": 1, "completed": 2, "cached": 3}
DASHBOARD_URL = "http://127.0.0.1:8050/"


def _config(config: Path | None) -> Path:
    from flows.pipeline import DEFAULT_CONFIG

    return config or DEFAULT_CONFIG


def _run(config: Path, db: Path | None, steps_only: list[str] | None, refresh: list[str] | None,
         verbose: bool = False) -> None:
    from flows.cli.console import PipelineDisplay, route_logs
    from flows.pipeline import observed, run_pipeline
    from medtx.pipeline_runs import step_table

    settings = get_settings(db=db)
    out = Console()
    log_file = route_logs(settings.db.parent / "logs", verbose)
    _console.print(f"medtx pipeline: {config} -> {settings.db}; log: {log_file}", highlight=False, soft_wrap=True)
    with PipelineDisplay(out, live=out.is_terminal) as display, observed(display):
        state = run_pipeline(config, db, steps_only=steps_only, refresh=refresh, return_state=True)
    rows = sorted(step_table(settings.db, str(state.state_details.flow_run_id)),
                  key=lambda r: _STATE_ORDER.get(r["state"], 9))
    counts = ", ".join(f"{sum(r['state'] == s for r in rows)} {s}" for s in _STATE_ORDER
                       if any(r["state"] == s for r in rows))
    if out.is_terminal:  # off a terminal the per-step lines above already are the summary
        table = Table(title=f"pipeline run {state.state_details.flow_run_id}: {state.name}")
        for col in ("step", "state", "seconds", "error"):
            table.add_column(col, justify="right" if col == "seconds" else "left", overflow="fold")
        for r in rows:
            style = _STATE_STYLE.get(r["state"], "")
            table.add_row(r["step"], f"[{style}]{r['state']}[/{style}]", f"{r['seconds'] or 0:.1f}", r["error"])
        out.print(table)
    _console.print(f"pipeline run {state.state_details.flow_run_id}: {state.name} ({counts}); log: {log_file}; "
                   f"dashboard: {DASHBOARD_URL} (`medtx dashboard --db {settings.db}`)", highlight=False,
                   soft_wrap=True)
    if not state.is_completed():
        _console.print(f"[red]pipeline failed:[/red] {state.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command("pipeline")
def pipeline_command(config: Path = _CONFIG, db: Path = _DB, verbose: bool = _VERBOSE) -> None:
    """Run the whole pipeline: ingest -> map codes -> samples -> train/evaluate every model -> publish.

    The snapshot is published after each stage and as models finish, so `medtx dashboard` shows data as it lands.
    """
    _run(_config(config), db, None, None, verbose)


@app.command("run-task")
def run_task_command(
    name: str = typer.Argument(None, help="Step name, e.g. ingest.mimic3_demo.admissions or "
                               "train.drug_rec.mimic3_demo.logreg.s42 (omit to list them)."),
    refresh: bool = typer.Option(False, "--refresh", help="Recompute even when a valid cached result exists."),
    config: Path = _CONFIG,
    db: Path = _DB,
    verbose: bool = _VERBOSE,
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
    _run(_config(config), db, [name], [name] if refresh else None, verbose)


@app.command("serve")
def serve_command(config: Path = _CONFIG, db: Path = _DB) -> None:
    """Serve the pipeline as two deployments: `scheduled` (cron from the config) and `on-demand`.

    Start a server first (`prefect server start`, UI on http://127.0.0.1:4200) and set
    PREFECT_API_URL=http://127.0.0.1:4200/api; trigger a run with
    `prefect deployment run 'medtx-pipeline/on-demand'`.
    """
    from flows.pipeline import serve_pipeline

    serve_pipeline(_config(config), db)
