"""The `medtx` command line: one typer app whose commands map one-to-one onto pipeline stages.

Each stage registers its commands in its own module below (ingest.py, synth.py, samples.py, train.py,
pipeline.py, dashboard.py); this file only assembles them. Every command takes `--db PATH`.
"""

from __future__ import annotations

import importlib
import logging
import os

import typer

app = typer.Typer(
    name="medtx",
    help="Clinical-transformer pipeline: ingest -> map codes -> samples -> train/evaluate -> dashboard.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

_COMMAND_MODULES = ("ingest", "synth", "samples", "train", "pipeline", "dashboard", "meds", "status")


def _prefect_defaults() -> None:
    """Offline-friendly Prefect defaults (see ../shared/STACK.md); the environment can override."""
    from medtx.settings import PROJECT_ROOT

    os.environ.setdefault("PREFECT_HOME", str(PROJECT_ROOT / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "medtx")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


for _name in _COMMAND_MODULES:  # each module registers its commands on `app`
    importlib.import_module(f"flows.cli.{_name}")


def main() -> None:
    _prefect_defaults()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app()
