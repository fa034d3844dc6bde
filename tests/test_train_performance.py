"""Issue 42, PLP's "train vs validation vs test": every binary and multi-label EHR run records its apparent
(training-split) performance as ml.metrics rows with split 'train', through the same recording path as validation
and test, and keeps no training prediction. A logreg run's training figures equal an independent recomputation:
the same deterministic model refitted here (at the C the run chose) on the training samples read with plain SQL,
its probabilities scored with scikit-learn (the refit's validation AUPRC equals the run's first, so it is the run's
model). A transformer run records them from its one extra eval pass. The card shows them, and a run recorded
without them still reads "not stored"; a training-probability matrix of the wrong shape is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from sklearn.metrics import average_precision_score, precision_recall_curve, roc_auc_score

from medtx.store.db import connect
from medtx.tasks import get_task
from tests.fixtures_samples import demo_db  # noqa: F401  (a fixture)

DEMO = "mimic3_demo"
TINY = {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32, "epochs": 1, "n_showcase": 1}


@pytest.fixture(scope="module")
def runs(demo_db: Path, tmp_path_factory) -> tuple[Path, dict[str, str]]:  # noqa: F811
    from medtx.pipeline.steps import train_in_process

    db = tmp_path_factory.mktemp("trainperf") / "w.duckdb"
    shutil.copy(demo_db, db)
    models = db.parent / "models"
    out = {
        "readmission.logreg": train_in_process(db, get_task("readmission"), "logreg", 0, {"n_boot": 20},
                                               dataset=DEMO, device="cpu", models_dir=models),
        "drug_rec.transformer": train_in_process(db, get_task("drug_rec"), "transformer", 0, {**TINY, "n_boot": 20},
                                                 dataset=DEMO, device="cpu", models_dir=models),
    }
    return db, out


def _metrics(con, run_id: str, split: str) -> dict[tuple[str, str], float | None]:
    return {(m, a): v for m, a, v in con.execute("SELECT metric, averaging, value FROM ml.metrics WHERE run_id = ? "
                                                 "AND split = ?", [run_id, split]).fetchall()}


def _split_rows(con, split: str) -> pa.Table:
    """readmission's samples of one split in the runner's (subject, hadm) order, by plain SQL."""
    return con.sql(
        "SELECT s.* FROM samples.readmission s JOIN samples.splits sp ON sp.dataset = s.dataset AND "
        "sp.task = 'readmission' AND sp.subject_id = s.subject_id WHERE s.dataset = $dataset AND sp.split = $split "
        "ORDER BY s.subject_id, s.hadm_id", params={"dataset": DEMO, "split": split}).to_arrow_table()


def _rp80(y: np.ndarray, p: np.ndarray) -> float:
    precision, recall, _ = precision_recall_curve(y, p)
    return float(recall[precision >= 0.8].max()) if (precision >= 0.8).any() else 0.0


def test_logreg_training_figures_equal_an_independent_recomputation(runs):
    from medtx.models.ehr_data import LabelSpace
    from medtx.models.logreg import LogReg

    db, ids = runs
    rid, task = ids["readmission.logreg"], get_task("readmission")
    con = connect(db, read_only=True)
    try:
        train, val = _split_rows(con, "train"), _split_rows(con, "val")
        stored = {s: _metrics(con, rid, s) for s in ("train", "val")}
        config = json.loads(con.execute("SELECT config FROM ml.runs WHERE run_id = ?", [rid]).fetchall()[0][0])
        kept = con.execute("SELECT count(*) FROM ml.predictions p JOIN samples.splits sp ON sp.task = 'readmission' "
                           "AND sp.dataset = ? AND sp.subject_id = p.subject_id AND sp.split = 'train' "
                           "WHERE p.run_id = ?", [DEMO, rid]).fetchall()[0][0]
    finally:
        con.close()
    assert kept == 0  # no training prediction is stored, only its figures
    assert set(stored["train"]) == set(stored["val"]) == {("auroc", "none"), ("auprc", "none"), ("rp80", "none")}
    model = LogReg(task, LabelSpace(["readmission_30d"], binary=True), C=config["C_chosen"]).fit(train)
    y_val = np.asarray(val.column("label").to_pylist(), dtype=int)
    assert average_precision_score(y_val, model.predict_proba(val)[:, 0]) == pytest.approx(
        stored["val"][("auprc", "none")], abs=1e-12)  # the refit is the run's model
    y, p = np.asarray(train.column("label").to_pylist(), dtype=int), model.predict_proba(train)[:, 0]
    assert 0 < y.sum() < len(y)
    assert stored["train"][("auroc", "none")] == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert stored["train"][("auprc", "none")] == pytest.approx(average_precision_score(y, p), abs=1e-12)
    assert stored["train"][("rp80", "none")] == pytest.approx(_rp80(y, p), abs=1e-12)
    assert config["train_split"]["seconds"] >= 0 and "optimistic" in config["train_split"]["figures"]


def test_a_transformer_run_records_its_multilabel_training_figures(runs):
    db, ids = runs
    rid = ids["drug_rec.transformer"]
    con = connect(db, read_only=True)
    try:
        train, val = _metrics(con, rid, "train"), _metrics(con, rid, "val")
        config = json.loads(con.execute("SELECT config FROM ml.runs WHERE run_id = ?", [rid]).fetchall()[0][0])
    finally:
        con.close()
    assert set(train) == set(val) and ("pr_auc_samples", "visit") in train and ("jaccard_samples", "patient") in train
    assert all(v is None or 0 <= v <= 1 for (m, _), v in train.items() if not m.startswith("avg_"))
    assert config["train_split"]["seconds"] > 0


def test_the_card_shows_the_training_figures_and_says_what_they_mean(runs, tmp_path: Path):
    from medtx.evaluation.card import build_card

    db, ids = runs
    rid = ids["readmission.logreg"]
    con = connect(db, read_only=True)
    try:
        card = build_card(con, rid)
        stored = _metrics(con, rid, "train")
    finally:
        con.close()
    rows = card.data["standard_figures"]["performance_by_split"]
    assert {r["metric"]: r["train"] for r in rows} == {m: v for (m, _), v in stored.items()}
    page = card.html()
    assert "train (apparent)" in page and "optimistic by construction" in page
    assert f"<td>{stored[('auroc', 'none')]:.3f}</td>" in page and "<td>not stored</td>" not in page
    # a run recorded without training figures (an older run) still says so
    copy = tmp_path / "w.duckdb"
    shutil.copy(db, copy)
    con = connect(copy)
    try:
        con.execute("DELETE FROM ml.metrics WHERE run_id = ? AND split = 'train'", [rid])
        older = build_card(con, rid)
    finally:
        con.close()
    assert all(r["train"] is None for r in older.data["standard_figures"]["performance_by_split"])
    assert "<td>not stored</td>" in older.html()


def test_training_probabilities_of_the_wrong_shape_are_refused():
    from medtx.models.ehr_data import LabelSpace
    from medtx.training.ehr_evaluation import Outcome, evaluate

    task = get_task("readmission")
    part = {"subject_id": [1, 2, 3, 4], "hadm_id": [11, 12, 13, 14], "label": [True, False, True, False]}
    parts = {s: pa.table(part) for s in ("train", "val", "test")}
    p = np.array([[0.9], [0.2], [0.7], [0.1]])
    outcome = Outcome(p, p, p_train=np.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"logreg: train probabilities have shape \(3, 1\), labels \(4, 1\)"):
        evaluate(task, "logreg", 0, parts, LabelSpace(["readmission_30d"], binary=True), [], outcome, 5, None, 0.0)
    ok = evaluate(task, "logreg", 0, parts, LabelSpace(["readmission_30d"], binary=True), [],
                  Outcome(p, p, p_train=p), 5, None, 0.0)
    assert dict(((m, a), v) for m, a, v, _, _ in ok.metrics["train"])[("auroc", "none")] == 1.0


def test_a_perfect_training_ranking_records_auprc_1_not_a_rounding_step_above():
    """A model that ranks its training split perfectly is common (logreg on a small cohort); scikit-learn's AUPRC
    then can read 1.0000000000000002, which the result-package check refuses as no AUPRC (found on an ACES task)."""
    from medtx.metrics.binary import binary_metrics

    y = np.r_[np.ones(9), np.zeros(2)]
    p = np.r_[np.linspace(0.9, 0.6, 9), np.linspace(0.5, 0.1, 2)]
    assert average_precision_score(y, p) > 1  # the rounding step this guards against
    assert binary_metrics(y, p)["auprc"] == 1.0

