"""Issue 44: benchmarks/gpu/record.py records through the CLI's guards: the writer file (a live writer makes it
refuse, exit 1), the training data's fingerprint (not the dataset's name), one line per refused input with
exit 2 while every other package is still recorded, and its inputs are never deleted. Real packages exported
from the bundled demo and trained (logreg), a real DuckDB warehouse, record.py run as a person runs it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from medtx.pipeline.exchange import export_training_package
from medtx.pipeline.kinds.train import run as run_train_from_package
from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)
from tests.test_exchange_trust import READS, SCOPE, _counts

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "gpu" / "record.py"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record(folder: Path, db: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RECORD), str(folder), "--db", str(db), "--no-publish"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("record.py:")]


@pytest.fixture
def results(demo_copy: Path, tmp_path: Path) -> tuple[Path, Path]:  # noqa: F811
    """The warehouse and a folder holding two result packages trained on its data (seeds 1 and 2)."""
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k-record")
    folder = tmp_path / "returned"
    for seed in (1, 2):
        spec = {"dataset": "mimic3_demo", "task": "readmission", "model": "logreg",
                "params": {"model": "logreg", "overrides": {}, "seed": seed}}
        run_train_from_package(spec, str(package), str(folder / f"s{seed}"), pipeline_run_id=None, device="cpu",
                               torch_threads=1)
    return demo_copy, folder


def test_record_waits_for_and_refuses_a_live_writer(results) -> None:
    db, folder = results
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from medtx.store.writer_lock import "
                               "hold_writer\nwith hold_writer(sys.argv[1], 'medtx pipeline'):\n print('held', "
                               "flush=True); time.sleep(120)", str(db)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _sha(db)
        proc = _record(folder, db, MEDTX_LOCK_WAIT_S="0")
        assert proc.returncode == 1, proc.stderr
        (line,) = _lines(proc.stderr)
        assert "is being written by `medtx pipeline`" in line
        assert _sha(db) == before
    finally:
        holder.kill()
        holder.wait()


def test_record_refuses_a_run_trained_on_other_data_under_the_same_name(results) -> None:
    db, folder = results
    with duckdb.connect(str(db)) as con:  # the warehouse's readmission samples now differ from what was trained on
        con.execute("DELETE FROM samples.readmission WHERE hadm_id = (SELECT min(hadm_id) FROM samples.readmission "
                    "WHERE dataset = 'mimic3_demo')")
    before, sha = _counts(db), _sha(db)
    proc = _record(folder, db)
    assert proc.returncode == 2, proc.stderr
    lines = _lines(proc.stderr)
    assert len(lines) == 2 and all("trained on other data than this warehouse holds" in line for line in lines)
    assert _counts(db) == before and _sha(db) == sha


def test_a_bad_tar_and_a_damaged_package_are_one_line_each_and_the_rest_is_recorded(results) -> None:
    db, folder = results
    (folder / "results-1.tar").write_bytes(b"this is no tar" * 100)
    with open(folder / "s2" / "ml.metrics.parquet", "ab") as handle:
        handle.write(b"junk")  # a cut or rewritten file
    before = _counts(db)
    proc = _record(folder, db)
    assert proc.returncode == 2, proc.stderr
    lines = _lines(proc.stderr)
    assert len(lines) == 2, proc.stderr
    assert any("results-1.tar: not a readable tar" in line for line in lines)
    assert any("s2: " in line and "ml.metrics.parquet" in line for line in lines)
    assert "Traceback" not in proc.stderr
    assert _counts(db)["ml.runs"] == before["ml.runs"] + 1  # s1 recorded on its own
    # inputs are never deleted: both packages and the tar are where they were
    assert (folder / "s1" / "manifest.json").exists() and (folder / "s2").exists() and (folder / "results-1.tar").exists()
    again = _record(folder, db)  # s1 again: a no-op, the same lines for the others
    assert again.returncode == 2 and _counts(db)["ml.runs"] == before["ml.runs"] + 1
