"""Issue 44: every file a user names for medtx to write passes one guard (medtx.store.outputs): never the
warehouse, its snapshot, writer file or folders (symlinks and hard links followed), an existing file only with
`--overwrite`, and never a file the command did not mean to write (the card's Markdown twin). Each refusal is
one line, exit 2, and the warehouse's bytes are unchanged."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.store.db import connect
from medtx.store.outputs import OutputRefused, Protected, check_output, write_output
from tests.test_trust import trust_db  # noqa: F401  (a warehouse with two completed runs, 'ref' and 'run')


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def empty_db(tmp_db: Path) -> Path:
    connect(tmp_db).close()  # migrated, no runs: the guard refuses before anything is read
    return tmp_db


def _report(db: Path, *args: str):
    return CliRunner().invoke(app, ["report", "--run", "run", "--db", str(db), *args])


@pytest.mark.parametrize("target", ["warehouse", "snapshot", "writer"])
def test_report_refuses_a_symlink_to_the_warehouse_or_its_files(empty_db: Path, tmp_path: Path, target: str):
    files = {"warehouse": empty_db, "snapshot": empty_db.with_name("warehouse.snapshot.duckdb"),
             "writer": empty_db.with_name("warehouse.duckdb.writer.json")}
    if target != "warehouse":
        shutil.copy(empty_db, files[target])
    before = {name: _sha(path) for name, path in files.items() if path.exists()}
    link = tmp_path / "elsewhere" / "card.html"
    link.parent.mkdir()
    link.symlink_to(files[target])
    result = _report(empty_db, "--out", str(link), "--overwrite")
    assert result.exit_code == 2, result.output
    assert "must never replace" in _one_line(result.output)
    assert {name: _sha(path) for name, path in files.items() if path.exists()} == before


def test_report_refuses_a_hard_link_to_the_warehouse_in_another_folder(empty_db: Path, tmp_path: Path):
    before = _sha(empty_db)
    link = tmp_path / "other" / "card.html"
    link.parent.mkdir()
    os.link(empty_db, link)
    result = _report(empty_db, "--out", str(link), "--overwrite")
    assert result.exit_code == 2 and "hard link" in _one_line(result.output)
    assert _sha(empty_db) == before


def test_report_refuses_a_markdown_twin_that_is_a_link_to_the_warehouse(empty_db: Path, tmp_path: Path):
    before = _sha(empty_db)
    (tmp_path / "cards").mkdir()
    (tmp_path / "cards" / "card.md").symlink_to(empty_db)
    result = _report(empty_db, "--out", str(tmp_path / "cards" / "card.html"), "--overwrite")
    assert result.exit_code == 2 and "card.md" in _one_line(result.output)
    assert _sha(empty_db) == before and not (tmp_path / "cards" / "card.html").exists()


def test_report_never_replaces_a_users_markdown_file(empty_db: Path, tmp_path: Path):
    mine = tmp_path / "card.md"
    mine.write_text("my notes")
    result = _report(empty_db, "--out", str(tmp_path / "card.html"))
    assert result.exit_code == 2 and "card.md: file exists" in _one_line(result.output)
    assert mine.read_text() == "my notes" and not (tmp_path / "card.html").exists()


@pytest.mark.parametrize("where", ["warehouse folder", "models folder"])
def test_report_refuses_the_warehouse_folder_and_the_managed_folders(empty_db: Path, where: str):
    out = empty_db.parent.with_suffix(".html") if where == "warehouse folder" else None
    if where == "warehouse folder":  # a link named card.html that points at the warehouse's folder
        out = empty_db.parent.parent / f"{empty_db.parent.name}-card.html"
        out.symlink_to(empty_db.parent)
    else:
        out = empty_db.parent / "models" / "card.html"
    before = _sha(empty_db)
    result = _report(empty_db, "--out", str(out))
    assert result.exit_code == 2, result.output
    _one_line(result.output)
    assert _sha(empty_db) == before


def test_report_replaces_an_existing_card_only_with_overwrite(trust_db: Path, tmp_path: Path):  # noqa: F811
    out = tmp_path / "card.html"
    out.write_text("old card")
    kept_link = tmp_path / "kept.html"
    os.link(out, kept_link)  # a hard link to the old card elsewhere keeps its content (write then rename)
    before = _sha(trust_db)
    refused = _report(trust_db, "--out", str(out))
    assert refused.exit_code == 2 and "--overwrite" in _one_line(refused.output)
    assert out.read_text() == "old card"
    done = _report(trust_db, "--out", str(out), "--overwrite")
    assert done.exit_code == 0, done.output
    assert out.read_text().startswith("<!DOCTYPE html>") and kept_link.read_text() == "old card"
    assert _sha(trust_db) == before


def _hold_writer(db: Path) -> subprocess.Popen:
    """Another process holding DuckDB's write lock on `db` (what a running pipeline step does)."""
    proc = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                             "print('held', flush=True); time.sleep(120)", str(db)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_report_on_a_locked_warehouse_fails_fast_or_reads_the_snapshot(trust_db: Path, tmp_path: Path):  # noqa: F811
    holder = _hold_writer(trust_db)
    try:
        started = time.monotonic()
        locked = _report(trust_db, "--out", str(tmp_path / "a.html"))
        assert time.monotonic() - started < 20, "waited for the lock instead of failing fast"
        assert locked.exit_code == 1 and "locked" in _one_line(locked.output)
    finally:
        holder.kill()
        holder.wait()
    shutil.copy(trust_db, trust_db.with_name("warehouse.snapshot.duckdb"))
    holder = _hold_writer(trust_db)
    try:
        result = _report(trust_db, "--out", str(tmp_path / "b.html"))
        assert result.exit_code == 0 and "published snapshot" in result.output
    finally:
        holder.kill()
        holder.wait()


def test_report_names_the_true_error_of_a_file_that_is_not_a_warehouse(tmp_path: Path):
    db = tmp_path / "warehouse.duckdb"
    db.write_bytes(b"not a duckdb file at all" * 200)
    before = _sha(db)
    result = _report(db, "--out", str(tmp_path / "card.html"))
    line = _one_line(result.output)
    assert result.exit_code == 2 and "locked" not in line and "cannot be read" in line
    assert _sha(db) == before


def test_export_predictions_refuses_a_hard_link_to_the_warehouse(empty_db: Path, tmp_path: Path):
    before = _sha(empty_db)
    link = tmp_path / "elsewhere" / "preds.parquet"
    link.parent.mkdir()
    os.link(empty_db, link)
    result = CliRunner().invoke(app, ["export", "predictions", "--run", "run", "--out", str(link), "--overwrite",
                                      "--db", str(empty_db)])
    assert result.exit_code == 2 and "hard link" in _one_line(result.output)
    assert _sha(empty_db) == before


def test_check_output_unit_cases(tmp_path: Path):
    wh = tmp_path / "w" / "warehouse.duckdb"
    wh.parent.mkdir()
    wh.write_bytes(b"x")
    guard = Protected((wh, wh.parent), (tmp_path / "w" / "models",))
    with pytest.raises(OutputRefused, match="is or contains"):
        check_output(tmp_path, guard, overwrite=True)  # a folder holding the warehouse
    (tmp_path / "dir.html").mkdir()
    with pytest.raises(OutputRefused, match="not a plain file"):
        check_output(tmp_path / "dir.html", guard, overwrite=True)
    fine = check_output(tmp_path / "w" / "reports" / "x.html", guard, overwrite=False)  # beside the warehouse
    write_output(fine, "ok")
    assert fine.read_text() == "ok" and wh.read_bytes() == b"x"


def test_a_hard_linked_warehouse_is_refused_by_every_writer(empty_db: Path, tmp_path: Path):
    """A hard link elsewhere would give a second writer another writer file (the lock beside the other name)."""
    other = tmp_path / "other"
    other.mkdir()
    link = other / "w.duckdb"
    os.link(empty_db, link)
    before = _sha(empty_db)
    for db in (empty_db, link):
        result = CliRunner().invoke(app, ["train", "--task", "readmission", "--model", "logreg", "--db", str(db)])
        assert result.exit_code == 2, result.output
        assert "hard links" in _one_line(result.output)
    assert _sha(empty_db) == before and not list(other.glob("*.writer.json"))
