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

# Under pytest-xdist (`make test` runs two workers) each worker has its own temporary folder, so a test that
# watches the temp folder (tests/test_dask_workers.py) sees only its own worker's files, and its own dashboard port.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER:
    _TMP = Path(tempfile.gettempdir()) / f"medtx-tests-{os.getpid()}-{_WORKER}"
    _TMP.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(_TMP)
    atexit.register(shutil.rmtree, _TMP, ignore_errors=True)
DASH_PORT = 8050 + (int(_WORKER[2:]) + 1 if _WORKER[2:].isdigit() else 0)

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


@pytest.fixture
def dash_duo(dash_duo):
    """dash's browser fixture on this worker's own port (two xdist workers may each serve a dashboard)."""
    start = dash_duo.start_server

    def start_server(app, navigate=True, **kwargs):
        kwargs.setdefault("port", DASH_PORT)
        return start(app, navigate, **kwargs)

    dash_duo.start_server = start_server
    return dash_duo
