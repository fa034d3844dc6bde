"""The `medtx` command line: one typer app whose commands map one-to-one onto pipeline stages.

Each stage registers its commands in its own module below (ingest.py, synth.py, samples.py, train.py,
pipeline.py, dashboard.py); this file only assembles them. Every command takes `--db PATH`.
"""

from __future__ import annotations

import errno
import importlib
import importlib.abc
import logging
import os
import sys
from pathlib import Path

import typer

app = typer.Typer(
    name="medtx",
    help="Clinical-transformer pipeline: ingest -> map codes -> samples -> train/evaluate -> dashboard.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

_COMMAND_MODULES = ("ingest", "synth", "samples", "train", "pipeline", "dashboard", "meds", "status", "report")


def _db_argument(argv: list[str]) -> str | None:
    """The value of `--db` on the command line, read before typer parses it: Prefect reads PREFECT_HOME
    when it first loads, so it must point under the warehouse's root before any command starts."""
    for i, arg in enumerate(argv):
        if arg == "--db" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--db="):
            return arg.split("=", 1)[1]
    return None


def _prefect_defaults(argv: list[str]) -> None:
    """Offline-friendly Prefect defaults (see ../shared/STACK.md); the environment can override.
    Prefect's home (its database, results) lives under the writable root of `--db` / MEDTX_HOME."""
    from medtx.settings import get_settings

    db = _db_argument(argv)
    os.environ.setdefault("PREFECT_HOME", str(get_settings(db=db).prefect_home))
    # Prefect's server cannot create its sqlite file when the folder (e.g. a new --db root) is missing; it is
    # created when Prefect is first imported, not before: `status`, `dashboard`, `pipeline --check` and a config
    # error never import Prefect, so they leave no folder behind and work on a read-only warehouse folder.
    if not any(isinstance(f, _PrefectHomeOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PrefectHomeOnImport())
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Sized for a saturated 2-core machine (issue 44: a run failed on a ReadTimeout at load 8): load slows a run,
    # it must not fail it. Prefect's defaults: 60 s per API request (each retried on a timeout, 5 times with
    # exponential back-off), a 10 s statement / 5 s connection timeout on the server's sqlite, 90 s to start.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    os.environ.setdefault("PREFECT_API_REQUEST_TIMEOUT", "180")
    os.environ.setdefault("PREFECT_CLIENT_MAX_RETRIES", "8")
    os.environ.setdefault("PREFECT_SERVER_DATABASE_TIMEOUT", "60")
    os.environ.setdefault("PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT", "30")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "medtx")
    # medtx logs outside a flow run (e.g. stopping a finished run's server) stay local instead of warning
    # on the console that they cannot reach the (already stopped) API.
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


class _PrefectHomeOnImport(importlib.abc.MetaPathFinder):
    """Creates PREFECT_HOME (with its parents) just before `prefect` is first imported, then steps aside."""

    def find_spec(self, name: str, path: object, target: object = None) -> None:
        if name == "prefect":
            sys.meta_path.remove(self)
            Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
        # None: the normal finders import it


def environment_problems() -> list[str]:
    """MEDTX_* settings read from the environment that cannot be used (checked before any command runs)."""
    from medtx.runtime.disk import min_free_mb
    from medtx.store.db import duckdb_memory_limit
    from medtx.store.writer_lock import lock_wait_s

    problems = []
    for check in (lock_wait_s, min_free_mb, duckdb_memory_limit):
        try:
            check()
        except ValueError as exc:
            problems.append(str(exc))
    return problems


# Errors of the machine, not of medtx: one line naming the file, exit 2 (never a traceback).
_RESOURCE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                    errno.EFBIG: "file too large (the file size limit was reached)",
                    errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                    errno.EPERM: "operation not permitted"}


def resource_error(exc: BaseException) -> str | None:
    """One line for an exception caused by a full disk, a size limit or a read-only/unwritable folder (found
    anywhere in its chain: DuckDB and Prefect wrap the OSError), else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _RESOURCE_ERRNOS:
            where = exc.filename or ""
            return f"{_RESOURCE_ERRNOS[exc.errno]}{': ' + str(where) if where else ''}"
        if (line := resource_message(str(exc))) is not None:
            return line
        exc = exc.__cause__ or exc.__context__
    return None


# The operating system's words for those errors, as DuckDB, sqlite and a failed step's stored error carry them.
_RESOURCE_TEXTS = {"No space left on device": "no space left on device", "database or disk is full":
                   "no space left on device", "Disk quota exceeded": "disk quota exceeded",
                   "File too large": "file too large (the file size limit was reached)",
                   "Read-only file system": "read-only file system"}


def resource_message(text: str) -> str | None:
    """One line for an error text that reports a full disk, a size limit or a read-only file system, naming
    the file when the text does (DuckDB: `Could not write file "PATH": No space left on device`), else None."""
    import re

    for marker, words in _RESOURCE_TEXTS.items():
        if marker in text:
            path = re.search(r'(?:write|open|create|extend) file "([^"]+)"', text) or re.search(r"'(/[^']+)'", text)
            return f"{words}: {path[1]}" if path else f"{words} ({' '.join(text.split())[:200]})"
    return None


for _name in _COMMAND_MODULES:  # each module registers its commands on `app`
    importlib.import_module(f"flows.cli.{_name}")


def main() -> None:
    import signal

    _prefect_defaults(sys.argv[1:])
    problems = environment_problems()
    if problems:
        for line in problems:
            print(f"medtx: {line}", file=sys.stderr)
        raise SystemExit(2)
    # A full disk, or a file size limit: the write fails with EFBIG (and the medtx message) instead of SIGXFSZ
    # killing the process without a word.
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except Exception as exc:
        line = resource_error(exc)
        if line is None:
            raise
        print(f"medtx: {line}; stopped", file=sys.stderr)
        raise SystemExit(2) from None
