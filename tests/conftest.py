"""Shared test setup: offline, quiet, isolated Prefect home; one Prefect test harness per session.

Stage-specific fixtures live in the stage's own test files (or tests/fixtures_<stage>.py) to keep this small.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_PREFECT_HOME = Path(tempfile.mkdtemp(prefix="medtx-prefect-home-"))
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ.setdefault("PREFECT_HOME", str(_PREFECT_HOME))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "medtx")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA = REPO_ROOT / "data"


@pytest.fixture(scope="session")
def prefect_harness():
    """A real (temporary) Prefect server for the few tests that run flows."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


@pytest.fixture
def tmp_db(tmp_path: Path) -> Path:
    """Path of a fresh warehouse file (created on first connect)."""
    return tmp_path / "warehouse.duckdb"
