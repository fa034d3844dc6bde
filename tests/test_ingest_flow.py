"""The `medtx ingest` commands (under Prefect a dataset's ingest is a pipeline step: tests/test_pipeline_flow.py)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app
from medtx.store.db import connect
from tests.conftest import DATA


def rows(db: Path, sql: str) -> list[tuple]:
    con = connect(db, read_only=True)
    try:
        return con.sql(sql).fetchall()
    finally:
        con.close()


def test_cli_ingest_mimic3_and_mtsamples(tmp_path):
    runner = CliRunner()
    db = tmp_path / "w.duckdb"
    out = runner.invoke(app, ["ingest", "mimic3", "--db", str(db), "--table", "PATIENTS", "--table", "admissions"])
    assert out.exit_code == 0, out.output
    assert "mimic3_demo" in out.output and "129" in out.output
    out = runner.invoke(app, ["ingest", "mtsamples", "--db", str(db), "--limit", "10"])
    assert out.exit_code == 0, out.output
    assert rows(db, "SELECT (SELECT count(*) FROM raw.patients), (SELECT count(*) FROM raw.mtsamples)") == [(100, 10)]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "PATIENTS.csv").write_text("")
    out = runner.invoke(app, ["ingest", "mimic3", "--db", str(db), "--source", str(bad), "--table", "patients"])
    assert out.exit_code == 2 and "PATIENTS.csv: the file is empty" in out.output
    assert rows(db, "SELECT count(*) FROM raw.patients") == [(100,)]
