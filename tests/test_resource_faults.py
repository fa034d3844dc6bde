"""Issue 34 items 13, 14, 15: resource faults end with one clear line and exit 2, never a traceback, and leave
every table as it was. A full disk is a real one: a small tmpfs mounted for the test (root only: skipped where
mounting is not permitted); a file size limit is RLIMIT_FSIZE (`ulimit -f`), which makes writes fail with
EFBIG; a read-only warehouse folder is that tmpfs remounted read-only (root ignores chmod). The real `medtx`
CLI runs in subprocesses, with no PREFECT_HOME in its environment (its Prefect home would be created under the
warehouse's folder).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest

from tests.fixtures_prefect import migrated_prefect_home

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
SMALL = """datasets: [{source: "synth:60"}]
tasks: {drug_rec: {models: [{model: most_frequent}, {model: logreg}]}}
seeds: [42]
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MEDTX_"))}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _medtx(*args: str, env: dict | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-c", "from flows.cli import main; main()", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout, cwd=REPO, check=False, **kw)


def _lines(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]


def row_counts(db: Path) -> dict[str, int]:
    """Rows of every table of the warehouse (opened read-only)."""
    with duckdb.connect(str(db), read_only=True) as con:
        tables = con.execute("SELECT table_schema, table_name FROM information_schema.tables "
                             "WHERE table_type = 'BASE TABLE' ORDER BY 1, 2").fetchall()
        return {f"{s}.{t}": con.execute(f'SELECT count(*) FROM "{s}"."{t}"').fetchone()[0] for s, t in tables}


@pytest.fixture
def tmpfs(tmp_path: Path):
    """A real 256 MB file system of its own (a tmpfs: memory only as far as it is written), unmounted after."""
    mount = tmp_path / "fs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)], capture_output=True,
                          text=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip()}): needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(folder: Path, leave_bytes: int) -> Path:
    """Fill the file system of `folder` until `leave_bytes` are free."""
    filler = folder / "filler"
    free = shutil.disk_usage(folder).free
    with filler.open("wb") as f:
        f.truncate(0)
        f.write(b"\0" * max(0, free - leave_bytes))
    return filler


def _demo_warehouse(db: Path) -> None:
    for args in (("ingest", "mimic3"), ("map-codes",)):
        out = _medtx(*args, "--db", str(db))
        assert out.returncode == 0, out.stderr


def test_disk_full_ends_ingest_map_codes_and_build_samples_with_one_line(tmpfs: Path) -> None:
    db = tmpfs / "w.duckdb"
    _demo_warehouse(db)
    before = row_counts(db)
    assert before["raw.patients"] == 100 and before["raw.prescriptions"] == 10_398
    filler = _fill(tmpfs, 64_000)
    for args in (("ingest", "mimic3"), ("map-codes",), ("build-samples",)):
        started = time.monotonic()
        out = _medtx(*args, "--db", str(db))
        lines = [line for line in _lines(out) if not line.startswith(("WARNING", "INFO"))]
        assert out.returncode == 2, (args, out.stderr[-3000:])
        assert len(lines) == 1 and lines[0].startswith(f"medtx: no space left on device: {tmpfs}"), (args, lines)
        assert "Traceback" not in out.stderr and "RecursionError" not in out.stderr
        assert time.monotonic() - started < 60
    filler.unlink()
    assert row_counts(db) == before  # every table of the warehouse as it was


def test_a_file_size_limit_ends_ingest_with_one_line(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    _demo_warehouse(db)
    before = row_counts(db)
    limit = 256 * 1024  # no write may reach past 256 KB of any file (RLIMIT_FSIZE, `ulimit -f 256`)

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = _medtx("ingest", "mimic3", "--source", str(REPO / "data" / "mimic3_demo"), "--dataset", "second",
                 "--db", str(db), preexec_fn=limited)
    lines = [line for line in _lines(out) if not line.startswith(("WARNING", "INFO"))]
    assert out.returncode == 2, out.stderr[-3000:]
    assert lines == [f"medtx: file too large (the file size limit was reached): {db}.wal; stopped"] or (
        len(lines) == 1 and lines[0].startswith("medtx: file too large (the file size limit was reached): ")), lines
    assert "Traceback" not in out.stderr
    assert row_counts(db) == before


def test_a_pipeline_refuses_to_start_on_a_full_disk_before_any_server(tmpfs: Path) -> None:
    config = tmpfs.parent / "small.yaml"
    config.write_text(SMALL)
    _fill(tmpfs, 3_000_000)
    started = time.monotonic()
    out = _medtx("pipeline", "--config", str(config), "--db", str(tmpfs / "w.duckdb"))
    seconds = time.monotonic() - started
    assert out.returncode == 2, out.stderr
    lines = _lines(out)
    assert len(lines) == 1 and lines[0].startswith(f"medtx: no space left on {tmpfs}: "), lines
    assert "a pipeline run needs at least 100 MB there (free some space, or set MEDTX_MIN_FREE_MB)" in lines[0]
    assert sorted(p.name for p in tmpfs.iterdir()) == ["filler"]  # no warehouse, no Prefect home, no log
    assert seconds < 15, seconds


@pytest.mark.slow
def test_a_disk_that_fills_during_a_pipeline_ends_it_with_one_line(tmpfs: Path, tmp_path: Path) -> None:
    """The warehouse's disk is full, the Prefect server's is not: every step that writes fails on ENOSPC, the
    log file stops with one line, and the command ends with one line naming the file, exit 2 (it printed
    26,720 stderr lines and recorded a RecursionError)."""
    config = tmp_path / "small.yaml"
    config.write_text(SMALL)
    _fill(tmpfs, 3_000_000)
    out = _medtx("pipeline", "--config", str(config), "--db", str(tmpfs / "w.duckdb"),
                 env=_env(MEDTX_MIN_FREE_MB="1", PREFECT_HOME=str(migrated_prefect_home(tmp_path / "prefect"))))
    lines = _lines(out)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "RecursionError" not in out.stderr and len(lines) < 20, lines
    last = [line for line in out.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(f"medtx: no space left on device: {tmpfs / 'w.duckdb'}"), lines
    assert "the pipeline stopped" in last
    assert sum("cannot write the log file" in line for line in lines) <= 1


def _read_only(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)


def test_read_only_warehouse_folder_readers_work_writers_fail_with_one_line(tmpfs: Path) -> None:
    from medtx.publish.snapshot import publish_snapshot
    from medtx.settings import snapshot_path

    db = tmpfs / "w.duckdb"
    _demo_warehouse(db)
    for args in (("build-samples",), ("train", "--task", "drug_rec", "--model", "logreg")):
        assert _medtx(*args, "--db", str(db)).returncode == 0
    publish_snapshot(db, snapshot_path(db))
    before = row_counts(db)
    _read_only(tmpfs)
    listing = sorted(p.name for p in tmpfs.iterdir())

    status = _medtx("status", "--db", str(db))
    assert status.returncode == 0, status.stderr
    assert "mimic3_demo" in status.stdout and "10,398" in status.stdout
    board = _medtx("leaderboard", "--task", "drug_rec", "--db", str(db))
    assert board.returncode == 0 and "logreg" in board.stdout and "Traceback" not in board.stderr, board.stderr

    port = 18000 + os.getpid() % 1000
    server = subprocess.Popen([PY, "-c", "from flows.cli import main; main()", "dashboard", "--db", str(db),
                               "--port", str(port)], env=_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        codes = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(codes) < 2:
            for path in ("/", "/_dash-layout"):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                        codes[path] = r.status
                except OSError:
                    time.sleep(0.5)
        assert codes == {"/": 200, "/_dash-layout": 200}, (codes, server.poll())
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)

    for args in (("ingest", "mimic3"), ("build-samples",), ("train", "--task", "drug_rec", "--model", "logreg")):
        out = _medtx(*args, "--db", str(db))
        assert out.returncode == 2, (args, out.stderr[-2000:])
        assert _lines(out) == [f"medtx: read-only file system: {db}.writer.json; stopped"], (args, _lines(out))
    config = tmpfs.parent / "small.yaml"
    config.write_text(SMALL)
    out = _medtx("pipeline", "--config", str(config), "--db", str(db))
    assert out.returncode == 2 and len(_lines(out)) == 1 and "read-only file system" in out.stderr, out.stderr
    assert sorted(p.name for p in tmpfs.iterdir()) == listing  # no Prefect home, no log folder created
    assert row_counts(db) == before


@pytest.mark.parametrize("value", ["nan", "abc", "-1", "inf"])
def test_a_bad_lock_wait_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    out = _medtx("ingest", "mimic3", "--db", str(tmp_path / "w.duckdb"), env=_env(MEDTX_LOCK_WAIT_S=value))
    assert out.returncode == 2
    assert _lines(out) == [f"medtx: MEDTX_LOCK_WAIT_S={value!r}: not a wait; allowed: a finite number of seconds "
                           ">= 0 (default 120)"]
    assert list(tmp_path.iterdir()) == []
