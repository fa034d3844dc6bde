"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and they do catch an upward import.

`lint-imports` (import-linter) reads the code's real import graph: the library (medtx) never imports Prefect,
flows or the dashboard; medtx.models never imports medtx.training or medtx.text; the dashboard imports no
flows or training code; only the dashboard's commands (`medtx dashboard`, `status`, `leaderboard`) import the dashboard.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache", "--no-logo"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "source", "contract"), [
    ("medtx/models/_upward.py", "from medtx.training.trainer import fit\n", "models never import"),
    ("medtx/_orchestrated.py", "import prefect\n", "medtx is a library"),
    ("dashboard/_runs_flows.py", "import flows.pipeline\n", "the dashboard reads the snapshot"),
])
def test_an_upward_import_breaks_its_contract(tmp_path, module, source, contract):
    """A copy of the code with one violating module fails lint-imports, naming the broken contract."""
    for package in ("medtx", "flows", "dashboard"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                                          "assets", "*.gz"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / module).write_text(source)
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and broken[0].startswith(contract), result.stdout
