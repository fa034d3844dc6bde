"""Unit tests of the pipeline's pure parts: config, plan, fingerprints, snapshot publishing, cache stamps.

The end-to-end flow runs in tests/test_pipeline_flow.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from medtx.store.db import connect, open_warehouse
from medtx.store.fingerprint import code_version, source_fingerprint, table_fingerprint, tables_fingerprint
from medtx.pipeline.config import load_config
from medtx.pipeline.plan import build_plan
from medtx.pipeline.runs import (
    StepOutcome,
    cache_still_valid,
    input_key,
    output_fingerprint,
    record_step,
    start_pipeline_run,
)
from medtx.publish.snapshot import open_snapshot, publish_snapshot

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


# ------------------------------------------------------------------------------------------------ config


def test_bundled_configs_load_and_plan(tmp_path: Path) -> None:
    for name in ("default.yaml", "full.yaml"):
        cfg = load_config(REPO / "config" / name)
        plan = build_plan(cfg, tmp_path / "synth", DATA)
        assert len(set(plan.names)) == len(plan.names)
        kinds = [s.kind.name for s in plan.steps]
        assert kinds == sorted(kinds, key=["synth", "ingest", "reference", "codes", "samples", "train"].index)
    default = build_plan(load_config(REPO / "config" / "default.yaml"), tmp_path / "synth", DATA)
    # every configured model is a step; the oracle only on the synthetic cohort
    assert "train.drug_rec.synth_2000.oracle.s42" in default.names
    assert "train.drug_rec.mimic3_demo.oracle.s42" not in default.names
    assert default["ingest.mimic3_demo"].params["source"] == str(DATA / "mimic3_demo")


def test_config_errors_name_file_and_key(tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.yaml", """
        datasets: [{source: synth:10}]
        tasks:
          drug_rec:
            modles: [{model: logreg}]
        """)
    with pytest.raises(ValueError, match=r"(?s)bad\.yaml.*modles"):
        load_config(bad)
    unknown = _write(tmp_path / "unknown.yaml", """
        datasets: [{source: synth:10}]
        tasks: {drug_rec: {datasets: [nope], models: [{model: logreg}]}}
        """)
    with pytest.raises(ValueError, match="(?s)unknown dataset.*nope"):
        load_config(unknown)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.yaml")


def test_plan_dependencies_and_downstream(tmp_path: Path) -> None:
    cfg_path = _write(tmp_path / "c.yaml", f"""
        datasets: [{{source: {DATA / 'mimic3_demo'}}}]
        tasks:
          drug_rec:
            models: [{{model: logreg}}, {{model: gru, name: gru_small, overrides: {{epochs: 1}}, seeds: [1, 2]}}]
        """)
    plan = build_plan(load_config(cfg_path), tmp_path, DATA)
    train = plan["train.drug_rec.mimic3_demo.gru_small.s2"]
    assert train.params == {"model": "gru", "overrides": {"epochs": 1}, "seed": 2}
    assert train.needs == ("samples.drug_rec.mimic3_demo",)
    down = plan.downstream("ingest.mimic3_demo")  # one step per dataset: its tables are one atomic unit
    assert down[:2] == ["codes.mimic3_demo", "samples.drug_rec.mimic3_demo"]
    assert "train.drug_rec.mimic3_demo.logreg.s42" in down
    assert "reference" not in down
    assert plan["ingest.mimic3_demo"].writes == tuple(f"raw.{t}" for t in (
        "patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents"))
    with pytest.raises(KeyError, match="known steps"):
        plan["train.nope"]


# ------------------------------------------------------------------------------------------ fingerprints


def test_table_fingerprint_tracks_content_not_order_or_volatile_columns(tmp_db: Path) -> None:
    con = duckdb.connect(str(tmp_db))
    con.execute("CREATE TABLE t (dataset VARCHAR, code VARCHAR, n INT, ingested_at TIMESTAMP)")
    con.execute("INSERT INTO t VALUES ('a', 'x', 1, now()), ('a', 'y', 2, now()), ('b', 'z', 3, now())")
    first = table_fingerprint(con, "t", "dataset = ?", ["a"])
    con.execute("DELETE FROM t")
    con.execute("INSERT INTO t VALUES ('b', 'z', 3, NULL), ('a', 'y', 2, NULL), ('a', 'x', 1, NULL)")
    assert table_fingerprint(con, "t", "dataset = ?", ["a"]) == first  # order and load time ignored
    con.execute("INSERT INTO t VALUES ('a', 'x', 1, NULL)")  # a duplicate row is a change
    assert table_fingerprint(con, "t", "dataset = ?", ["a"]) != first
    scoped = tables_fingerprint(con, ["t"], {"dataset": "b", "task": "ignored: no such column"})
    con.execute("UPDATE t SET n = 4 WHERE dataset = 'a'")
    assert tables_fingerprint(con, ["t"], {"dataset": "b"}) == scoped  # other datasets do not matter
    assert tables_fingerprint(con, ["t", "missing_table"], {}) != tables_fingerprint(con, ["t"], {})
    con.close()


def test_source_and_code_fingerprints(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "PATIENTS.csv").write_text("subject_id\n1\n")
    (folder / "ADMISSIONS.csv").write_text("hadm_id\n1\n")
    patients = source_fingerprint(folder, "patients.")
    (folder / "ADMISSIONS.csv").write_text("hadm_id\n2\n")
    assert source_fingerprint(folder, "patients.") == patients  # only the table's own file counts
    (folder / "PATIENTS.csv").write_text("subject_id\n2\n")
    assert source_fingerprint(folder, "patients.") != patients
    with pytest.raises(FileNotFoundError):
        source_fingerprint(tmp_path / "nope")
    assert code_version("ingest") != code_version("codes")
    assert code_version("ingest").startswith("0.")


# ---------------------------------------------------------------------------------------------- publish

_HOLD_WRITER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
con.execute("BEGIN TRANSACTION")  # a writer mid-transaction (killed later: never committed)
con.execute("INSERT INTO ml.pipeline_runs (pipeline_run_id, config, status, started_at, finished_at, error) VALUES ('held', NULL, 'running', now(), NULL, NULL)")
print("holding", flush=True)
time.sleep(60)
"""


def test_snapshot_is_atomic_and_readable_while_a_writer_holds_the_warehouse(tmp_db: Path) -> None:
    with open_warehouse(tmp_db) as con:
        con.execute("INSERT INTO ml.pipeline_runs (pipeline_run_id, config, status, started_at, finished_at, error) VALUES ('r1', NULL, 'completed', now(), now(), NULL)")
    snap = tmp_db.with_name("warehouse.snapshot.duckdb")
    published = publish_snapshot(tmp_db, snap)
    assert published.tables >= 10 and snap.exists() and not snap.with_name(snap.name + ".tmp").exists()

    writer = subprocess.Popen([sys.executable, "-c", _HOLD_WRITER, str(tmp_db)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "holding"
        with pytest.raises(duckdb.IOException):  # why the dashboard never opens the live file
            duckdb.connect(str(tmp_db), read_only=True)
        reader = open_snapshot(snap)
        assert reader.sql("SELECT pipeline_run_id FROM ml.pipeline_runs").fetchall() == [("r1",)]
        with pytest.raises(duckdb.Error):  # read-only: the dashboard cannot write by mistake
            reader.execute("DELETE FROM ml.pipeline_runs")
        reader.close()
    finally:
        writer.kill()
        writer.wait()

    with open_warehouse(tmp_db) as con:
        con.execute("INSERT INTO ml.pipeline_runs (pipeline_run_id, config, status, started_at, finished_at, error) VALUES ('r2', NULL, 'completed', now(), now(), NULL)")
    old_reader = open_snapshot(snap)  # a reader of the old snapshot keeps its view across a republish
    publish_snapshot(tmp_db, snap)
    assert old_reader.sql("SELECT count(*) FROM ml.pipeline_runs").fetchall() == [(1,)]
    old_reader.close()
    with open_snapshot(snap) as new_reader:
        assert new_reader.sql("SELECT count(*) FROM ml.pipeline_runs").fetchall() == [(2,)]


# ------------------------------------------------------------------------------------------ cache stamps


def test_cache_is_valid_only_while_the_output_rows_are_unchanged(tmp_path: Path, tmp_db: Path) -> None:
    cfg_path = _write(tmp_path / "c.yaml", f"datasets: [{{source: {DATA / 'mimic3_demo'}}}]\n"
                      "tasks: {drug_rec: {models: [{model: logreg}]}}\n")  # a config with no task is refused
    step = build_plan(load_config(cfg_path), tmp_path, DATA)["codes.mimic3_demo"]
    con = connect(tmp_db)
    con.execute("INSERT INTO core.mapping_coverage (dataset, kind, route, n_rows) VALUES ('mimic3_demo', 'route', 'ndc', 5)")
    con.close()
    start_pipeline_run(tmp_db, "p1", {})
    key = input_key(step, {"reads": "abc"})
    assert not cache_still_valid(tmp_db, step, key)  # never ran
    fp = output_fingerprint(tmp_db, step, step.scope)
    record_step(tmp_db, "p1", StepOutcome(step, "completed", key, step.scope, fp, seconds=1.0))
    assert cache_still_valid(tmp_db, step, key)
    assert not cache_still_valid(tmp_db, step, input_key(step, {"reads": "changed"}))
    with open_warehouse(tmp_db) as con:  # another dataset's rows do not matter ...
        con.execute("INSERT INTO core.mapping_coverage (dataset, kind, route, n_rows) VALUES ('other', 'route', 'ndc', 1)")
    assert cache_still_valid(tmp_db, step, key)
    with open_warehouse(tmp_db) as con:  # ... but losing this dataset's rows does
        con.execute("DELETE FROM core.mapping_coverage WHERE dataset = 'mimic3_demo'")
    assert not cache_still_valid(tmp_db, step, key)


# ---------------------------------------------------------------------------------------------- serving


def test_serve_builds_a_scheduled_and_an_on_demand_deployment(tmp_path: Path) -> None:
    from flows.pipeline import deployments

    cfg_path = _write(tmp_path / "c.yaml", """
        datasets: [{source: synth:10}]
        tasks: {drug_rec: {models: [{model: logreg}]}}
        schedule: {cron: "30 1 * * 1", timezone: Europe/Paris}
        runner: {kind: dask, address: "tcp://127.0.0.1:8786"}
        """)
    scheduled, on_demand = deployments(cfg_path, tmp_path / "w.duckdb")
    assert (scheduled.name, on_demand.name) == ("scheduled", "on-demand")
    assert [(s.schedule.cron, s.schedule.timezone) for s in scheduled.schedules] == [("30 1 * * 1", "Europe/Paris")]
    assert not on_demand.schedules
    assert scheduled.parameters == {"config": str(cfg_path.resolve()), "db": str(tmp_path / "w.duckdb")}


def test_readmission_notes_shares_the_readmission_samples(tmp_path: Path) -> None:
    cfg_path = _write(tmp_path / "c.yaml", f"""
        datasets: [{{source: {DATA / 'mimic3_demo'}}}, {{source: synth:10}}]
        tasks:
          readmission: {{datasets: [mimic3_demo], models: [{{model: logreg}}]}}
          readmission_notes: {{models: [{{model: majority}}]}}
        """)
    plan = build_plan(load_config(cfg_path), tmp_path, DATA)
    samples = [s for s in plan.names if s.startswith("samples.")]
    assert samples == ["samples.readmission.mimic3_demo", "samples.readmission.synth_10"]
    assert plan["train.readmission_notes.synth_10.majority.s42"].needs == ("samples.readmission.synth_10",)
