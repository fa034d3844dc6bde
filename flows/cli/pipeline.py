"""`medtx pipeline`, `medtx run-task NAME`, `medtx serve`: the whole flow, one step of it, or deployments.

All three run through Prefect (a temporary local server unless PREFECT_API_URL points at one), so every
run shows up in the Prefect UI with its task runs, logs and artifacts.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.markup import escape
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
    # not flows.pipeline.DEFAULT_CONFIG: importing that module imports Prefect (seconds, and it creates its home)
    from medtx.settings import PROJECT_ROOT

    return config or PROJECT_ROOT / "config" / "default.yaml"


def _load(config: Path, *, sources: bool):
    """The validated config, or one line per problem on stderr and exit 2 (before any Prefect server starts)."""
    from medtx.pipeline.config import ConfigError, load_config

    try:
        return load_config(config, sources=sources)
    except ConfigError as exc:
        for line in exc.lines:
            _console.print(f"[red]config error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    except FileNotFoundError as exc:
        _console.print(f"[red]config error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _run(config: Path, db: Path | None, steps_only: list[str] | None, refresh: list[str] | None,
         verbose: bool = False) -> None:
    from medtx.runtime.processes import descendants, stop_descendants
    from medtx.runtime.watchdog import start_watchdog
    from medtx.store.writer_lock import HolderFileDamaged, WarehouseBusy, hold_writer

    settings = get_settings(db=db)
    before = descendants()  # what was running before this command is not ours to stop
    watchdogs: list = []
    _stop_on_signals(settings, before, watchdogs)
    try:
        # Refuse at once when another pipeline (or any writer) holds this warehouse: touch nothing. Checked
        # before the config, whose model checks import torch (seconds on a busy box). The watchdog of a killed
        # pipeline, closing its runs, is waited for.
        with hold_writer(settings.db, "medtx pipeline", wait_s=30 if _watchdog_holds(settings.db) else 0):
            _load(config, sources=True)  # every config error, before any Prefect server starts
            _enough_space(settings)  # a full disk: one line now, not a Prefect server timing out in 90 s
            # if this process is killed (-9), its watchdog stops what it started and closes its runs
            watchdogs.append(start_watchdog(settings.db, settings.snapshot))
            before.add(watchdogs[0].pid)
            state, log_file = _run_with_display(config, db, settings, steps_only, refresh, verbose)
    except WarehouseBusy as exc:  # HolderFileDamaged (a text pid, a folder as the writer file): bad input, exit 2
        _console.print(f"[red]{escape(str(exc))}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2 if isinstance(exc, HolderFileDamaged) else 1) from None
    except (typer.Exit, click.exceptions.Exit, click.ClickException):  # refused before any run began
        raise
    except BaseException as exc:  # e.g. Prefect's own SIGTERM handler raised into the flow: its runs end here
        _close_own_runs(settings, f"the command ended with {type(exc).__name__}")
        raise
    finally:
        _flush_prefect_logs()  # before its server goes: queued run logs would fail to send at exit
        stop_descendants(before)  # the temporary Prefect server, a local Dask cluster: however the run ended
        _end_watchdogs(watchdogs)  # this process cleaned up itself
    _summary(settings, state, log_file)


def _watchdog_holds(db: Path) -> bool:
    from medtx.runtime.watchdog import WATCHDOG_COMMAND
    from medtx.store.writer_lock import HolderFileDamaged, read_holder

    try:
        holder = read_holder(db)
    except HolderFileDamaged:
        return False  # named by hold_writer
    return holder is not None and holder.command == WATCHDOG_COMMAND


def _end_watchdogs(watchdogs: list) -> None:
    for proc in watchdogs:
        proc.terminate()
        proc.wait(timeout=10)


STOP_DEADLINE_S = 12.0  # a stopped pipeline exits within this, whatever hangs


def _stop_on_signals(settings, before: set[int], watchdogs: list) -> None:
    """SIGINT (Ctrl-C: the terminal sends it to the whole process group, so the Prefect server and the training
    processes get it too and die first) and SIGTERM end the command at once: stop every process it started,
    mark its runs interrupted and republish the snapshot, release the writer lock, one line, exit 128 + signal.
    It never goes back into Prefect, whose dead server it would call with retries for minutes (211 s measured);
    a timer ends the process at STOP_DEADLINE_S whatever hangs. Only the main thread may set handlers."""
    import os
    import signal
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: object) -> None:
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        code = 128 + signum
        threading.Timer(STOP_DEADLINE_S, os._exit, args=(code,)).start()
        name = signal.Signals(signum).name
        from medtx.runtime.processes import stop_descendants

        stopped = stop_descendants(before, grace_s=3.0)
        closed, done = _close_own_runs(settings, f"{name} received (stopped by a user or the system)")
        if done:  # else the watchdog (left alone by stop_descendants) closes them once this process is gone
            _end_watchdogs(watchdogs)
        _console.print(f"[red]medtx pipeline: stopped by {name}[/red]: {closed}; {len(stopped)} child "
                       "process(es) stopped", highlight=False, soft_wrap=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _close_own_runs(settings, why: str) -> tuple[str, bool]:
    """Mark this process's running runs interrupted, republish the snapshot, release the writer lock; says what
    it did, and whether it closed them (best effort: what fails here, the watchdog and the next start do; e.g. a
    transaction of the thread the signal interrupted still holds the run's row)."""
    import os

    from medtx.publish.snapshot import publish_snapshot
    from medtx.store.db import open_warehouse, transaction
    from medtx.store.run_owners import mark_own_interrupted
    from medtx.store.writer_lock import read_holder, release

    said, done = "no run was open", True
    try:
        if settings.db.exists():
            with open_warehouse(settings.db, wait_s=2) as con, transaction(con):
                marked = mark_own_interrupted(con, why)
            if marked:
                publish_snapshot(settings.db, settings.snapshot)
                said = "recorded as interrupted: " + ", ".join(f"{m.table} {m.run_id}" for m in marked)
    except Exception as exc:  # noqa: BLE001 - the watchdog closes them when this process is gone
        said, done = f"runs left to the watchdog ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})", False
    try:
        holder = read_holder(settings.db)
        if holder is not None and holder.pid == os.getpid():
            release(settings.db, holder)
    except Exception:  # noqa: BLE001 - a damaged file: the next start names it
        pass
    return said, done


def _enough_space(settings) -> None:
    """Exit 2 with one line when a folder the run writes (warehouse, Prefect home, models, logs) is nearly full."""
    import os

    from medtx.runtime.disk import free_space_problem

    home = Path(os.environ.get("PREFECT_HOME", settings.prefect_home))
    problem = free_space_problem([settings.db.parent, home, settings.models_dir, settings.root / "logs"])
    if problem is not None:
        _console.print(f"[red]medtx:[/red] {escape(problem)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)


def _flush_prefect_logs() -> None:
    import sys

    if "prefect.logging.handlers" in sys.modules:
        from prefect.logging.handlers import APILogWorker

        try:
            APILogWorker.drain_all(timeout=10)
        except Exception:  # noqa: BLE001 - the server may already be gone; nothing to send then
            pass


def _run_with_display(config: Path, db: Path | None, settings, steps_only, refresh, verbose: bool):
    import signal

    from flows.cli.console import PipelineDisplay, route_logs
    from flows.pipeline import observed, run_pipeline, stopping_with  # imports Prefect: seconds, after the refusal

    out = Console()
    log_file = route_logs(settings.root / "logs", verbose)
    _console.print(f"medtx pipeline: {config} -> {settings.db}; log: {log_file}", highlight=False, soft_wrap=True)
    handler = signal.getsignal(signal.SIGTERM)
    with (PipelineDisplay(out, live=out.is_terminal) as display, observed(display),
          stopping_with(handler) if callable(handler) else nullcontext()):
        state = run_pipeline(config, db, steps_only=steps_only, refresh=refresh, return_state=True)
    return state, log_file


def _summary(settings, state, log_file: Path) -> None:
    from medtx.pipeline.runs import step_table

    out = Console()
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
        from flows.cli import resource_message

        # a full disk (or a size limit, a read-only folder) behind a failed step: one line naming it, exit 2
        full = next((m for r in rows if r["error"] and (m := resource_message(r["error"]))), None)
        if full is None and state.message:
            full = resource_message(state.message)
        if full is not None:
            _console.print(f"[red]medtx:[/red] {escape(full)}; the pipeline stopped ({counts})", highlight=False,
                           soft_wrap=True)
            raise typer.Exit(2)
        refused = _input_refusal(rows)
        if refused is not None:  # bad input behind a failed step: exit 2, as `medtx ingest` gives for it
            _console.print(f"[red]medtx:[/red] {escape(refused)}; the pipeline stopped ({counts})", highlight=False,
                           soft_wrap=True)
            raise typer.Exit(2)
        _console.print(f"[red]pipeline failed:[/red] {state.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _input_refusal(rows: list[dict]) -> str | None:
    """`step: error` of the first failed step that refused its input (an ingest guard: shrink, cut or empty file,
    checksum, implausible data under `fail`; a MEDS folder's format or code mapping), else None."""
    from medtx.ingest.loader import IngestError
    from medtx.ingest.sources import ChecksumError, DownloadError, SourceNotFound
    from medtx.meds.mapping import MappingError
    from medtx.meds.validate import MedsFormatError

    def family(cls: type) -> list[type]:
        return [cls, *(sub for child in cls.__subclasses__() for sub in family(child))]

    names = {c.__name__ for base in (IngestError, ChecksumError, DownloadError, SourceNotFound, MappingError,
                                     MedsFormatError) for c in family(base)}
    for r in rows:
        error = (r.get("error") or "").strip()
        if r.get("state") == "failed" and error.split(":", 1)[0] in names:
            return f"{r['step']}: {error.splitlines()[0]}"
    return None


@app.command("pipeline")
def pipeline_command(config: Path = _CONFIG, db: Path = _DB, verbose: bool = _VERBOSE,
                     check: bool = typer.Option(False, "--check", help="Only validate the config (schema, models, "
                                                "override ranges, sources, devices) and exit: 0 when it can run, "
                                                "2 with one line per problem. Touches no warehouse.")) -> None:
    """Run the whole pipeline: ingest -> map codes -> samples -> train/evaluate every model -> publish.

    The snapshot is published after each stage and as models finish, so `medtx dashboard` shows data as it lands.
    """
    if check:
        cfg = _load(_config(config), sources=True)
        n_specs = sum(len(t.models) for t in cfg.tasks.values())
        _console.print(f"config ok: {_config(config)}: {len(cfg.datasets)} dataset(s), {len(cfg.tasks)} task(s), "
                       f"{n_specs} model spec(s), seeds {cfg.seeds}", highlight=False, soft_wrap=True)
        return
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

    plan = plan_for(_load(_config(config), sources=False), get_settings(db=db))
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
