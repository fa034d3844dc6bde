"""The `medtx` command line: one typer app whose commands map one-to-one onto pipeline stages.

Each stage registers its commands in its own module below (ingest.py, synth.py, samples.py, train.py,
pipeline.py, dashboard.py); this file only assembles them. Every command takes `--db PATH`.
"""

from __future__ import annotations

import importlib
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

_COMMAND_MODULES = ("ingest", "synth", "samples", "train", "pipeline", "dashboard", "meds", "status")


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
    # Prefect's server cannot create its sqlite file when the folder (e.g. a new --db root) is missing.
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "medtx")
    # medtx logs outside a flow run (e.g. stopping a finished run's server) stay local instead of warning
    # on the console that they cannot reach the (already stopped) API.
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


for _name in _COMMAND_MODULES:  # each module registers its commands on `app`
    importlib.import_module(f"flows.cli.{_name}")


def main() -> None:
    _prefect_defaults(sys.argv[1:])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app()
