"""Issue 42: readmission from discharge notes (`readmission_notes`) gets the binary-task sections of the model card
(subgroups, recalibration, operating points, the summary's calibration and net-benefit conclusions) as readmission
does: its text runs store their validation predictions as an EHR run does, and `medtx.evaluation.trust` applies to
every binary/multi-label task whose samples are patients' admissions. Text runs name their bootstrap unit (patients
for readmission_notes, text groups for MTSamples) on the card.

The end-to-end run is real: a synthetic cohort with discharge summaries, ingested, its readmission samples built
(with the leakage gate), a TF-IDF run trained on the pipeline's path (training package, worker, result package)
and recorded; every count the card shows is checked against an independent query of the warehouse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from medtx.evaluation import operating as op
from medtx.evaluation.floors import MIN_GROUP_EVENTS, MIN_GROUP_NON_EVENTS, MIN_RECAL_EVENTS, MIN_UNITS, MIN_VAL_ALERTS
from medtx.evaluation.trust import applies
from medtx.store.db import connect
from medtx.tasks import all_tasks, get_task
from medtx.training.results import VAL_PREDICTION_COLUMNS
from medtx.training.runners.text import fit_and_evaluate, group_split_data, patient_split_data, text_config

N_PATIENTS = 1000  # test: ~180 patients, ~20 events; validation: ~90 patients, ~15 events (under the map floor)
DATASET = f"synth_{N_PATIENTS}"


def test_the_sections_apply_to_tasks_whose_samples_are_admissions_not_to_a_family():
    """No branching on a task's name or family: binary/multi-label tasks on admissions get them (readmission from
    notes among them), MTSamples (multi-class, text groups) and the FAQ (pairs) do not."""
    got = {t.name: applies(t) for t in all_tasks()}
    assert got["readmission_notes"] and got["readmission"] and got["mortality"] and got["drug_rec"]
    assert not got["specialty"] and not got["faq"]
    for t in all_tasks():
        assert got[t.name] == (t.kind in ("binary", "multilabel") and t.samples.split_unit == "patient"), t.name
    assert not applies(None)


def _patient_notes(n_patients: int = 40) -> pa.Table:
    """Admissions with discharge text split by patient, as note_rows_from_tables returns them."""
    rng = np.random.default_rng(4)
    subj = np.repeat(np.arange(n_patients) + 100, 2)
    split = np.array(["train"] * 24 + ["val"] * 8 + ["test"] * 8)[subj - 100]
    label = rng.random(len(subj)) < 0.4
    words = np.where(label, "chf copd readmit", "stable home")
    return pa.table({"subject_id": subj, "hadm_id": np.arange(len(subj)) + 5000,
                     "text": [f"summary {w} {rng.choice(['fever', 'cough', 'pain'])}" for w in words],
                     "label": label.astype(np.int64), "split": split})


@pytest.mark.parametrize("model,overrides", [
    ("tfidf_logreg", {}),
    ("bilstm", {"epochs": 1, "embed_dim": 8, "hidden_dim": 8, "vocab_size": 200, "bilstm_max_len": 16,
                "n_showcase": 0, "device": "cpu"}),
])
def test_a_binary_note_run_returns_its_validation_predictions(model: str, overrides: dict, tmp_path: Path):
    """Both fitting paths (scikit-learn baseline, neural) predict the validation notes of a binary task: one row
    per validation admission with its patient, the truth and a probability, in ml.val_predictions' columns."""
    task = get_task("readmission_notes")
    rows = _patient_notes()
    data = patient_split_data(rows, task)
    results = fit_and_evaluate(data, model, text_config(model, overrides, task=task), 0, tmp_path / "run",
                               lambda epoch, figures: None, cache=tmp_path)
    val = results.val_predictions
    assert val is not None, "a binary note run must store its validation predictions"
    assert set(VAL_PREDICTION_COLUMNS) - {"run_id"} == set(val.column_names)
    truth = rows.filter(pc.equal(rows.column("split"), "val"))
    assert val.column("sample_id").to_pylist() == [str(h) for h in truth.column("hadm_id").to_pylist()]
    assert val.column("subject_id").to_pylist() == truth.column("subject_id").to_pylist()
    assert val.column("y_true").to_pylist() == [bool(x) for x in truth.column("label").to_pylist()]
    assert set(val.column("label").to_pylist()) == {"readmission"}
    prob = np.asarray(val.column("prob").to_pylist())
    assert np.all((prob >= 0) & (prob <= 1)) and np.isfinite(prob).all()
    # the test predictions are unchanged: the test admissions only
    assert results.predictions.num_rows == 16 and not set(results.predictions.column("sample_id").to_pylist()) & set(
        val.column("sample_id").to_pylist())


def test_a_multiclass_note_run_stores_no_validation_predictions(tmp_path: Path):
    """MTSamples' path is unchanged: multi-class runs get neither validation rows nor the binary sections."""
    classes = np.array(["a", "b", "c"])[np.arange(36) % 3]
    frame = pa.table({"note_id": np.arange(36), "text": [f"note {c} {c}" for c in classes], "label": classes,
                      "group_id": np.arange(36), "split": ["train"] * 24 + ["val"] * 6 + ["test"] * 6})
    data = group_split_data(frame)
    results = fit_and_evaluate(data, "tfidf_logreg", text_config("tfidf_logreg", task=get_task("specialty")), 0,
                               tmp_path / "run", lambda epoch, figures: None)
    assert results.val_predictions is None and set(results.metrics) == {"test"}
    assert results.predictions.num_rows == 6 * 3


# ----------------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def notes_run(tmp_path_factory) -> tuple[Path, str]:
    """(warehouse, run id) of a TF-IDF readmission_notes run on a synthetic cohort with discharge summaries."""
    from medtx.codes import map_codes
    from medtx.ingest import ingest_mimic3
    from medtx.pipeline.steps import train_in_process
    from medtx.synth import generate_mimic3
    from medtx.tasks.build import build_samples
    from tests.conftest import DATA

    root = tmp_path_factory.mktemp("notes_trust")
    generate_mimic3(root / DATASET, N_PATIENTS, seed=5, notes=True)
    db = root / "warehouse.duckdb"
    ingest_mimic3(db, root / DATASET, DATASET, root / "cache")
    con = connect(db)
    try:
        map_codes(con, DATA, [DATASET])
        build_samples(con, DATA, ["readmission"], [DATASET], seed=1)
    finally:
        con.close()
    shutil.rmtree(root / DATASET)
    run_id = train_in_process(db, get_task("readmission_notes"), "tfidf_logreg", 0, dataset=DATASET, device="cpu",
                              models_dir=root / "models", exchange_dir=root / "exchange")
    return db, run_id


def _twin(db: Path, run_id: str, out: Path) -> dict:
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["report", "--run", run_id, "--format", "json", "--out", str(out),
                                      "--db", str(db)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def test_a_readmission_notes_run_stores_its_validation_predictions(notes_run):
    """Exactly the validation admissions with discharge text (an independent query of the samples and the patient
    split), each with its patient and label; the validation split, never test."""
    db, run_id = notes_run
    con = connect(db)
    try:
        stored = sorted(con.execute("SELECT CAST(sample_id AS BIGINT), subject_id, hadm_id, y_true, label FROM "
                                    "ml.val_predictions WHERE run_id = ?", [run_id]).fetchall())
        expected = sorted(con.execute(
            "SELECT r.hadm_id, r.subject_id, r.hadm_id, r.label = 1, 'readmission' FROM samples.readmission r "
            "JOIN samples.splits s ON s.dataset = r.dataset AND s.subject_id = r.subject_id AND s.task = 'readmission' "
            "WHERE r.dataset = ? AND s.split = 'val' AND trim(coalesce(r.text, '')) <> ''", [DATASET]).fetchall())
        test = {r for r, in con.execute("SELECT sample_id FROM ml.predictions WHERE run_id = ?", [run_id]).fetchall()}
        y, probs = zip(*con.execute("SELECT y_true, prob FROM ml.val_predictions WHERE run_id = ?",
                                    [run_id]).fetchall())
        val = dict(con.execute("SELECT metric, value FROM ml.metrics WHERE run_id = ? AND split = 'val'",
                               [run_id]).fetchall())
    finally:
        con.close()
    assert len(expected) > 50 and stored == expected
    assert not test & {str(r[0]) for r in stored}
    assert all(0 <= p <= 1 for p in probs) and len(set(probs)) > 10
    # the validation figures (the card's train vs validation vs test; the reference chosen on validation), as an
    # EHR run records them: recomputed from the stored validation predictions
    assert val["auroc"] == pytest.approx(roc_auc_score(y, probs), abs=1e-12)
    assert val["auprc"] == pytest.approx(average_precision_score(y, probs), abs=1e-12)


def test_a_readmission_notes_card_has_the_binary_task_sections_with_the_floors(notes_run, tmp_path: Path):
    db, run_id = notes_run
    twin = _twin(db, run_id, tmp_path / "card.json")
    con = connect(db)
    try:
        val_events, val_samples = con.execute(
            "SELECT sum(CAST(y_true AS INTEGER)), count(*) FROM ml.val_predictions WHERE run_id = ?",
            [run_id]).fetchall()[0]
        test_unit = con.execute("SELECT test_unit FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
        from medtx.evaluation.card import build_card

        card = build_card(con, run_id)
    finally:
        con.close()
    assert test_unit == "patients"
    # subgroups: every group's counts; a figure exactly where the floors allow one
    groups = twin["subgroups"]
    assert {g["attribute"] for g in groups} >= {"overall", "sex", "age_band", "ethnicity", "insurance",
                                                "admission_type"}
    for g in groups:
        floored = (g["patients"] < MIN_UNITS or g["events"] < MIN_GROUP_EVENTS
                   or g["samples"] - g["events"] < MIN_GROUP_NON_EVENTS)
        assert (g["auroc"] is None) == floored, g
        assert (g["withheld"] is not None) == floored, g
    assert any(g["auroc"] is None for g in groups) and any(g["auroc"] is not None for g in groups)
    # recalibration: both maps decided on the validation predictions, under the events floor
    recal = {r["method"]: r for r in twin["recalibration"]}
    assert set(recal) == {"platt", "isotonic"}
    for r in recal.values():
        assert (r["validation_samples"], r["validation_events"]) == (val_samples, val_events)
        if val_events < MIN_RECAL_EVENTS:
            assert r["status"] == "not_fitted" and "too few events" in r["reason"], r
    # operating points: every target a row, chosen ones with enough validation alerts and both figures
    points = {o["target"]: o for o in twin["operating_points"]}
    assert set(points) == {t for t, _, _ in op.TARGETS}
    for o in points.values():
        if o["status"] == "chosen":
            assert o["validation_alerts"] >= MIN_VAL_ALERTS and o["validation"]["ppv"] is not None
            assert set(o["test"]["ppv"]) == {"value", "low", "high"}
        else:
            assert o["status"] == "unreachable" and o["reason"] and o["threshold"] is None
    assert any(o["status"] == "chosen" for o in points.values())
    # the summary's calibration and net-benefit conclusions, each with its reason
    findings = {s["finding"].split(":")[0].split(" ")[0]: s for s in twin["summary"]}
    assert "Calibration" in findings and findings["Calibration"]["because"]
    assert any("net benefit" in s["finding"].lower() for s in twin["summary"])
    assert twin["calibration"] and twin["calibration"][0]["method"] == "none"
    # the page: the sections hold figures, not the "not computed" sentence, and the unit is the patient
    by_id = {s.id: s for s in card.sections}
    for sid in ("subgroups", "calibration", "operating-points"):
        assert by_id[sid].tables, sid
        assert not any("they are computed for" in p for p in by_id[sid].paragraphs), sid
    assert "resamples of test patients" in by_id["headline"].paragraphs[0]
    by_split = {r["metric"]: r for r in twin["standard_figures"]["performance_by_split"]}
    assert by_split["auroc"]["validation"] is not None and by_split["auroc"]["test"]["low"] is not None


def test_a_text_group_card_names_its_unit_and_has_no_binary_sections(tmp_path: Path):
    """MTSamples: the bootstrap resamples text groups; the card says so (headline, interval method), draws no
    subgroup, calibration or operating-point figures and says why, and claims no demographics."""
    from medtx.evaluation.card import build_card
    from tests.test_card_print import _text

    con = connect(tmp_path / "w.duckdb")
    try:
        _text(con, n=90)
        card = build_card(con, "text")
    finally:
        con.close()
    by_id = {s.id: s for s in card.sections}
    head = by_id["headline"]
    assert "resamples of test text groups" in head.paragraphs[0] and "patient" not in head.paragraphs[0]
    assert head.tables[0][1] and {r[-1] for r in head.tables[0][1]} == {"text_group_bootstrap_percentile"}
    assert "they are computed for binary and multi-label runs" in by_id["subgroups"].paragraphs[0]
    assert card.data["subgroups"] == [] and card.data["operating_points"] == []
    assert not any("raw.patients" in item for item in by_id["limitations"].paragraphs)
    assert all(rows for _, rows in by_id["standard-figures"].tables)  # no empty table: a sentence says why
    assert any("no metric of this run is stored for both" in p for p in by_id["standard-figures"].paragraphs)
