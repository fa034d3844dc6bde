"""`medtx export meds` / `medtx ingest meds` through the CLI, and a MEDS folder as a pipeline dataset
(a real Prefect flow run)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.pipeline.config import load_config
from medtx.pipeline.plan import build_plan
from tests.conftest import DATA
from tests.fixtures_samples import DEMO, demo_db  # noqa: F401  (session fixture)


@pytest.fixture(scope="module")
def exported(demo_db, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("meds-cli")
    db = folder / "warehouse.duckdb"
    shutil.copy(demo_db, db)
    out = folder / "demo_meds"
    result = CliRunner().invoke(app, ["export", "meds", "--dataset", DEMO, "--out", str(out), "--labels",
                                      "readmission", "--db", str(db)])
    assert result.exit_code == 0, result.output
    return db, out


def test_cli_export_then_ingest_and_one_line_failures(exported, tmp_path):
    db, out = exported
    assert (out / "labels" / "readmission" / "train" / "0.parquet").is_file()
    assert (out / "data" / "train" / "0.parquet").is_file()
    cli = CliRunner()
    again = cli.invoke(app, ["export", "meds", "--dataset", DEMO, "--out", str(out), "--db", str(db)])
    assert again.exit_code == 2 and "folder exists and is not empty" in again.output
    result = cli.invoke(app, ["ingest", "meds", "--source", str(out), "--dataset", "demo_back", "--db", str(db)])
    assert result.exit_code == 0, result.output
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM raw.admissions WHERE dataset = 'demo_back'").fetchall()[0][0] == 129
    bad_codes = tmp_path / "codes.yaml"
    bad_codes.write_text("name: x\nadmission: 'A//'\ndischarge: 'D//'\ndiagnoses: [{prefx: 'DX//'}]\n")
    result = cli.invoke(app, ["ingest", "meds", "--source", str(out), "--codes", str(bad_codes), "--db", str(db)])
    assert result.exit_code == 2
    assert "codes.yaml: key 'diagnoses.0.prefix'" in result.output.replace("\n", "")


@pytest.mark.slow
def test_meds_dataset_in_the_pipeline_config_runs_through_prefect(prefect_harness, exported, tmp_path, monkeypatch):
    _, out = exported
    for name in ("cache_dir", "results_dir", "models_dir"):
        monkeypatch.setenv(f"MEDTX_{name.upper()}", str(tmp_path / name))
    config = tmp_path / "pipeline.yaml"
    config.write_text(textwrap.dedent(f"""
        datasets:
          - {{source: {out}, format: meds, name: demo_meds}}
        seeds: [42]
        tasks:
          readmission:
            models: [{{model: logreg}}]
        runner: {{torch_threads: 1}}
        """))
    plan = build_plan(load_config(config), tmp_path / "synth", DATA)
    step = plan["ingest.demo_meds.meds"]
    assert step.params["table"] == "meds" and any(f.endswith("subject_splits.parquet") for f in step.files)
    assert "codes.demo_meds" in plan.downstream("ingest.demo_meds.meds")
    from flows.pipeline import run_pipeline

    db = tmp_path / "warehouse.duckdb"
    state = run_pipeline(config, db, return_state=True)
    assert state.is_completed(), state.message
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT status FROM ml.runs WHERE dataset = 'demo_meds' AND model = 'logreg'").fetchall() == [
            ("completed",)]
        assert con.sql("SELECT count(*) FROM samples.readmission WHERE dataset = 'demo_meds'").fetchall()[0][0] > 0
        states = dict(con.sql("SELECT step, state FROM ml.pipeline_steps").fetchall())
    assert states["ingest.demo_meds.meds"] == "completed", states
