"""Small frictions of issue 45, each on the real demo warehouse: drug_rec's empty-cohort hint knows whether
map-codes has run; `medtx status` lists procedures; the training log line prints the point estimate ml.metrics
stores (not the mean of the 10 x 80% subsamples)."""

from __future__ import annotations

import logging
import re
import shutil

import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.codes import map_codes
from medtx.store.db import connect
from medtx.tasks import get_task
from medtx.tasks.build import EmptyCohortError, build_samples
from medtx.pipeline.steps import train_in_process
from tests.conftest import DATA
from tests.fixtures_samples import DEMO, demo_db  # noqa: F401  (session fixture)


@pytest.fixture
def demo(demo_db, tmp_path):  # noqa: F811
    db = tmp_path / "w.duckdb"
    shutil.copy(demo_db, db)
    return db


def test_drug_rec_hint_after_map_codes(demo):
    con = connect(demo)
    try:
        # prescriptions no map knows (no NDC, an unknown name): map-codes runs and maps none of them
        con.execute("UPDATE raw.prescriptions SET ndc = '0', drug = 'ZZQX', drug_name_generic = 'ZZQX' "
                    "WHERE dataset = ?", [DEMO])
        map_codes(con, DATA, [DEMO], reload_reference=False)
        with pytest.raises(EmptyCohortError) as ran:
            build_samples(con, DATA, ["drug_rec"], [DEMO])
        con.execute("DELETE FROM core.mapping_coverage WHERE dataset = ?", [DEMO])  # as if it never ran
        with pytest.raises(EmptyCohortError) as never:
            build_samples(con, DATA, ["drug_rec"], [DEMO])
    finally:
        con.close()
    assert "map-codes has run and mapped none of its prescriptions" in str(ran.value)
    assert "rows without an NDC" in str(ran.value) and "first" not in str(ran.value)
    assert f"run `medtx map-codes --dataset {DEMO}` first" in str(never.value)


def test_status_lists_procedures(demo):
    r = CliRunner().invoke(app, ["status", "--db", str(demo)])
    assert r.exit_code == 0, r.output
    con = connect(demo, read_only=True)
    try:
        n = con.execute("SELECT count(*) FROM raw.procedures_icd WHERE dataset = ?", [DEMO]).fetchall()[0][0]
    finally:
        con.close()
    assert n > 0 and re.search(rf"{DEMO}\s*│\s*procedures\s*│\s*{n:,}", r.output), r.output


def test_train_log_line_prints_the_stored_point_estimate(demo, caplog):
    with caplog.at_level(logging.INFO, logger="medtx.training"):
        run_id = train_in_process(demo, get_task("readmission"), "logreg", 0, dataset=DEMO)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("readmission logreg seed 0")]
    assert logged, [r.getMessage() for r in caplog.records]
    shown = float(re.search(r"auroc=([0-9.]+)", logged[-1])[1])
    con = connect(demo, read_only=True)
    try:
        stored, sd = con.execute("SELECT value, sd FROM ml.metrics WHERE run_id = ? AND split = 'test' "
                                 "AND metric = 'auroc'", [run_id]).fetchall()[0]
    finally:
        con.close()
    assert abs(shown - stored) < 5e-5 and sd is not None  # the 4-decimal print of the stored value
