"""What `medtx pipeline` shows a person: one rich progress display, every log line in a file.

On a terminal: a line per stage (synth, ingest, reference, codes, samples, train) with a bar over its steps,
the step(s) running now, elapsed time and an ETA from the previous run's step durations (medtx.pipeline.progress),
plus a total line. Off a terminal (CI, cron, a pipe): one plain line per finished step. Logs (per-epoch
lines, Prefect's run logs, httpx's request lines) go to var/logs/pipeline-<time>.log, and to the console
too only with `-v`.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from medtx.pipeline import progress as prog
from medtx.pipeline.kinds import KIND_NAMES as KINDS

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _is_console_handler(handler: logging.Handler) -> bool:
    """Handlers that write to the terminal: the stdlib's plain StreamHandler (logging.basicConfig) and
    Prefect's console handler. Not files, and not test harness capture handlers (subclasses)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    return type(handler) is logging.StreamHandler or isinstance(handler, PrefectConsoleHandler)


class _LogFile(logging.FileHandler):
    """The pipeline's log file. When a write fails (a full disk), one line says so and the file handler stops:
    the stdlib's handler would print a traceback per log record (26,720 stderr lines on a full disk)."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - the stdlib's name
        if not self.failed:
            self.failed = True
            error = sys.exc_info()[1]
            sys.stderr.write(f"medtx: cannot write the log file {self.baseFilename} ({error}); further log "
                             "lines are dropped\n")


def route_logs(log_dir: Path, verbose: bool) -> Path:
    """Send every log record to a new file under `log_dir` instead of the terminal; with `verbose`, to both.
    Returns the file's path."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"pipeline-{datetime.now():%Y%m%d-%H%M%S}.log"
    to_file = _LogFile(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter(_FORMAT))
    loggers = [logging.getLogger()] + [
        lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    for logger in loggers:
        consoles = [h for h in logger.handlers if _is_console_handler(h)]
        for handler in consoles:
            logger.removeHandler(handler)
        if consoles and logger is not logging.getLogger() and not logger.propagate:
            logger.addHandler(to_file)  # it does not reach the root's file handler on its own
    root = logging.getLogger()
    root.addHandler(to_file)
    root.setLevel(logging.INFO)
    if not verbose:
        _quiet_progress_bars()
    if verbose:
        shown = logging.StreamHandler(sys.stderr)
        shown.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(shown)
    atexit.register(_stderr_to, path)  # registered before Prefect's exit handlers, so it runs after them
    return path


def _quiet_progress_bars() -> None:
    """Hugging Face's tqdm bars (loading and writing weights) write to the terminal, past the log routing:
    off, here and in the training processes this one starts (they inherit the environment)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def _stderr_to(path: Path) -> None:
    """At interpreter exit, point file descriptor 2 at the log: DuckDB's nanobind bindings print ~40 lines of
    "leaked instance" reports while the interpreter finalises, nothing a user can act on."""
    sys.stderr.flush()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:  # the log's folder is gone (a removed temporary warehouse): leave stderr as it is
        return
    os.dup2(fd, 2)
    os.close(fd)


class PipelineDisplay:
    """An observer of flows.pipeline (`with flows.pipeline.observed(display)`), live or plain."""

    def __init__(self, console: Console, live: bool):
        self.console, self.live = console, live
        self.planned: dict[str, prog.PlannedStep] = {}
        self.started: dict[str, float] = {}
        self.finished: set[str] = set()
        self.rows: dict[str, TaskID] = {}
        self.progress = Progress(
            TextColumn("{task.description:<9}"), BarColumn(bar_width=30), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]:>7}"), TextColumn("{task.fields[running]}"),
            console=console, transient=False, disable=not live,
        )

    def __enter__(self) -> PipelineDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.refresh()
        self.progress.stop()

    def __call__(self, event: str, payload: Any) -> None:
        if event == "plan":
            self.plan(payload)
        elif event == "started":
            self.started[payload.name] = time.monotonic()
            self.refresh()
        elif event == "finished":
            self.finish(payload)

    def plan(self, steps: list[prog.PlannedStep]) -> None:
        self.planned = {s.name: s for s in steps}
        kinds = [k for k in KINDS if any(s.kind == k for s in steps)]
        for kind in ["total", *kinds]:
            n = len(steps) if kind == "total" else sum(s.kind == kind for s in steps)
            self.rows[kind] = self.progress.add_task(kind, total=n, start=False, eta="?", running="")
        self.refresh()

    def finish(self, outcome: Any) -> None:
        self.finished.add(outcome.step.name)
        if not self.live:
            error = f"  {outcome.error}" if outcome.error else ""
            seconds = f"{outcome.seconds:.1f}s" if outcome.seconds is not None else "-"
            self.console.print(f"[{len(self.finished):>3}/{len(self.planned)}] {outcome.state:<9} "
                               f"{outcome.step.name}  {seconds}{error}", highlight=False, markup=False,
                               soft_wrap=True)
        self.refresh()

    def _state(self, name: str) -> prog.StepProgress:
        step = self.planned[name]
        status = prog.DONE if name in self.finished else prog.RUNNING if name in self.started else prog.QUEUED
        started = datetime.now().timestamp() - (time.monotonic() - self.started[name]) if name in self.started else None
        return prog.StepProgress(name, step.kind, status, step.expected_seconds,
                                 datetime.fromtimestamp(started) if started else None)

    def refresh(self) -> None:
        if not self.live or not self.rows:
            return
        now = datetime.now()
        states = [self._state(n) for n in self.planned]
        for kind, task in self.rows.items():
            mine = [s for s in states if kind == "total" or s.kind == kind]
            running = [s.name for s in mine if s.status == prog.RUNNING]
            done = sum(s.status == prog.DONE for s in mine)
            if (running or done) and self.progress.tasks[task].start_time is None:
                self.progress.start_task(task)
            left = prog.remaining_seconds(mine, now)
            eta = "done" if done == len(mine) else prog.format_seconds(left)
            self.progress.update(task, completed=done, eta=eta,
                                 running=", ".join(running)[:70] if kind != "total" else "")
            if done == len(mine) and not self.progress.tasks[task].finished:
                self.progress.stop_task(task)
