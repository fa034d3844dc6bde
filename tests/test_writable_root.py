"""Issue 12, case 7: every writable path derives from one root, the folder of `--db` (or MEDTX_HOME).

The real `medtx` CLI runs from a copy of the checkout (as a subprocess, with no PREFECT_HOME or MEDTX_*
in its environment): ingest through the Prefect flow, build-samples, a logreg train. Nothing new may
appear in the copy; the warehouse, the Prefect home and results, and the model checkpoints land under
the root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from medtx.settings import get_settings
from tests.conftest import DATA, REPO_ROOT

CODE = ("medtx", "flows", "dashboard", "warehouse", "config", "pyproject.toml")


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` (following the data symlink) with its size and mtime."""
    out = {}
    for base, _dirs, files in os.walk(folder, followlinks=True):
        for name in files:
            path = Path(base) / name
            stat = path.stat()
            out[str(path.relative_to(folder))] = (stat.st_size, stat.st_mtime_ns)
    return out


def test_settings_derive_every_path_from_one_root(tmp_path: Path, monkeypatch) -> None:
    for var in ("MEDTX_HOME", "MEDTX_DB", "MEDTX_CACHE_DIR", "MEDTX_MODELS_DIR", "MEDTX_RESULTS_DIR"):
        monkeypatch.delenv(var, raising=False)
    s = get_settings(db=tmp_path / "a" / "w.duckdb")
    assert (s.root, s.cache_dir, s.models_dir, s.results_dir, s.prefect_home) == (
        tmp_path / "a", tmp_path / "a" / "cache", tmp_path / "a" / "models", tmp_path / "a" / "prefect-results",
        tmp_path / "a" / "prefect-home")
    monkeypatch.setenv("MEDTX_HOME", str(tmp_path / "home"))
    s = get_settings()
    assert (s.db, s.cache_dir) == (tmp_path / "home" / "warehouse.duckdb", tmp_path / "home" / "cache")
    monkeypatch.setenv("MEDTX_CACHE_DIR", str(tmp_path / "elsewhere"))  # an explicit path still wins
    assert get_settings().cache_dir == tmp_path / "elsewhere"


@pytest.mark.slow
def test_cli_writes_only_under_the_db_folder(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in CODE:
        src = REPO_ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, checkout / name)
    (checkout / "data").symlink_to(DATA)
    for pyc in checkout.rglob("__pycache__"):
        shutil.rmtree(pyc)
    root = tmp_path / "root"  # (quotes in the path: tests/test_sql_quoting.py; Prefect's sqlite URL rejects them)
    db = root / "w.duckdb"
    work = tmp_path / "cwd"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDTX_", "PREFECT_HOME"))}
    env |= {"PYTHONPATH": str(checkout), "PYTHONDONTWRITEBYTECODE": "1"}
    before = listing(checkout)

    def medtx(*args: str) -> None:
        proc = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", *args, "--db", str(db)],
                              cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]

    medtx("ingest", "mimic3")
    medtx("map-codes")
    medtx("build-samples", "--task", "drug_rec")
    medtx("train", "--task", "drug_rec", "--model", "logreg")
    medtx("train", "--task", "drug_rec", "--model", "gru", "--epochs", "1")  # writes a checkpoint
    config = tmp_path / "pipeline.yaml"  # one step through Prefect: its home goes under the root too
    config.write_text(f"datasets: [{{source: {DATA / 'mimic3_demo'}}}]\ntasks: {{drug_rec: {{models: [{{model: logreg}}]}}}}\n")
    medtx("run-task", "ingest.mimic3_demo", "--config", str(config))
    assert listing(checkout) == before  # nothing written into the checkout (code, config or data)
    assert list(work.iterdir()) == []
    made = {p.name for p in root.iterdir()}
    assert {"w.duckdb", "prefect-home", "models"} <= made, made
    assert any((root / "models").iterdir())
    assert (root / "prefect-home" / "prefect.db").exists() or any((root / "prefect-home").iterdir())
