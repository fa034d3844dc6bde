"""Issue 34, cases 3 and 15 (lock file): the writer lock cannot be bypassed through a symlinked `--db` or
folder, a live holder file with fields this version does not know still holds, and a damaged holder file (a
text pid, a folder in its place) is one line naming it, exit 2 — never a traceback, never replaced as stale.
Real processes hold the lock; the real `medtx ingest` CLI runs against a real DuckDB file."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.store.db import connect
from medtx.store.writer_lock import HolderFileDamaged, hold_writer, holder_path, read_holder
from tests.conftest import DATA

REPO = Path(__file__).resolve().parent.parent
MTSAMPLES = DATA / "mtsamples" / "mtsamples.csv.gz"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _holder_process(db: Path, seconds: float, extra: dict | None = None) -> subprocess.Popen:
    """A real process holding `db`'s writer file (with `extra` keys added to it) until killed."""
    code = textwrap.dedent(f"""
        import json, time
        from medtx.store.writer_lock import hold_writer, holder_path
        with hold_writer({str(db)!r}, "medtx pipeline", wait_s=0):
            if {extra!r}:
                path = holder_path({str(db)!r})
                path.write_text(json.dumps({{**json.loads(path.read_text()), **{extra!r}}}))
            print("held", flush=True)
            time.sleep({seconds})
        """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _notes(db: Path) -> int:
    con = connect(db, read_only=True)
    try:
        return con.sql("SELECT count(*) FROM raw.mtsamples").fetchall()[0][0]
    finally:
        con.close()


def _ingest(db: Path, source: Path, monkeypatch) -> tuple[int, str]:
    monkeypatch.setenv("MEDTX_LOCK_WAIT_S", "1")
    result = CliRunner().invoke(app, ["ingest", "mtsamples", "--db", str(db), "--source", str(source),
                                      "--allow-shrink"])
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> tuple[Path, Path]:
    """A warehouse holding the 4,999 bundled notes, and a 5-note MTSamples file to replace them with."""
    folder = tmp_path_factory.mktemp("lock")
    db = folder / "real" / "w.duckdb"
    db.parent.mkdir()
    assert CliRunner().invoke(app, ["ingest", "mtsamples", "--db", str(db)]).exit_code == 0
    five = folder / "five.csv"
    lines = gzip.open(MTSAMPLES, "rt", newline="").read().split("\n")
    text = "\n".join(lines)
    five.write_text(text[: text.index("\n6,")] + "\n", newline="")
    assert _notes(db) == 4999
    return db, five


@pytest.mark.parametrize("how", ["file symlink", "folder symlink"])
def test_a_symlinked_db_meets_the_same_lock(warehouse, tmp_path: Path, monkeypatch, how: str) -> None:
    db, five = warehouse
    if how == "file symlink":
        alias = tmp_path / "alias.duckdb"
        alias.symlink_to(db)
    else:
        (tmp_path / "linked").symlink_to(db.parent, target_is_directory=True)
        alias = tmp_path / "linked" / db.name
    assert holder_path(alias) == holder_path(db) == db.with_name("w.duckdb.writer.json")
    holder = _holder_process(db, 600)
    try:
        code, out = _ingest(db=alias, source=five, monkeypatch=monkeypatch)
        assert code == 1, out
        assert f"is being written by `medtx pipeline` pid {holder.pid}" in out
        assert "gave up after waiting 1 s" in out
        assert _notes(db) == 4999  # before: 4,999 notes replaced by 5 under a live writer
    finally:
        holder.kill()
        holder.wait()


def test_a_live_holder_with_an_unknown_field_still_holds(warehouse, tmp_path: Path, monkeypatch) -> None:
    db, five = warehouse
    holder = _holder_process(db, 600, extra={"written_by": "medtx 9.9", "gpu": [0, 1]})
    try:
        data = json.loads(holder_path(db).read_text())
        assert data["written_by"] == "medtx 9.9" and data["pid"] == holder.pid
        assert read_holder(db).pid == holder.pid  # before: TypeError -> None -> "stale" -> replaced
        code, out = _ingest(db, five, monkeypatch)
        assert code == 1 and f"pid {holder.pid}" in out, out
        assert _notes(db) == 4999
        assert json.loads(holder_path(db).read_text())["pid"] == holder.pid  # not taken over
    finally:
        holder.kill()
        holder.wait()


DAMAGED = {
    "text pid": (lambda p: p.write_text(json.dumps({"command": "medtx pipeline", "pid": "abc", "host": "h",
                                                    "since": "2026-01-01T00:00:00+00:00"})),
                 "field 'pid' is 'abc', expected a process id"),
    "folder in its place": (lambda p: p.mkdir(), "is a folder, not a file"),
    "a JSON list": (lambda p: p.write_text("[1, 2]"), "holds list JSON, not an object"),
    "missing host": (lambda p: p.write_text(json.dumps({"command": "x", "pid": 12, "since": "s"})),
                     "field 'host' is None, expected text"),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_holder_file_is_one_line_exit_2(warehouse, tmp_path: Path, monkeypatch, case: str) -> None:
    db0, five = warehouse
    db = tmp_path / "w.duckdb"
    db.write_bytes(db0.read_bytes())
    damage, message = DAMAGED[case]
    damage(holder_path(db))
    code, out = _ingest(db, five, monkeypatch)
    assert code == 2, out
    assert f"{holder_path(db)}: {message}" in out
    assert "the warehouse's writer file is damaged; remove it if no medtx command is writing this warehouse" in out
    assert "Traceback" not in out and len(out.splitlines()) == 1
    assert _notes(db) == 4999
    assert holder_path(db).exists()  # left for a person to look at, never replaced as stale
    with pytest.raises(HolderFileDamaged):
        with hold_writer(db, "test", wait_s=0):
            pass


def test_a_half_written_holder_file_is_still_taken_over(tmp_path: Path) -> None:
    """A holder killed between create and write leaves an empty or cut file: that stays stale, not damaged."""
    db = tmp_path / "w.duckdb"
    for text in ("", '{"command": "medtx pip'):
        holder_path(db).write_text(text)
        assert read_holder(db) is None
        with hold_writer(db, "test", wait_s=0) as me:
            assert read_holder(db).pid == me.pid == os.getpid()
        assert not holder_path(db).exists()


def test_medtx_pipeline_refuses_a_damaged_holder_file_with_exit_2(tmp_path: Path) -> None:
    """The pipeline checks the writer file first (before its config, before any server): same line, exit 2."""
    db = tmp_path / "w.duckdb"
    holder_path(db).mkdir()
    result = CliRunner().invoke(app, ["pipeline", "--db", str(db)])
    out = " ".join(result.output.split())
    assert result.exit_code == 2, out
    assert f"{holder_path(db)}: is a folder, not a file: the warehouse's writer file is damaged" in out
    assert not db.exists()  # nothing created
