"""Issue 44: Prefect API calls survive a saturated machine: the CLI sizes Prefect's request timeout, retries and
its server's database timeouts for a loaded 2-core machine (a run failed on a ReadTimeout at load 8), and the
environment still wins. Checked through Prefect's own settings object, in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE = ("import json, sys; from flows.cli import _prefect_defaults; _prefect_defaults(['--db', sys.argv[1]]); "
         "from prefect.settings import get_current_settings as g; s = g(); print(json.dumps([s.api.request_timeout, "
         "s.client.max_retries, s.server.database.timeout, s.server.database.connection_timeout, "
         "s.server.ephemeral.startup_timeout_seconds]))")


def _settings(tmp_path: Path, **env: str) -> list:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MEDTX_"))}
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "w.duckdb")], capture_output=True, text=True,
                         env={**clean, "PYTHONPATH": str(REPO), **env}, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_prefect_timeouts_and_retries_are_sized_for_a_loaded_machine_and_the_environment_wins(tmp_path: Path):
    assert _settings(tmp_path) == [180.0, 8, 60.0, 30.0, 300]
    assert _settings(tmp_path, PREFECT_API_REQUEST_TIMEOUT="5", PREFECT_CLIENT_MAX_RETRIES="1")[:2] == [5.0, 1]
