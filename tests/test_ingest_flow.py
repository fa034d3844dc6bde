"""The real Prefect flow `ingest` (temporary local server) and the `medtx ingest` commands."""

from __future__ import annotations

from pathlib import Path

import pytest
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


@pytest.mark.slow
def test_ingest_flow_runs_one_task_per_dataset(prefect_harness, tmp_path):
    from prefect import get_client

    from flows.ingest import ingest

    db = tmp_path / "w.duckdb"
    state = ingest(
        mimic3_source=str(DATA / "mimic3_demo"), mtsamples_source=str(DATA / "mtsamples" / "mtsamples.csv.gz"),
        db=db, mtsamples_limit=50, return_state=True,
    )
    assert state.is_completed()
    results = state.result()
    assert [(r.table, r.rows_loaded) for r in results] == [
        ("patients", 100), ("admissions", 129), ("diagnoses_icd", 1761), ("procedures_icd", 506),
        ("prescriptions", 10398), ("noteevents", 0), ("mtsamples", 50)]
    assert rows(db, "SELECT count(*) FROM raw.ingest_log") == [(7,)]

    async def task_run_names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs()
            return sorted(r.name for r in runs if r.flow_run_id == state.state_details.flow_run_id)

    import asyncio

    names = asyncio.run(task_run_names())
    # a dataset's tables are one atomic unit (medtx/ingest/staging.py), so one task per dataset
    assert names == ["ingest-mimic3_demo", "ingest-mtsamples"]


def test_retry_condition_only_for_io_errors():
    import duckdb
    from prefect.states import Failed

    from flows.ingest import retry_on_io_error
    from medtx.ingest import DownloadError, IngestError

    assert retry_on_io_error(None, None, Failed(data=DownloadError("http://x: timed out")))
    assert retry_on_io_error(None, None, Failed(data=duckdb.IOException("Could not set lock on file")))
    assert not retry_on_io_error(None, None, Failed(data=IngestError("f.csv: missing column")))


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
