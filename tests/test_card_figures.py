"""The standard (OHDSI PatientLevelPrediction) figures of the model card and the run page, checked against an
independent computation on runs stored through records.finish_run: ROC and PR points against sklearn, the
E-statistics against a direct numpy loess, the scaled Brier against sklearn's Brier score, the age x sex cells
against a polars count; empty figures are a sentence, not empty axes; the leaderboard's card link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import (average_precision_score, brier_score_loss, precision_recall_curve, roc_auc_score,
                             roc_curve)

from medtx.evaluation import plp
from medtx.store.db import connect
from tests.test_trust import _cohort, _demographics, _record, _val


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    """A readmission run of 240 patients (~480 admissions), a run whose test split has no event, and a run on the
    first 25 patients (every age x sex cell under the floors)."""
    db = tmp_path_factory.mktemp("figs") / "warehouse.duckdb"
    c = _cohort()
    con = connect(db)
    try:
        _demographics(con, c)
        _record(con, "run", "logreg", c, c["prob"], _val(6), val_auprc=0.6)
        none = {**c, "y": np.zeros_like(c["y"])}
        _record(con, "no_events", "gru", none, c["prob"], _val(7), val_auprc=0.1)
        few = c["subj"] < 1025
        small = {**c, **{k: c[k][few] for k in ("subj", "hadm", "y", "prob")}}
        _demographics(con, c, "small")  # its own dataset: a comparison needs the same test samples
        _record(con, "small", "lightgbm", small, small["prob"], _val(8), val_auprc=0.2, dataset="small")
    finally:
        con.close()
    return db


def _arrays(db: Path, run_id: str) -> pl.DataFrame:
    con = connect(db, read_only=True)
    try:
        return con.sql("SELECT p.sample_id, p.subject_id, p.hadm_id, p.prob, p.y_true FROM ml.predictions p "
                       "WHERE run_id = ? ORDER BY sample_id", params=[run_id]).pl()
    finally:
        con.close()


def _card(db: Path, run_id: str):
    from medtx.evaluation.card import build_card

    con = connect(db, read_only=True)
    try:
        return build_card(con, run_id)
    finally:
        con.close()


def test_roc_and_pr_points_are_sklearns(stored: Path):
    f = _arrays(stored, "run")
    y, p = f["y_true"].to_numpy().astype(int), f["prob"].to_numpy()
    fpr, tpr, thr = plp.roc_curve(y, p)
    s_fpr, s_tpr, s_thr = roc_curve(y, p, drop_intermediate=False)
    np.testing.assert_allclose(fpr, s_fpr, atol=1e-12)
    np.testing.assert_allclose(tpr, s_tpr, atol=1e-12)
    np.testing.assert_allclose(thr[1:], s_thr[1:])
    precision, recall, pthr = plp.pr_curve(y, p)
    s_prec, s_rec, s_pthr = precision_recall_curve(y, p, drop_intermediate=False)
    at = {t: (a, b) for t, a, b in zip(pthr, precision, recall, strict=True)}
    for t, a, b in zip(s_pthr, s_prec[:-1], s_rec[:-1], strict=True):  # sklearn's last point is (1, 0), no threshold
        assert at[t] == pytest.approx((a, b), abs=1e-12)
    twin = _card(stored, "run").data["standard_figures"]
    assert twin["roc"]["auroc"] == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert twin["pr"]["average_precision"] == pytest.approx(average_precision_score(y, p), abs=1e-12)
    sk_points = set(zip(np.round(s_fpr, 12), np.round(s_tpr, 12), strict=True))
    drawn = list(zip(np.round(twin["roc"]["fpr"], 12), np.round(twin["roc"]["tpr"], 12), strict=True))
    assert 2 < len(drawn) <= plp.THIN and set(drawn) <= sk_points  # the drawn curve is sklearn's, thinned
    assert sum(twin["distribution"]["events"]) == y.sum() and sum(twin["distribution"]["non_events"]) == (1 - y).sum()


def _direct_loess(x: np.ndarray, y: np.ndarray, span: float = plp.SPAN) -> np.ndarray:
    """Independent: at each x_i, weighted least squares (np.linalg.lstsq) on its ceil(span n) nearest points."""
    k = int(np.ceil(span * len(x)))
    out = np.empty(len(x))
    for i, x0 in enumerate(x):
        d = np.abs(x - x0)
        near = np.argsort(d, kind="stable")[:k]
        h = d[near].max()
        w = (1 - (d[near] / h) ** 3) ** 3
        design = np.c_[np.ones(k), x[near]] * np.sqrt(w)[:, None]
        coef = np.linalg.lstsq(design, y[near] * np.sqrt(w), rcond=None)[0]
        out[i] = coef[0] + coef[1] * x0
    return out


def test_e_statistics_and_scaled_brier_against_an_independent_computation(stored: Path):
    f = _arrays(stored, "run")
    y, p = f["y_true"].to_numpy().astype(float), f["prob"].to_numpy()
    direct = np.abs(_direct_loess(p, y) - p)
    twin = _card(stored, "run").data["standard_figures"]
    e = twin["e_statistics"]
    assert len(np.unique(p)) > plp.GRID  # interpolated between 200 fitted points: close, not identical
    assert e["eavg"] == pytest.approx(direct.mean(), abs=2e-3)
    assert e["e90"] == pytest.approx(np.quantile(direct, 0.9), abs=5e-3)
    assert e["emax"] == pytest.approx(direct.max(), abs=1e-2)
    few = np.round(p, 2)  # <= 200 distinct predictions: every one is a fitted point, nothing interpolated
    smooth = plp.smooth_calibration(y, few)
    np.testing.assert_allclose(smooth.fitted, _direct_loess(few, y), atol=1e-9)
    brier = twin["scaled_brier"]
    prev = y.mean()
    assert brier["value"] == pytest.approx(1 - brier_score_loss(y, p) / (prev * (1 - prev)), abs=1e-12)
    assert brier["low"] < brier["value"] < brier["high"]


def test_age_by_sex_cells_match_an_independent_count_and_obey_the_floors(stored: Path):
    twin = _card(stored, "run").data["standard_figures"]["calibration_by_age_sex"]
    shown = 0
    for cell in twin:
        assert cell["withheld"] is None or cell["observed"] is None
        if cell["withheld"] is None:
            shown += 1
            assert cell["events"] >= 10 and cell["samples"] - cell["events"] >= 10 and cell["patients"] >= 30
            lo, hi = cell["observed"]["low"], cell["observed"]["high"]
            assert lo <= cell["observed"]["value"] <= hi
    assert shown >= 2
    con = connect(stored, read_only=True)
    try:  # the independent count: SQL over the raw tables, age at admission
        sql = con.sql("""
            SELECT CASE WHEN p.gender = 'F' THEN 'female' ELSE 'male' END AS sex,
                   CASE WHEN age < 50 THEN '<50' WHEN age < 65 THEN '50-64' WHEN age < 80 THEN '65-79' ELSE '>=80' END
                   AS band, count(*) AS samples, sum(CAST(y_true AS INT)) AS events, avg(CAST(y_true AS DOUBLE)) AS obs,
                   avg(prob) AS exp, count(DISTINCT p.subject_id) AS patients
            FROM (SELECT pr0.*, pt.gender, (epoch(a.admittime) - epoch(pt.dob)) / (365.25 * 86400) AS age
                  FROM ml.predictions pr0 JOIN raw.admissions a ON a.hadm_id = pr0.hadm_id AND a.dataset = 'sim'
                  JOIN raw.patients pt ON pt.subject_id = a.subject_id AND pt.dataset = 'sim'
                  WHERE pr0.run_id = 'run') p GROUP BY ALL""").pl()
    finally:
        con.close()
    expect = {(r["band"], r["sex"]): r for r in sql.iter_rows(named=True)}
    assert {(c["age_band"], c["sex"]) for c in twin} == set(expect)
    for cell in twin:
        r = expect[(cell["age_band"], cell["sex"])]
        assert (cell["samples"], cell["events"], cell["patients"]) == (r["samples"], r["events"], r["patients"])
        if cell["observed"] is not None:
            assert cell["observed"]["value"] == pytest.approx(r["obs"]) and cell["expected"] == pytest.approx(r["exp"])


def test_empty_figures_are_a_sentence_not_empty_axes(stored: Path):
    card = _card(stored, "no_events")
    section = next(s for s in card.sections if s.id == "standard-figures")
    text = " ".join(section.paragraphs)
    assert "No ROC or precision-recall curve: the test split has no events" in text
    assert not any("ROC curve (test)" in svg or "Precision-recall" in svg for svg in section.figures)
    assert card.data["standard_figures"]["roc"] is None
    small = _card(stored, "small")
    section = next(s for s in small.sections if s.id == "standard-figures")
    assert "No cell reaches the floors" in " ".join(section.paragraphs)
    assert not any("observed vs expected" in svg for svg in section.figures)
    assert all(c["observed"] is None for c in small.data["standard_figures"]["calibration_by_age_sex"])
    assert plp.e_statistics(np.array([]), np.array([]))["eavg"] != plp.e_statistics(np.array([]), np.array([]))["eavg"]


def test_the_card_shows_train_validation_and_test_as_stored(stored: Path):
    card = _card(stored, "run")
    rows = card.data["standard_figures"]["performance_by_split"]
    assert [(r["metric"], r["train"], r["validation"]) for r in rows] == [("auprc", None, 0.6)]
    t = rows[0]["test"]
    assert t["low"] < t["value"] < t["high"]  # the recorded test AUPRC with its interval
    page = card.html()
    assert "<td>not stored</td>" in page and "optimistic by construction" in page  # recorded without train rows
    assert page.count("<svg") >= 6 and "Eavg (ICI)" in page
    assert not re.search(r"issue \d", page)


def test_a_multilabel_card_draws_per_label_calibration_beside_the_pooled_figure(tmp_db: Path):
    from medtx.training import records
    from tests.test_trust import _insert

    c, n_labels = _cohort(), 8
    labels = [f"D{j:02d}" for j in range(n_labels)]
    rng = np.random.default_rng(1)
    n = len(c["hadm"])
    p = rng.beta(1, 4, (n, n_labels))
    y = rng.random((n, n_labels)) < p
    y[:, 3] = rng.random(n) < np.clip(p[:, 3] + 0.3, 0, 1)  # D03 under-predicted by 30 points
    y[:, 7] = False  # D07: no event, no curve
    con = connect(tmp_db)
    try:
        _demographics(con, c)
        records.start_run(con, "ml", task="next_visit", model="transformer", dataset="sim", seed=0, config={})
        records.write_predictions(con, "ml", pl.DataFrame({
            "sample_id": np.repeat(c["hadm"].astype(str), n_labels), "subject_id": np.repeat(c["subj"], n_labels),
            "hadm_id": np.repeat(c["hadm"], n_labels), "label": labels * n, "prob": p.ravel(), "y_true": y.ravel(),
            "predicted": p.ravel() >= 0.3}))
        _insert(con, "ml.val_predictions", pl.DataFrame({
            "run_id": ["ml"] * 10, "sample_id": [f"v{i}" for i in range(10)], "subject_id": np.arange(10),
            "label": ["D00"] * 10, "prob": np.linspace(0.1, 0.9, 10), "y_true": [False, True] * 5}))
        records.finish_run(con, "ml")
    finally:
        con.close()
    figs = _card(tmp_db, "ml").data["standard_figures"]
    per = {r["label"]: r for r in figs["per_label_calibration"]}
    assert per["D07"]["withheld"] == "too few events (0)" and per["D07"]["eavg"] is None
    worst = max((r for r in per.values() if r["eavg"] is not None), key=lambda r: r["eavg"])
    assert worst["label"] == "D03" and worst["eavg"] > 0.2 > figs["e_statistics"]["eavg"]
    direct = np.abs(_direct_loess(p[:, 3], y[:, 3].astype(float)) - p[:, 3]).mean()
    assert per["D03"]["eavg"] == pytest.approx(direct, abs=5e-3)
    fpr, tpr, _ = roc_curve(y.ravel(), p.ravel())
    assert figs["roc"]["auroc"] == pytest.approx(roc_auc_score(y.ravel(), p.ravel()), abs=1e-12)


def test_the_leaderboard_links_each_run_to_its_card_and_shows_its_calibration_and_gap(stored: Path, tmp_path: Path):
    import shutil

    from dashboard import create_app, queries
    from dashboard.pages.leaderboard import leaderboard_rows
    from medtx.publish.snapshot import publish_snapshot

    db = tmp_path / "w.duckdb"
    shutil.copy(stored, db)
    con = connect(db)
    try:  # the latest pipeline run trained 'run' (240 test patients) and 'small'; an older one 'no_events'
        con.execute("INSERT INTO ml.pipeline_runs (pipeline_run_id, status, started_at) VALUES "
                    "('old', 'completed', TIMESTAMP '2026-01-01'), ('new', 'completed', TIMESTAMP '2026-02-01')")
        con.execute("UPDATE ml.runs SET pipeline_run_id = CASE WHEN run_id = 'no_events' THEN 'old' ELSE 'new' END")
    finally:
        con.close()
    snap = publish_snapshot(db, tmp_path / "w.snapshot.duckdb").path
    assert queries.default_run(snap) == "run"  # not the newest run, not the 25-patient one
    rows, _ = leaderboard_rows(queries.leaderboard_runs(snap, "readmission", "sim"),
                               queries.leaderboard_metrics(snap, "readmission", "sim", None),
                               queries.leaderboard_sizes(snap, "readmission", "sim"), "auprc",
                               queries.leaderboard_trust(snap, "readmission", "sim"))
    client = create_app(snap).server.test_client()
    assert {r["run_id"] for r in rows} == {"run", "no_events"}
    for row in rows:
        href = re.fullmatch(r"\[card\]\((/card/[^)]+)\)", row["card"]).group(1)
        page = client.get(href)
        assert page.status_code == 200 and b"<section id='standard-figures'>" in page.data, href
    run = next(r for r in rows if r["run_id"] == "run")
    assert re.fullmatch(r"-?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]", run["calibration_slope"])
    assert re.match(r"(auroc|auprc|citl), \w+: .+ − .+ -?\d\.\d{3} \[", run["largest_gap"])
