"""A Prefect home whose database Prefect has already migrated, copied into a test's own home before the test runs
a real `medtx pipeline` in a subprocess.

Why: each such test gives its command a fresh Prefect home, and a temporary server on a fresh home spends ~6 s
running Prefect's own migrations and registering its block types (start 11-12 s instead of 5-6 s, measured):
Prefect's business, not what these tests check. Each test still has a home of its own and its command still
starts (and stops) its own temporary server there; the home is simply as a user's second run finds it.
The template is made once per session by starting and stopping a temporary server on it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_TEMPLATE: list[Path] = []
_MAKE = ("from prefect.server.api.server import SubprocessASGIServer\n"
         "server = SubprocessASGIServer()\nserver.start()\nserver.stop()\n")


def _template() -> Path:
    if not _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="medtx-prefect-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env |= {"PREFECT_HOME": str(folder / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90"}
        made = subprocess.run([sys.executable, "-c", _MAKE], env=env, capture_output=True, text=True, timeout=300)
        assert made.returncode == 0 and (folder / "home" / "prefect.db").exists(), made.stderr[-3000:]
        _TEMPLATE.append(folder / "home")
    return _TEMPLATE[0]


def migrated_prefect_home(home: Path) -> Path:
    """`home` (a Prefect home folder), made from the migrated template unless it exists already (a test that
    runs several commands on one home keeps what the earlier ones left there)."""
    if not home.exists():
        shutil.copytree(_template(), home)
    return home
