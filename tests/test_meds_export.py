"""The MEDS export other tools read as written (issue 33): layout by split and by task, the task clock in the
event times and label prediction times, the MIMIC-IV vocabulary, over-89 birth dates, a deterministic
codes.parquet, an --out that can never delete the warehouse or models (issue 34 item 5), and a run's test
predictions in the meds-evaluation schema. The real tools themselves run in tests/test_meds_tools.py."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import duckdb
import meds
import polars as pl
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.meds import ExportError, export_meds
from medtx.meds.events import AGE, CAPPED_AGE_YEARS
from medtx.tasks.build import build_samples
from medtx.store.db import connect
from medtx.tasks import get_task
from tests.conftest import DATA
from tests.fixtures_samples import DEMO, demo_db, insert_rows  # noqa: F401  (session fixture)

TASKS = ["readmission", "mortality"]


@pytest.fixture(scope="module")
def exported(demo_db, tmp_path_factory):  # noqa: F811
    """The demo warehouse copied into its own folder (with a models folder beside it) and exported next to it."""
    root = tmp_path_factory.mktemp("meds-export")
    db = root / "var" / "warehouse.duckdb"
    db.parent.mkdir()
    shutil.copy(demo_db, db)
    (root / "var" / "models" / "run1").mkdir(parents=True)
    (root / "var" / "models" / "run1" / "model.safetensors").write_bytes(b"weights")
    con = connect(db)
    try:
        result = export_meds(con, DEMO, root / "var" / "meds" / DEMO, labels=TASKS)
    finally:
        con.close()
    return db, result


def _events(result) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(result.out / s) for s in result.shards])


def _labels(out: Path, task: str) -> pl.DataFrame:
    return pl.read_parquet(out / "labels" / task / "**" / "*.parquet")


# ---- the clock ------------------------------------------------------------------------------------------------

def test_events_follow_the_task_clock(exported):
    """No prescription before its stay's admission or after its discharge; diagnoses and procedures at the
    discharge (MIMIC-III codes them after the stay)."""
    _, result = exported
    events = _events(result)
    stays = events.filter(pl.col("code").str.starts_with("HOSPITAL_ADMISSION//")).select(
        "hadm_id", pl.col("time").alias("admit")).join(
        events.filter(pl.col("code").str.starts_with("HOSPITAL_DISCHARGE//")).select(
            "hadm_id", pl.col("time").alias("disch")), on="hadm_id")
    rx = events.filter(pl.col("code").str.starts_with("MEDICATION//")).join(stays, on="hadm_id")
    assert rx.height == events.filter(pl.col("code").str.starts_with("MEDICATION//")).height > 10_000
    assert rx.filter((pl.col("time") < pl.col("admit")) | (pl.col("time") > pl.col("disch"))).height == 0
    coded = events.filter(pl.col("code").str.contains("^(DIAGNOSIS|PROCEDURE)//")).join(stays, on="hadm_id")
    assert coded.height > 2000 and (coded["time"] == coded["disch"]).all()


def test_label_prediction_times_are_the_tasks_and_see_no_outcome(exported):
    """readmission at the discharge, mortality 48 hours after admission; at or before a label's prediction
    time no death, no event of a later stay and (mortality) not its own stay's discharge is visible."""
    db, result = exported
    events = _events(result)
    with duckdb.connect(str(db), read_only=True) as con:
        for task, table, expr in (("readmission", "samples.readmission", "a.dischtime"),
                                  ("mortality", "samples.admission_outcome", "a.admittime + INTERVAL 48 HOUR")):
            want = con.sql(f"""SELECT s.subject_id, CAST({expr} AS TIMESTAMP) AS prediction_time, s.label AS boolean_value
                               FROM {table} s JOIN raw.admissions a USING (dataset, hadm_id)
                               WHERE s.dataset = '{DEMO}' {"AND s.task = 'mortality'" if table.endswith("outcome") else ""}
                               ORDER BY ALL""").pl()
            got = _labels(result.out, task).sort(pl.all())
            assert got.height == want.height > 50 and got.equals(want.cast(got.schema)), task
    deaths = events.filter(pl.col("code") == "MEDS_DEATH").group_by("subject_id").agg(pl.col("time").min().alias("death"))
    for task in TASKS:
        seen = _labels(result.out, task).join(deaths, on="subject_id", how="left")
        assert seen.filter(pl.col("death") <= pl.col("prediction_time")).height == 0, task
    mortality = _labels(result.out, "mortality").join(
        events.filter(pl.col("code").str.starts_with("HOSPITAL_ADMISSION//")).select(
            "subject_id", pl.col("time").alias("admit"), "hadm_id"), on="subject_id")
    index = mortality.filter(pl.col("admit") == pl.col("prediction_time") - pl.duration(hours=48))
    assert index.height == _labels(result.out, "mortality").height
    own_discharge = index.join(events.filter(pl.col("code").str.starts_with("HOSPITAL_DISCHARGE//")).select(
        "hadm_id", pl.col("time").alias("disch")), on="hadm_id")
    assert (own_discharge["disch"] > own_discharge["prediction_time"]).all()


def test_a_later_stay_seen_at_prediction_time_refuses_the_labels(demo_db, tmp_path):  # noqa: F811
    """A next admission that starts before the discharge (an overlapping stay: a readmission by medtx's rule)
    is the label's outcome visible at its prediction time: the export names it and writes nothing."""
    db = tmp_path / "warehouse.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        subject, hadm, admit, disch = con.sql(f"""SELECT subject_id, hadm_id, admittime, dischtime FROM raw.admissions
            WHERE dataset = '{DEMO}' AND hospital_expire_flag = 0 ORDER BY dischtime - admittime DESC LIMIT 1""").fetchall()[0]
        insert_rows(con, "admissions", [{
            "dataset": DEMO, "row_id": 999_999, "subject_id": subject, "hadm_id": 999_999,
            "admittime": disch - (disch - admit) / 2, "dischtime": disch + timedelta(hours=1), "admission_type": "EMERGENCY",
            "discharge_location": "HOME", "hospital_expire_flag": 0}])
        build_samples(con, DATA, ["readmission", "mortality"], [DEMO])
        assert con.sql(f"SELECT label FROM samples.readmission WHERE hadm_id = {hadm}").fetchall() == [(True,)]
        with pytest.raises(ExportError, match=rf"--labels readmission: 1 label\(s\) could see their own outcome .*"
                                              rf"subject {subject}, .* sees events of later stay 999999 at "):
            export_meds(con, DEMO, tmp_path / "meds", labels=["readmission"])
        assert not (tmp_path / "meds").exists()
        export_meds(con, DEMO, tmp_path / "meds", labels=["mortality"])  # the other task is unaffected
    finally:
        con.close()


# ---- vocabulary, values, birth dates, determinism -------------------------------------------------------------

def test_mimic4_vocabulary_ages_and_over_89_births(exported):
    db, result = exported
    events = _events(result)
    discharges = events.filter(pl.col("code").str.starts_with("HOSPITAL_DISCHARGE//"))["code"]
    with duckdb.connect(str(db), read_only=True) as con:
        deaths = con.sql(f"SELECT count(*) FROM raw.admissions WHERE dataset = '{DEMO}' "
                         "AND (hospital_expire_flag = 1 OR deathtime IS NOT NULL)").fetchall()[0][0]
        shifted = con.sql(f"""SELECT p.subject_id, min(a.admittime) - INTERVAL {CAPPED_AGE_YEARS} YEAR
                              FROM raw.patients p JOIN raw.admissions a USING
                              (dataset, subject_id) WHERE p.dataset = '{DEMO}' GROUP BY p.subject_id, p.dob
                              HAVING date_diff('year', p.dob, min(a.admittime)) >= 200""").fetchall()
    # PyHealth's InHospitalMortalityMEDS and ACES configs look for HOSPITAL_DISCHARGE//DIED
    assert (discharges == "HOSPITAL_DISCHARGE//DIED").sum() == deaths == 40
    assert not discharges.str.contains("DEAD/EXPIRED").any()
    assert "HOSPITAL_DISCHARGE//SKILLED NURSING FACILITY" in set(discharges)
    ages = events.filter(pl.col("code") == AGE)
    assert ages.height == 129 and ages["numeric_value"].null_count() == 0
    assert 15 < ages["numeric_value"].min() and ages["numeric_value"].max() < CAPPED_AGE_YEARS + 2
    births = dict(events.filter(pl.col("code") == "MEDS_BIRTH").select("subject_id", "time").iter_rows())
    assert len(shifted) == 8  # the demo's over-89s: born about 300 years before their first admission
    for subject, birth in shifted:
        assert births[subject] == birth
    assert events["numeric_value"].is_not_null().sum() == ages.height  # AGE is the only measured value


def test_codes_parquet_is_byte_identical_on_re_export(exported, tmp_path):
    db, result = exported
    con = connect(db)
    try:
        again = export_meds(con, DEMO, tmp_path / "again")
        export_meds(con, DEMO, result.out, labels=TASKS, overwrite=True)
    finally:
        con.close()
    first = (tmp_path / "again" / "metadata" / "codes.parquet").read_bytes()
    assert first == (result.out / "metadata" / "codes.parquet").read_bytes()
    assert again.codes > 1900
    for name in ("subject_splits.parquet", "medtx_task_splits.parquet"):
        assert (tmp_path / "again" / "metadata" / name).read_bytes() == (result.out / "metadata" / name).read_bytes()
    codes = pl.read_parquet(tmp_path / "again" / "metadata" / "codes.parquet")
    assert codes["code"].is_unique().all()
    assert AGE != "AGE" and codes.filter(pl.col("code") == AGE)["description"].item().startswith("age in years")
    # dataset_version is the data's fingerprint (labels left out), not the day of the export
    version = json.loads((tmp_path / "again" / "metadata" / "dataset.json").read_text())["dataset_version"]
    assert version.startswith("sha256:") and version == json.loads(
        (result.out / "metadata" / "dataset.json").read_text())["dataset_version"]
    copy = tmp_path / "copy.duckdb"  # other data: one admission's location changed, in a copy
    shutil.copy(db, copy)
    con = connect(copy)
    try:
        con.execute("UPDATE raw.admissions SET admission_location = 'ELSEWHERE' WHERE hadm_id = "
                    "(SELECT min(hadm_id) FROM raw.admissions WHERE dataset = ?)", [DEMO])
        changed = export_meds(con, DEMO, tmp_path / "changed")
    finally:
        con.close()
    assert json.loads((changed.out / "metadata" / "dataset.json").read_text())["dataset_version"] != version


def test_labels_of_a_task_without_samples_are_refused(demo_db, tmp_path):  # noqa: F811
    db = tmp_path / "w.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        con.execute("DELETE FROM samples.admission_outcome WHERE task = 'mortality'")
        with pytest.raises(ExportError, match=r"--labels mortality: dataset 'mimic3_demo' has no mortality samples; "
                                              r"run `medtx build-samples --task mortality"):
            export_meds(con, DEMO, tmp_path / "out", labels=["readmission", "mortality"])
    finally:
        con.close()
    assert not (tmp_path / "out").exists()
    r = CliRunner().invoke(app, ["export", "meds", "--dataset", DEMO, "--out", str(tmp_path / "out"), "--labels",
                                 "mortality", "--db", str(db)])
    assert r.exit_code == 2 and "no mortality samples" in r.output and not (tmp_path / "out").exists()


# ---- --out: never the warehouse, its folder, the models, or a foreign folder (issue 34 item 5) ----------------

def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_overwrite_replaces_only_a_previous_medtx_export(exported, tmp_path):
    db, result = exported
    var = db.parent
    before = _tree(var / "models")
    size = db.stat().st_size
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    planted = tmp_path / "planted"
    shutil.copytree(result.out, planted)
    (planted / "data" / "warehouse.duckdb").write_bytes(b"not a shard")
    cases = {
        var: "is or contains",                         # the warehouse's folder
        db: "is or contains",                          # the warehouse file itself
        var.parent: "is or contains",                  # a folder holding the warehouse
        foreign: "not a previous medtx MEDS export",   # anything else with content
        planted: "not a previous medtx MEDS export",   # an export with something else put inside
    }
    cli = CliRunner()
    for out, message in cases.items():
        r = cli.invoke(app, ["export", "meds", "--dataset", DEMO, "--out", str(out), "--overwrite", "--db", str(db)])
        assert r.exit_code == 2, (out, r.output)
        assert message in r.output and len(r.output.strip().splitlines()) <= 3, r.output  # one (wrapped) line
    r = cli.invoke(app, ["export", "meds", "--dataset", DEMO, "--out", str(var / "models"), "--overwrite",
                         "--db", str(db)])
    assert r.exit_code == 2 and "is or contains" in r.output
    assert db.stat().st_size == size and _tree(var / "models") == before
    assert (foreign / "notes.txt").read_text() == "keep me" and (planted / "data" / "warehouse.duckdb").is_file()
    # a previous export is replaced, in place
    r = cli.invoke(app, ["export", "meds", "--dataset", DEMO, "--out", str(result.out), "--overwrite", "--db", str(db),
                         "--labels", "readmission"])
    assert r.exit_code == 0, r.output
    assert (result.out / "labels" / "readmission").is_dir() and not (result.out / "labels" / "mortality").exists()
    assert not [p for p in result.out.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left
    r = cli.invoke(app, ["export", "meds", "--dataset", DEMO, "--out", str(result.out), "--db", str(db)])
    assert r.exit_code == 2 and "not empty" in r.output


# ---- predictions in the meds-evaluation schema ----------------------------------------------------------------

def test_export_predictions_writes_the_meds_evaluation_schema_and_refuses_bad_input(exported, tmp_path):
    from medtx.pipeline.steps import train_in_process

    db, result = exported
    run_id = train_in_process(db, get_task("mortality"), "logreg", 0, dataset=DEMO)
    out = tmp_path / "preds" / "mortality.parquet"
    cli = CliRunner()
    r = cli.invoke(app, ["export", "predictions", "--run", run_id, "--out", str(out), "--db", str(db)])
    assert r.exit_code == 0, r.output
    preds = pq.read_table(out)
    meds.LabelSchema.validate(preds.select(["subject_id", "prediction_time", "boolean_value"]))
    assert [(f.name, str(f.type)) for f in preds.schema] == [
        ("subject_id", "int64"), ("prediction_time", "timestamp[us]"), ("boolean_value", "bool"),
        ("predicted_boolean_value", "bool"), ("predicted_boolean_probability", "float")]
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT p.subject_id, s.prediction_time, p.y_true, p.predicted, CAST(p.prob AS FLOAT) "
                             "FROM ml.predictions p JOIN samples.admission_outcome s USING (hadm_id) "
                             "WHERE p.run_id = ? AND s.task = 'mortality' AND s.dataset = ? ORDER BY ALL",
                             [run_id, DEMO]).fetchall()
    assert sorted(pl.from_arrow(preds).rows()) == stored and len(stored) > 5
    # the prediction times are the labels' own: every prediction meets its label
    con = connect(db)
    try:
        fresh = export_meds(con, DEMO, tmp_path / "fresh", labels=["mortality"])
    finally:
        con.close()
    labels = _labels(fresh.out, "mortality")
    assert pl.from_arrow(preds).join(labels, on=["subject_id", "prediction_time", "boolean_value"]).height == len(stored)
    for args, message in (
        (["--run", run_id, "--out", str(out)], "file exists"),
        (["--run", run_id, "--out", str(tmp_path / "preds")], "must be named"),
        (["--run", run_id, "--out", str(db)], "must be named"),
        (["--run", "nope", "--out", str(tmp_path / "x.parquet")], "no such run"),
    ):
        r = cli.invoke(app, ["export", "predictions", *args, "--db", str(db)])
        assert r.exit_code == 2 and message in r.output, (args, r.output)
    assert not (tmp_path / "x.parquet").exists() and db.is_file()
    r = cli.invoke(app, ["export", "predictions", "--run", run_id, "--out", str(out), "--overwrite", "--db", str(db)])
    assert r.exit_code == 0 and not [p for p in out.parent.iterdir() if p.name.startswith(".")]
