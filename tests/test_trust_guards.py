"""Issue 42: what the model card lets a reader conclude is guarded. Each bad case is built here: a group with 3
events, a run with 9 validation admissions, an inverted Platt map, a constant model, a failed run, and a model
equal to its reference simulated 100 times (the per-group verdicts' multiplicity)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from medtx.evaluation import calibration as cal
from medtx.evaluation import floors
from medtx.evaluation import operating as op
from medtx.evaluation.subgroups import holm_adjust, largest_gaps, subgroup_results
from medtx.evaluation.uncertainty import RunData
from medtx.metrics import intervals as iv
from medtx.store.db import connect
from tests.test_trust import _cohort, _demographics, _record, _sim_groups, _val


def _sigmoid(z):
    return 1 / (1 + np.exp(-z))


# ----------------------------------------------------------------------------------------------- floors


def test_a_group_with_3_events_gets_no_auroc_and_is_never_the_largest_gap():
    rng = np.random.default_rng(0)
    n = 200  # one sample per patient; 'small' has 40 patients and exactly 3 events
    group = np.where(np.arange(n) < 40, "small", "big").astype(object)
    y = rng.random(n) < 0.3
    y[:40] = False
    y[:3] = True
    p = np.clip(0.3 + 0.4 * (y - 0.3) + rng.normal(0, 0.15, n), 0.01, 0.99)
    p[:3] = 0.01  # the 3 events ranked last: a huge (meaningless) gap if the group were shown
    data = RunData(np.arange(n).astype(str), np.arange(n), {"y": y, "p": p}, "binary")
    ref = RunData(np.arange(n).astype(str), np.arange(n), {"y": y, "p": np.clip(p + rng.normal(0, .1, n), 0, 1)},
                  "binary")
    groups = {"sex": group}
    counts = iv.resample_counts(n, 200)
    rows, boot = subgroup_results(data, ref, groups, [("auroc", "none")], counts, np.arange(n), attributes=("sex",))
    small = next(r for r in rows if r.group == "small")
    assert small.n_positives == 3 and small.n_patients == 40
    assert small.too_small and small.withheld == "too few events (3)"
    assert np.isnan(small.value) and np.isnan(small.ci_low) and small.verdict == "too_small"
    big = next(r for r in rows if r.group == "big")
    assert not big.too_small and np.isfinite(big.value) and big.withheld is None
    assert ("sex", "small", "auroc", "none") not in boot
    assert not largest_gaps(boot, [("auroc", "none")], attributes=("sex",))  # one eligible group: no gap at all
    assert floors.group_withheld(40, 30, 9) == "too few non-events (9)"
    assert floors.group_withheld(29, 30, 30) == "fewer than 30 test patients (29)"


def test_nine_validation_admissions_get_no_map_and_no_operating_point():
    yv, pv = _val(3, n=9)
    for d in cal.recalibration_decisions("binary", yv, pv):
        assert d.status == "not_fitted" and d.fitted is None and "too few events" in d.reason, d
    choices = op.choose_targets(yv, pv)
    assert [c.target for c in choices] == [t for t, _, _ in op.TARGETS]
    assert all(c.status == "unreachable" and c.threshold is None and "9 validation samples" in c.reason
               for c in choices)
    rows = op.operating_points(yv, pv, *_val(4, n=50), np.arange(50), iv.resample_counts(50, 50))
    assert {r[0] for r in rows} == {"grid"}


def test_a_ppv_target_reached_only_by_two_alerts_is_unreachable():
    y = np.array([1, 1] + [0] * 20 + [1] * 4 + [0] * 74, dtype=bool)
    p = np.r_[[0.99, 0.98], np.linspace(0.9, 0.1, 98)]  # the top 2 are events; below, PPV falls far under 0.5
    loose = op.choose_threshold(y, p, "ppv", 0.5, min_alerts=0)  # without the floor: 4 alerts, 2 of them true
    assert loose is not None and (p >= loose).sum() < floors.MIN_VAL_ALERTS
    choice = next(c for c in op.choose_targets(y, p) if c.target == "ppv_0.50")
    assert choice.status == "unreachable" and "fewer than 10 alerts" in choice.reason
    chosen = next(c for c in op.choose_targets(y, p) if c.target == "sensitivity_0.80")
    assert chosen.status == "chosen" and chosen.val_alerts >= floors.MIN_VAL_ALERTS


# ----------------------------------------------------------------------------------------------- recalibration


def test_an_inverted_platt_map_is_refused():
    rng = np.random.default_rng(1)
    z = rng.normal(-1, 1.2, 600)
    y = rng.random(600) < _sigmoid(z)
    p_inverted = _sigmoid(-1.5 - 0.3 * (z + 1))  # ranks backwards on validation: Platt fits a negative slope
    assert cal.fit_platt(y, p_inverted).params["b"] < 0
    platt = next(d for d in cal.recalibration_decisions("binary", y, p_inverted) if d.method == "platt")
    assert platt.status == "refused" and platt.fitted is None and "reverse the ranking" in platt.reason


def test_a_map_is_recommended_only_when_it_lowers_the_out_of_fold_log_loss():
    y, p = _val(11, 2000, power=2.5)  # miscalibrated: a map helps
    decisions = {d.method: d for d in cal.recalibration_decisions("binary", y, p)}
    assert [d.status for d in decisions.values()].count("recommended") == 1
    best = next(d for d in decisions.values() if d.status == "recommended")
    assert best.oof_mapped < best.oof_original
    rng = np.random.default_rng(2)
    z = rng.normal(-1.5, 1.0, 2000)
    y_ok = rng.random(2000) < _sigmoid(z)
    calibrated = cal.recalibration_decisions("binary", y_ok, _sigmoid(z))  # already calibrated: keep it
    assert all(d.status == "not_recommended" and "does not lower" in d.reason for d in calibrated), calibrated


# ----------------------------------------------------------------------------------------------- multiplicity


def test_adjusted_group_verdicts_stay_at_the_nominal_rate_over_100_null_simulations():
    """A model equal to its reference (same true risk, noise of the same size, independently drawn): the
    Holm-adjusted per-group verdicts report any better/worse in <= 5% of runs; the unadjusted ones, far more
    often (the check can fail: without the adjustment it does)."""
    n_sims, adjusted, unadjusted = 100, 0, 0
    metrics = [("auroc", "none"), ("auprc", "none")]
    attrs = ("sex", "age_band")
    for seed in range(n_sims):
        c = _cohort(300, seed=2000 + seed)
        rng = np.random.default_rng(seed)
        n_units, inverse = iv.unit_index(c["subj"])
        counts = iv.resample_counts(n_units, 200, seed)
        run = RunData(c["hadm"].astype(str), c["subj"], {"y": c["y"], "p": _sigmoid(c["z"] + rng.normal(0, .6, len(
            c["y"])))}, "binary")
        ref = RunData(c["hadm"].astype(str), c["subj"], {"y": c["y"], "p": _sigmoid(c["z"] + rng.normal(0, .6, len(
            c["y"])))}, "binary")
        rows, _ = subgroup_results(run, ref, _sim_groups(c), metrics, counts, inverse, attributes=attrs)
        adjusted += any(r.verdict_adjusted in ("better", "worse") for r in rows)
        unadjusted += any(r.verdict in ("better", "worse") for r in rows)
    assert adjusted / n_sims <= iv.ALPHA, (adjusted, unadjusted)
    assert unadjusted / n_sims > 2 * iv.ALPHA, (adjusted, unadjusted)


def test_holm_keeps_a_strong_difference_and_never_flips_a_direction():
    from medtx.evaluation.subgroups import GroupResult

    def row(group, p, verdict, attribute="sex"):
        return GroupResult(attribute, group, "auroc", "none", 50, 50, 20, False, .7, .6, .8, .1, .05, .15,
                           verdict, None, p)

    out = holm_adjust([row("a", 1e-6, "better"), row("b", 0.03, "worse"), row("c", 0.5, "no_detectable_difference"),
                       row("all", 0.03, "worse", "overall")], alpha=0.05)
    assert [r.verdict_adjusted for r in out] == ["better", "no_detectable_difference", "no_detectable_difference",
                                                 "worse"]


# ----------------------------------------------------------------------------------------------- the card


@pytest.fixture(scope="module")
def card_db(tmp_path_factory) -> Path:
    """Real runs recorded through records.finish_run (which computes every trust figure): a reference, a run with
    600 validation admissions, one with 9, a constant model and a failed run. The tests only read it."""
    from medtx.training import records

    tmp_db = tmp_path_factory.mktemp("card") / "warehouse.duckdb"
    c = _cohort()
    con = connect(tmp_db)
    try:
        _demographics(con, c)
        ref_prob = np.clip(c["prob"] + np.random.default_rng(3).normal(0, 0.15, len(c["y"])), 0.001, 0.999)
        _record(con, "ref", "logreg", c, ref_prob, _val(5), val_auprc=0.5)
        _record(con, "run", "transformer", c, c["prob"], _val(6), val_auprc=0.6)
        _record(con, "nine", "gru", c, c["prob"], _val(7, n=9), val_auprc=0.4)
        _record(con, "flat", "most_frequent", c, np.full(len(c["y"]), 0.2), _val(8), val_auprc=0.3)
        records.start_run(con, "broken", task="readmission", model="gru", dataset="sim", seed=0, config={})
        records.fail_run(con, "broken", "CUDA out of memory while training epoch 3\nTraceback (most recent call last)")
    finally:
        con.close()
    return tmp_db


def _card(db: Path, run_id: str):
    from medtx.evaluation.card import build_card

    con = connect(db, read_only=True)
    try:
        return build_card(con, run_id)
    finally:
        con.close()


def _section(card, sid: str) -> str:
    s = next(s for s in card.sections if s.id == sid)
    return " ".join([*s.paragraphs, *(" ".join(" ".join(r) for r in rows) for _, rows in s.tables)])


def test_nine_validation_admissions_through_the_real_card(card_db: Path):
    card = _card(card_db, "nine")
    ops, calib = _section(card, "operating-points"), _section(card, "calibration")
    assert ops.count("unreachable") >= 4 and "9 validation samples" in ops
    assert "not fitted: too few events" in calib and "keep the original probabilities" in calib
    assert {r["status"] for r in card.data["recalibration"]} == {"not_fitted"}
    assert [o["status"] for o in card.data["operating_points"]] == ["unreachable"] * 4
    assert all(o["threshold"] is None and o["reason"].startswith("unreachable") for o in card.data["operating_points"])
    con = connect(card_db, read_only=True)
    try:
        assert con.sql("SELECT DISTINCT method FROM ml.calibration WHERE run_id = 'nine'").fetchall() == [("none",)]
        targets = con.sql("SELECT DISTINCT target FROM ml.operating_points WHERE run_id = 'nine'").fetchall()
        assert targets == [("grid",)]
    finally:
        con.close()
    good = _card(card_db, "run")  # 600 validation admissions: maps fitted, targets chosen, val beside test
    assert {r["status"] for r in good.data["recalibration"]} <= {"recommended", "not_recommended", "refused"}
    chosen = [o for o in good.data["operating_points"] if o["status"] == "chosen"]
    assert chosen and all(o["validation"]["ppv"] is not None and o["test"]["ppv"]["value"] is not None
                          and o["validation_alerts"] >= floors.MIN_VAL_ALERTS for o in chosen)
    assert re.search(r"\d\.\d{3} / \d\.\d{3} \[", _section(good, "operating-points"))  # validation / test [CI]
    iso = next(r for r in good.data["recalibration"] if r["method"] == "isotonic")
    assert iso["distinct_risks"] and "distinct test risks" in _section(good, "calibration")


def test_a_constant_model_card_says_it_does_not_discriminate(card_db: Path):
    card = _card(card_db, "flat")
    findings = {s["finding"]: s["because"] for s in card.data["summary"]}
    assert "Does not discriminate" in findings
    assert any(f.startswith("Recommendation: this model should not be used") for f in findings)
    assert card.sections[0].id == "summary" and "Does not discriminate" in _section(card, "summary")
    good = {s["finding"] for s in _card(card_db, "run").data["summary"]}
    assert "Does not discriminate" not in good and any(f.startswith("Discriminates") for f in good)


def test_a_failed_run_card_says_failed_and_shows_nothing_that_reads_as_a_result(card_db: Path):
    from medtx.evaluation.card import FAILED_SECTIONS

    card = _card(card_db, "broken")
    page = card.html()
    assert card.title.startswith("FAILED") and "<h1>FAILED" in page
    assert tuple(s.id for s in card.sections) == FAILED_SECTIONS
    assert "CUDA out of memory while training epoch 3" in page and "Traceback" not in page
    assert "Not collapsed" not in page and "AUROC" not in page and "Subgroups" not in page
    assert card.data["status"] == "failed" and card.data["subgroups"] == [] and card.data["operating_points"] == []


def test_the_json_twin_through_medtx_report(card_db: Path, tmp_path: Path):
    from typer.testing import CliRunner

    from flows.cli import app

    out = tmp_path / "run.json"
    result = CliRunner().invoke(app, ["report", "--run", "run", "--format", "json", "--out", str(out),
                                      "--db", str(card_db)])
    assert result.exit_code == 0, result.output
    twin = json.loads(out.read_text())
    assert twin["summary"] and all(set(s) == {"finding", "because"} and s["because"] for s in twin["summary"])
    assert twin["summary"][-1]["finding"].startswith("Recommendation")
    for g in twin["subgroups"]:
        assert {"attribute", "group", "patients", "samples", "events", "auroc"} <= set(g)
        assert (g["auroc"] is None) == (g["withheld"] is not None), g
        if g["auroc"] is not None:
            assert set(g["auroc"]) == {"value", "low", "high"}
    assert any(g["auroc"] is None for g in twin["subgroups"])  # the crafted cohort's small groups
    assert {r["method"] for r in twin["recalibration"]} == {"platt", "isotonic"}
    assert all({"status", "reason"} <= set(r) for r in twin["recalibration"])
    assert {o["target"] for o in twin["operating_points"]} == {t for t, _, _ in op.TARGETS}
    assert all({"target", "threshold", "validation", "test"} <= set(o) for o in twin["operating_points"])
    assert twin["intended_use"]["moment"] == "at discharge of the admission"
    bad = CliRunner().invoke(app, ["report", "--run", "run", "--format", "xml", "--db", str(card_db)])
    assert bad.exit_code == 2 and "--format" in bad.output


# ----------------------------------------------------------------------------------------------- the summary rules


def test_the_summary_of_a_model_that_should_not_be_used():
    """The issue's readmission logreg on synth_2000, as figures: every conclusion and the recommendation follow."""
    from medtx.evaluation import summary as sm

    f = sm.Figures(auroc=(0.516, 0.411, 0.620), citl=(0.004, -0.03, 0.04), slope=(0.043, -0.4, 0.5),
                   recalibration=[("platt", "not_recommended", "does not lower ...")],
                   decision=[(t, 0.001, -0.01, 0.012, 0.124 - 0.876 * t / (1 - t)) for t in np.arange(0.02, 0.31, .01)],
                   prevalence=0.124, operating=[("sensitivity_0.80", "chosen", "", 0.117, 0.09, 0.14)],
                   n_test_units=300)
    found = {x.finding: x.because for x in sm.findings(f)}
    assert found["Does not discriminate"].endswith("contains 0.5 (chance)")
    assert any("carry almost no information" in k for k in found)
    assert "Keep the original probabilities" in found
    assert any(k.startswith("No net benefit") for k in found)
    assert any(k.startswith("Alerts no better than chance at sensitivity_0.80") for k in found)
    assert sm.findings(f)[-1].finding == "Recommendation: this model should not be used on these data"
    good = sm.Figures(auroc=(0.80, 0.75, 0.85), citl=(0.0, -0.02, 0.02), slope=(1.0, 0.9, 1.1), n_test_units=300)
    assert sm.findings(good)[0].finding == "Discriminates (good)"
    assert sm.findings(good)[-1].finding == "Recommendation: not for clinical use on this evidence alone"


def test_a_pooled_ece_does_not_hide_a_badly_calibrated_label():
    from medtx.evaluation.trust import per_label_ece

    rng = np.random.default_rng(4)
    p = rng.beta(1, 20, (500, 30))
    y = rng.random(p.shape) < p
    y[:, 7] = rng.random(500) < np.clip(p[:, 7] + 0.3, 0, 1)  # label 'l07' is 30 points under-predicted
    labels = [f"l{j:02d}" for j in range(30)]
    rows = {r[1]: r for r in per_label_ece(y, p, np.arange(500), 500, labels)}
    pooled = iv.point(iv.ece_stat(y, p, np.arange(500), 500), 500)
    assert rows["ece_label_max"][2] > 0.25 > 3 * pooled
    assert json.loads(rows["ece_label_max"][6])["label"] == "l07"
    assert rows["ece_label_median"][2] < 0.05


def test_a_multilabel_card_shows_the_per_label_ece_beside_the_pooled_one(tmp_db: Path):
    """A next_visit run recorded through records.finish_run: one label (D03) under-predicted by 30 points."""
    import polars as pl

    from medtx.training import records
    from tests.test_trust import _insert

    c, n_labels = _cohort(), 12
    labels = [f"D{j:02d}" for j in range(n_labels)]

    def cells(n: int, seed: int):
        rng = np.random.default_rng(seed)
        p = rng.beta(1, 6, (n, n_labels))
        y = rng.random((n, n_labels)) < p
        y[:, 3] = rng.random(n) < np.clip(p[:, 3] + 0.3, 0, 1)
        return p, y

    con = connect(tmp_db)
    try:
        _demographics(con, c)
        n = len(c["hadm"])
        p, y = cells(n, 1)
        records.start_run(con, "ml", task="next_visit", model="transformer", dataset="sim", seed=0, config={})
        records.write_predictions(con, "ml", pl.DataFrame({
            "sample_id": np.repeat(c["hadm"].astype(str), n_labels), "subject_id": np.repeat(c["subj"], n_labels),
            "hadm_id": np.repeat(c["hadm"], n_labels), "label": labels * n, "prob": p.ravel(), "y_true": y.ravel(),
            "predicted": p.ravel() >= 0.3}))
        pv, yv = cells(300, 2)
        _insert(con, "ml.val_predictions", pl.DataFrame({
            "run_id": ["ml"] * (300 * n_labels), "sample_id": np.repeat([f"v{i}" for i in range(300)], n_labels),
            "subject_id": np.repeat(np.arange(300), n_labels), "label": labels * 300, "prob": pv.ravel(),
            "y_true": yv.ravel()}))
        records.finish_run(con, "ml")
    finally:
        con.close()
    card = _card(tmp_db, "ml")
    ece = card.data["per_label_ece"]
    assert ece["worst_label"] == "D03" and ece["max"] > 0.2 > 4 * ece["pooled"] / 2
    assert "worst 0.2" in _section(card, "calibration") and "label D03" in _section(card, "calibration")
    assert [r["method"] for r in card.data["recalibration"]] == ["temperature"]
