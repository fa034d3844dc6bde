"""The task registry (medtx/tasks/) and its worked example, the `mortality` task.

Real parts only: a real DuckDB warehouse with the bundled reference data, the real samples builder and the
real logreg experiment writing ml.* rows.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from medtx.store.db import connect, open_warehouse
from medtx.tasks.build import EmptyCohortError, build_samples
from medtx.tasks import all_tasks, get_task, task_names, tasks_of_family, tasks_of_kind
from tests.conftest import DATA, REPO_ROOT
from tests.fixtures_samples import demo_db, insert_rows  # noqa: F401

FUROSEMIDE = "00517570425"


# ------------------------------------------------------------------------------------------ registry


def test_registry_discovers_one_module_per_task():
    from medtx.tasks import _NOT_TASKS  # the package's library modules (outcome.py: admission-level declarations)

    modules = sorted(p.stem for p in (REPO_ROOT / "medtx" / "tasks").glob("*.py")
                     if p.stem != "__init__" and p.stem not in _NOT_TASKS)
    assert sorted(task_names()) == modules
    expected = {"drug_rec", "next_visit", "readmission", "readmission_notes", "mortality", "specialty", "faq"}
    assert expected <= set(modules)
    assert get_task("mortality").kind == "binary" and get_task("mortality").samples.split_unit == "patient"
    assert {t.name for t in tasks_of_kind("binary")} >= {"readmission", "readmission_notes", "mortality"}
    assert all(t.family == "ehr" for t in tasks_of_family("ehr"))
    for task in all_tasks():  # every builder declares what it reads and writes; trained-on tables exist in writes
        if task.lineage.build is not None:
            assert task.samples.table in task.lineage.writes, task.name
        else:
            assert task.lineage.builds is not None and get_task(task.lineage.builds).samples.table == task.samples.table


def test_every_task_is_configured_and_documented():
    """docs/EXTENDING.md's check for a new task, over the registry: its file is alone in medtx/tasks/ (no builder
    elsewhere), config/default.yaml trains it, and docs/TASKS.md gives it a row (clock, window, label, cohort)."""
    import yaml

    configured = yaml.safe_load((REPO_ROOT / "config" / "default.yaml").read_text())["tasks"]
    documented = (REPO_ROOT / "docs" / "TASKS.md").read_text()
    for task in all_tasks():
        assert task.name in configured, f"config/default.yaml has no tasks.{task.name}"
        assert f"| `{task.name}` |" in documented, f"docs/TASKS.md's task table has no row for {task.name}"
        assert not (REPO_ROOT / "medtx" / "samples" / f"{task.name}.py").exists(), task.name
        # the builder is the task's own, or the admission-outcome declaration's (medtx/tasks/outcome.py)
        builder = getattr(task.lineage.build, "func", task.lineage.build)
        assert builder is None or builder.__module__ in (f"medtx.tasks.{task.name}", "medtx.tasks.outcome"), task.name


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown task 'mortalty'; expected one of drug_rec, .*mortality"):
        get_task("mortalty")


def test_config_refuses_a_model_the_task_does_not_take(tmp_path):
    from medtx.pipeline.config import load_config

    path = tmp_path / "bad.yaml"
    path.write_text("datasets: [{source: synth:10}]\ntasks:\n  mortality:\n    models: [{model: behrt}]\n")
    with pytest.raises(ValueError, match=r"tasks.mortality.models\[0\].model = 'behrt': unknown for task mortality; allowed: (?!.*behrt)"):
        load_config(path)


def test_task_names_live_only_in_their_own_module():
    """The issue's check: `git grep -il mortality -- medtx flows dashboard warehouse` lists only the task's
    module (the generic sample table's migration names no task), and the synthetic generator's ground truth of
    it (issue 33: the ORACLE_MORTALITY file, its loader and its raw table, as every synthetic task's oracle)."""
    out = subprocess.run(["git", "grep", "-il", "mortality", "--", "medtx", "flows", "dashboard", "warehouse"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=False).stdout.split()
    ground_truth = {"medtx/synth/death.py", "medtx/synth/files.py", "medtx/synth/generate.py", "medtx/synth/oracle.py",
                    "warehouse/migrations/0015_task_clock.sql"}
    meds_vocabulary = {"medtx/meds/events.py", "medtx/meds/labels.py"}  # docstrings: the MEDS tools' own task names
    assert "medtx/tasks/mortality.py" in out and set(out) <= {"medtx/tasks/mortality.py", *ground_truth, *meds_vocabulary}


def test_model_names_live_only_in_their_own_file():
    """The issue's check for the worked model: `git grep -il retain -- medtx flows dashboard warehouse` lists only
    medtx/models/retain.py: no task lists it, it applies to every task of the kinds it serves."""
    out = subprocess.run(["git", "grep", "-il", "retain", "--", "medtx", "flows", "dashboard", "warehouse"],
                         cwd=REPO_ROOT, capture_output=True, text=True, check=False).stdout.split()
    assert out == ["medtx/models/retain.py"]


def test_models_apply_by_kind_and_features_unless_the_task_keeps_them_out():
    """The rules, not a list of today's models: a new model file passes this test untouched (docs/EXTENDING.md)."""
    from medtx.models.registry import model_families, model_tasks, models_for, specs

    for task in all_tasks():
        applies = set(models_for(task))
        for spec in (s for f in model_families(task) for s in specs(f)):
            rule = (task.kind in spec.kinds and set(spec.source_features or ()) <= set(task.samples.features)
                    and task.applies_to(spec.name))
            assert (spec.name in applies) == rule, (task.name, spec.name)
    # the exclusions the tasks declare, and what each kind rules out
    assert "behrt" in models_for(get_task("readmission")) and "behrt" not in models_for(get_task("mortality"))
    for binary in tasks_of_kind("binary"):
        assert "copy_last" not in models_for(binary) and "seq2seq" not in models_for(binary)
    assert "lightgbm" not in models_for(get_task("drug_rec")) and "lightgbm" in models_for(get_task("readmission"))
    assert set(models_for(get_task("faq"))) == {s.name for s in specs("faq")}
    assert "bert" in models_for(get_task("specialty")) and "bert" not in models_for(get_task("drug_rec"))
    assert model_tasks()["retain"] == tuple(t.name for t in tasks_of_family("ehr"))
    assert "mortality" not in model_tasks()["behrt"] and model_tasks()["seq2seq"] == ("drug_rec",)


def test_config_refuses_a_model_of_another_kind(tmp_path):
    from medtx.pipeline.config import load_config

    path = tmp_path / "bad.yaml"
    path.write_text("datasets: [{source: synth:10}]\ntasks:\n  readmission:\n    models: [{model: copy_last}]\n")
    with pytest.raises(ValueError, match=r"tasks.readmission.models\[0\].model = 'copy_last': unknown for task readmission; allowed: (?!.*copy_last)"):
        load_config(path)


def test_per_task_model_defaults_come_from_the_task():
    from medtx.models.registry import model_defaults

    fast = {"copy_feature": "drugs_hist", "max_visits": 2, "max_codes": 64, "attention_dropout": 0.0,
            "n_heads": 1, "joint_sequence": True}
    assert model_defaults("transformer", get_task("drug_rec")) == fast
    # transformer_rope takes the transformer's per-task defaults (the task lists only "transformer")
    assert model_defaults("transformer_rope", get_task("drug_rec")) == fast
    assert model_defaults("behrt", get_task("next_visit")) == {"copy_recencies": (0,), "visit_ages": "ages"}
    assert model_defaults("behrt", get_task("drug_rec")) == {"copy_feature": "drugs_hist", "copy_recencies": (1,)}
    assert model_defaults("transformer", get_task("readmission")) == {}
    assert model_defaults("retain", get_task("drug_rec")) == {}


def test_per_task_trainer_defaults_come_from_the_task():
    from medtx.tasks import get_task

    drug_rec = get_task("drug_rec")
    assert drug_rec.train_defaults_for("transformer") == {"length_buckets": 16}
    assert drug_rec.train_defaults_for("transformer_rope") == {}  # measured, left alone (benchmarks/README.md)
    assert drug_rec.train_defaults_for("retain") == {}
    assert get_task("mortality").train_defaults_for("transformer") == {}


# ------------------------------------------------------------------------------------------ mortality samples
# Patient 1: admission 10 survived (5 days), admission 11 died on day 4 (flag 1) with furosemide started on its
# first day and omeprazole on its fourth. Patient 2: admission 20 survived, no codes. Patient 3: admission 30 has
# no flag (left out, counted, never guessed as a survivor). Patient 4: admission 40 lasted 1 day (under 48 h),
# admission 41 lasted 3 days but the patient died 20 hours in (not alive at 48 h).


@pytest.fixture
def cohort(tmp_path):
    con = connect(tmp_path / "warehouse.duckdb")
    insert_rows(con, "patients", [{"dataset": "c", "subject_id": s, "dob": "2050-01-01",
                                   "gender": "F" if s == 1 else None} for s in (1, 2, 3, 4)])
    insert_rows(con, "admissions", [
        {"dataset": "c", "subject_id": s, "hadm_id": h, "admittime": a, "dischtime": d, "deathtime": death,
         "admission_type": "EMERGENCY", "hospital_expire_flag": f}
        for s, h, a, d, death, f in (
            (1, 10, "2100-01-01 10:00", "2100-01-06 10:00", None, 0),
            (1, 11, "2100-05-01 10:00", "2100-05-05 10:00", "2100-05-05 10:00", 1),
            (2, 20, "2101-01-01 10:00", "2101-01-06 10:00", None, 0),
            (3, 30, "2102-01-01 10:00", "2102-01-06 10:00", None, None),
            (4, 40, "2103-01-01 10:00", "2103-01-02 10:00", None, 0),
            (4, 41, "2103-06-01 10:00", "2103-06-04 10:00", "2103-06-02 06:00", 1))])
    insert_rows(con, "diagnoses_icd", [{"dataset": "c", "hadm_id": h, "seq_num": i + 1, "icd9_code": c}
                                       for h, codes in {10: ["4019"], 11: ["4280", "486"], 30: ["486"]}.items()
                                       for i, c in enumerate(codes)])
    insert_rows(con, "procedures_icd", [{"dataset": "c", "hadm_id": 11, "seq_num": 1, "icd9_code": "9904"}])
    insert_rows(con, "prescriptions", [
        {"dataset": "c", "subject_id": 1, "hadm_id": 11, "ndc": FUROSEMIDE, "drug": "x", "startdate": "2100-05-01"},
        {"dataset": "c", "subject_id": 1, "hadm_id": 11, "ndc": "99999999999", "drug": "Omeprazole",
         "startdate": "2100-05-04"}])
    from medtx.codes import map_codes

    map_codes(con, DATA, ["c"])
    yield con
    con.close()


def test_mortality_at_48_hours_sees_only_what_is_known_then(cohort):
    # another admission-level task's rows in the shared table must survive a rebuild of this one
    cohort.execute("INSERT INTO samples.admission_outcome (dataset, task, subject_id, hadm_id, conditions, procedures, "
                   "drugs, label) VALUES ('c', 'other', 9, 99, [], [], [], true)")
    counts = build_samples(cohort, DATA, ["mortality"], ["c"], seed=1, fractions=(0.34, 0.33, 0.33))
    assert counts == {("mortality", "c"): 3}
    rows = cohort.sql("SELECT hadm_id, prediction_time::VARCHAR, conditions, procedures, drugs, static, label "
                      "FROM samples.admission_outcome WHERE task = 'mortality' ORDER BY hadm_id").fetchall()
    drugs = dict(cohort.sql("SELECT drug, atc3 FROM core.prescriptions_atc3 WHERE hadm_id = 11").fetchall())
    early, late = drugs["x"], drugs["Omeprazole"]
    assert early != late
    static = ["AGE//50-59", "SEX//UNKNOWN", "ADMISSION_TYPE//EMERGENCY"]
    assert rows == [
        # its own diagnoses are coded at its discharge, after the prediction time: none visible
        (10, "2100-01-03 10:00:00", [[]], [[]], [[]], [["AGE//50-59", "SEX//F", "ADMISSION_TYPE//EMERGENCY"]], False),
        # admission 10's codes (known at its discharge) are history; of its own stay only the drug started on
        # day 1 (known at the end of that day, within 48 h); omeprazole (day 4), 4280/486 and 9904 are not
        (11, "2100-05-03 10:00:00", [["4019"], []], [[], []], [[], [early]],
         [["AGE//50-59", "SEX//F", "ADMISSION_TYPE//EMERGENCY"]], True),
        (20, "2101-01-03 10:00:00", [[]], [[]], [[]], [static], False),
    ]
    assert cohort.sql("SELECT count(*) FROM samples.admission_outcome WHERE task = 'other'").fetchall()[0][0] == 1
    summary = dict(cohort.sql("SELECT metric, value FROM samples.task_summary WHERE task = 'mortality'").fetchall())
    assert summary["excluded_without_flag"] == 1 and summary["positives"] == 1
    assert (summary["excluded_under_48h"], summary["excluded_died_by_48h"]) == (1, 1)  # admissions 40 and 41
    splits = cohort.sql("SELECT subject_id, split FROM samples.splits WHERE task = 'mortality'").fetchall()
    assert sorted(s for s, _ in splits) == [1, 2]  # patient-level: one split row per patient
    # a rebuild replaces, never duplicates
    build_samples(cohort, DATA, ["mortality"], ["c"], seed=1, fractions=(0.34, 0.33, 0.33))
    assert cohort.sql("SELECT count(*) FROM samples.admission_outcome").fetchall()[0][0] == 4
    gate = cohort.sql("SELECT status, split_overlap, late_codes FROM samples.leakage_gate "
                      "WHERE dataset = 'c' AND task = 'mortality'").fetchall()
    assert gate == [("pass", 0, 0)]


def test_mortality_without_any_flag_fails_naming_the_dataset(cohort):
    cohort.execute("UPDATE raw.admissions SET hospital_expire_flag = NULL")
    with pytest.raises(EmptyCohortError, match="mortality: dataset 'c' has no admission of at least 48 hours"):
        build_samples(cohort, DATA, ["mortality"], ["c"])


# ------------------------------------------------------------------------------------------ mortality training


def test_logreg_trains_on_mortality_end_to_end_and_the_dashboard_shows_it(demo_db, tmp_path):  # noqa: F811
    from medtx.pipeline.steps import train_in_process

    db = tmp_path / "demo.duckdb"
    shutil.copy(demo_db, db)
    models = tmp_path / "models"
    run_id = train_in_process(db, get_task("mortality"), "logreg", 42, {"n_boot": 3}, dataset="mimic3_demo",
                              models_dir=models)
    gru = train_in_process(db, get_task("mortality"), "gru", 42, {"epochs": 1, "n_boot": 3}, dataset="mimic3_demo",
                           models_dir=models)
    with open_warehouse(db, read_only=True) as con:
        status, task = con.execute("SELECT status, task FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()[0]
        metrics = dict(con.execute("SELECT metric, value FROM ml.metrics WHERE run_id = ? AND split = 'test'",
                                   [run_id]).fetchall())
        n_test = con.sql("""SELECT count(*) FROM samples.admission_outcome s JOIN samples.splits p
                            ON p.dataset = s.dataset AND p.task = s.task AND p.subject_id = s.subject_id
                            WHERE s.task = 'mortality' AND s.dataset = 'mimic3_demo' AND p.split = 'test'""").fetchall()
        labels = con.execute("SELECT DISTINCT label FROM ml.predictions WHERE run_id = ?", [run_id]).fetchall()
    assert (status, task) == ("completed", "mortality")
    assert {"auroc", "auprc", "rp80", "positive_rate"} <= set(metrics)
    assert metrics["n_samples"] == n_test[0][0] > 0
    assert labels == [("in_hospital_death",)]

    _dashboard_shows(db, tmp_path / "snapshot.duckdb", run_id, gru)


def _dashboard_shows(db: Path, snap: Path, run_id: str, other: str) -> None:
    """Leaderboard and run detail of the published snapshot list the mortality runs (no hard-coded task list)."""
    import json

    from dashboard import queries, validate
    from dashboard.pages import leaderboard, run_detail
    from medtx.publish.snapshot import publish_snapshot

    publish_snapshot(db, snap)
    assert validate.task("mortality") == "mortality"
    assert ("mortality", "mimic3_demo") in queries.task_datasets(snap).select("task", "dataset").rows()
    rows, metric_names = leaderboard.leaderboard_rows(
        queries.leaderboard_runs(snap, "mortality", "mimic3_demo"),
        queries.leaderboard_metrics(snap, "mortality", "mimic3_demo", None))
    assert {r["run_id"] for r in rows} == {run_id, other} and "auroc" in metric_names
    detail = json.dumps(run_detail.run_body(snap, run_id).to_plotly_json(), default=str)
    # the note explorer finds an admission note task's text through the registry's sample table
    with open_warehouse(db, read_only=True) as con:
        hadm = con.sql("SELECT hadm_id FROM samples.readmission WHERE dataset = 'mimic3_demo' LIMIT 1").fetchall()[0][0]
    assert queries.discharge_note_text(snap, get_task("readmission_notes"), "mimic3_demo", hadm)["note_id"] == str(hadm)
    assert "mortality \\u00b7 logreg \\u00b7 dataset mimic3_demo" in detail and "auroc" in detail


def test_text_task_defaults_come_from_the_task():
    from medtx.training.text_config import TextConfig
    from medtx.training.runners.text import text_config, text_run

    # the text runner's classification tasks are read off each Task (`classifies_text`; the FAQ has its own runner)
    text_tasks = {t.name for t in all_tasks() if t.classifies_text}
    assert text_tasks == {t.name for t in tasks_of_family("text") if t.kind != "generation"}
    with pytest.raises(ValueError, match="unknown text task 'drug_rec'; choose one of .*specialty"):
        # refused before any warehouse is read
        text_run(get_task("drug_rec"), "majority")
    assert text_config("bilstm", task=get_task("readmission_notes")).pooling == "clinicalbert"
    assert text_config("bilstm", {"pooling": "max"}, task=get_task("readmission_notes")).pooling == "max"  # overrides win
    assert text_config("bilstm", task=get_task("specialty")).pooling == TextConfig.pooling
