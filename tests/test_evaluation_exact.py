"""Issue 35: the fast per-run evaluation gives exactly the numbers of a straightforward computation.

- AUROC, AUPRC, RP80 (`intervals.binary_ranking`, one pass over the resamples for all three) against per-resample
  references: AUROC against its exact rational value (pairs counted in integers, weights = draw counts), so the
  float must be bit-identical; AUPRC and RP80 against a direct per-resample loop and sklearn;
- the calibration slope's Newton iterations (`calibration.fit_logistic`, written into buffers) against the same
  iterations written as plain expressions, bit for bit, and the no-slope case (one distinct probability);
- `trust.refresh_verdicts`: when the reference baseline changes, the other runs' rewritten per-group rows equal a
  full recompute, and their other trust figures stay as a full recompute writes them.

Data: the bundled MIMIC-III demo, ingested and built (tests/fixtures_samples.py), with real runs recorded on it;
plus a larger constructed split with many tied scores. No timing here (benchmarks/bootstrap.py times it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from medtx.evaluation import calibration as cal
from medtx.evaluation.trust import compute_trust, refresh_verdicts
from medtx.evaluation.uncertainty import load_run_data
from medtx.metrics import intervals as iv
from medtx.store.db import connect, open_warehouse
from medtx.tasks import get_task
from medtx.pipeline.steps import train_in_process
from tests.fixtures_samples import DEMO, demo_copy, demo_db  # noqa: F401 (fixtures)

N_CHECKED = 60  # resamples checked one by one against the references


def _exact_auroc(y: np.ndarray, p: np.ndarray, w: np.ndarray) -> float:
    """Weighted Mann-Whitney AUROC from integer pair counts: sum over (positive i, negative j) of w_i w_j (2 if
    p_i > p_j, 1 if tied), halved, over (sum w_pos)(sum w_neg); one correctly rounded division at the end."""
    w = w.astype(np.int64)
    pos, neg = y & (w > 0), ~y & (w > 0)
    if not pos.any() or not neg.any():
        return float("nan")
    pi, wi = p[pos], w[pos]
    pj, wj = p[neg], w[neg]
    twice = int(((wi[:, None] * wj[None, :]) * (2 * (pi[:, None] > pj[None, :]) + (pi[:, None] == pj[None, :]))).sum())
    return (twice / 2) / float(wi.sum() * wj.sum())


def _direct_ap_rp(y: np.ndarray, p: np.ndarray, w: np.ndarray, min_precision: float = 0.8) -> tuple[float, float]:
    """Average precision and the best recall at precision >= 0.8, one threshold (distinct score) at a time."""
    keep = w > 0
    y, p, w = y[keep], p[keep], w[keep]
    total = float((w * y).sum())
    ap, best, recall_before = 0.0, 0.0, 0.0
    for t in np.unique(p)[::-1]:
        flagged = p >= t
        tp, alerts = float((w * (y & flagged)).sum()), float((w * flagged).sum())
        precision, recall = tp / alerts, tp / total
        ap += (recall - recall_before) * precision
        recall_before = recall
        if precision >= min_precision:
            best = max(best, recall)
    return ap, best


def _check_ranking(y: np.ndarray, p: np.ndarray, units: np.ndarray, seed: int = 0) -> None:
    n_units, inverse = iv.unit_index(units)
    counts = iv.resample_counts(n_units, iv.N_BOOT, seed)
    fast = iv.binary_ranking(y, p, inverse)(counts)
    assert set(fast) == {"auroc", "auprc", "rp80"} and all(v.shape == (iv.N_BOOT,) for v in fast.values())
    for r in range(N_CHECKED):
        w = counts[r, inverse]
        exact = _exact_auroc(y, p, w)
        assert fast["auroc"][r] == exact or (np.isnan(exact) and np.isnan(fast["auroc"][r])), r
        has_both = (w[y] > 0).any() and (w[~y] > 0).any()
        if not has_both:
            continue
        assert fast["auroc"][r] == pytest.approx(roc_auc_score(y, p, sample_weight=w), abs=1e-12)
        ap, rp = _direct_ap_rp(y, p, w)
        assert fast["auprc"][r] == pytest.approx(ap, abs=1e-12)
        assert fast["auprc"][r] == pytest.approx(average_precision_score(y, p, sample_weight=w), abs=1e-12)
        assert fast["rp80"][r] == pytest.approx(rp, abs=1e-12)
    # the point estimate is the split itself
    assert iv.point(iv.binary_auroc_stat(y, p, inverse), n_units) == _exact_auroc(y, p, np.ones(len(y)))


@pytest.fixture(scope="module")
def demo_runs(demo_db: Path, tmp_path_factory) -> tuple[Path, dict[str, str]]:  # noqa: F811
    """Real mortality runs recorded on the demo, each analysed as the writer does (intervals, comparisons, trust):
    a 1-epoch GRU first (no reference yet), then the two reference candidates, so the reference changes under it."""
    import shutil

    db = tmp_path_factory.mktemp("exact") / "demo.duckdb"
    shutil.copy(demo_db, db)
    task = get_task("mortality")
    runs = {"gru": train_in_process(db, task, "gru", 0, {"epochs": 1}, dataset=DEMO, device="cpu")}
    runs |= {m: train_in_process(db, task, m, dataset=DEMO) for m in ("most_frequent", "logreg")}
    return db, runs


@pytest.fixture(scope="module")
def demo_data(demo_runs) -> dict:
    """Each demo run's stored predictions (`load_run_data`), read once for the tests that only read them."""
    db, runs = demo_runs
    with open_warehouse(db, read_only=True) as con:
        return {m: load_run_data(con, r) for m, r in runs.items()}


def test_ranking_metrics_equal_their_per_resample_references_on_demo_runs(demo_data) -> None:
    data = demo_data
    for model, d in data.items():
        y, p = d.arrays["y"], d.arrays["p"]
        assert y.any() and (~y).any(), model
        _check_ranking(y, p, d.units)
    assert len(np.unique(data["most_frequent"].arrays["p"])) == 1  # one tie group: every pair ties


def test_ranking_metrics_with_many_ties_and_patients_with_several_samples() -> None:
    rng = np.random.default_rng(7)
    units = np.repeat(np.arange(400), rng.integers(1, 4, 400))
    y = rng.random(len(units)) < 0.25
    p = np.round(np.clip(0.3 * y + rng.normal(0.35, 0.2, len(units)), 0, 1), 1)  # ~11 distinct scores
    _check_ranking(y, p, units, seed=3)
    # NaN scores sort last both ways, each its own group (NaN != NaN): above every score for AUROC (ascending),
    # below every score for AUPRC/RP80 (descending), in sample order; the references give them such places
    p_nan = p.copy()
    p_nan[:5] = np.nan
    above, below = p.copy(), p.copy()
    above[:5], below[:5] = 2.0 + np.arange(5), -1.0 - np.arange(5)
    n_units, inverse = iv.unit_index(units)
    counts = iv.resample_counts(n_units, 50, 1)
    fast = iv.binary_ranking(y, p_nan, inverse)(counts)
    for r in range(20):
        w = counts[r, inverse]
        assert fast["auroc"][r] == _exact_auroc(y, above, w)
        ap, rp = _direct_ap_rp(y, below, w)
        assert fast["auprc"][r] == pytest.approx(ap, abs=1e-12) and fast["rp80"][r] == pytest.approx(rp, abs=1e-12)


def test_ranking_metrics_are_exact_in_float64_too(monkeypatch) -> None:
    """The weights' cumulative sums run in float32 while they stay below 2**24 (exact), else in float64; a split too
    large for float32 (forced here) gives the same values."""
    rng = np.random.default_rng(11)
    units = np.repeat(np.arange(300), rng.integers(1, 3, 300))
    y = rng.random(len(units)) < 0.3
    p = np.round(np.clip(0.3 * y + rng.normal(0.35, 0.2, len(units)), 0, 1), 2)
    n_units, inverse = iv.unit_index(units)
    counts = iv.resample_counts(n_units, 200, 5)
    as_float32 = iv.binary_ranking(y, p, inverse)(counts)
    monkeypatch.setattr(iv, "FLOAT32_EXACT", 0)
    as_float64 = iv.binary_ranking(y, p, inverse)(counts)
    for metric, values in as_float32.items():
        assert np.array_equal(values, as_float64[metric], equal_nan=True), metric
    _check_ranking(y, p, units, seed=5)


def _newton_as_expressions(x, n, s, weights, iters=30, tol=1e-8):
    """calibration.fit_logistic as it read before it wrote into buffers (the reference for bit-identity)."""
    k = weights.shape[0]
    a, b = np.zeros(k), np.ones(k)
    wn, ws = weights * n, weights * s
    for _ in range(iters):
        mu = cal.sigmoid(a[:, None] + b[:, None] * x)
        r = ws - wn * mu
        v = wn * mu * (1 - mu)
        g0, g1 = r.sum(axis=1), r @ x
        h00, h01, h11 = v.sum(axis=1), v @ x, v @ (x * x)
        det = h00 * h11 - h01 * h01
        with np.errstate(invalid="ignore", divide="ignore"):
            da = (h11 * g0 - h01 * g1) / det
            db = (h00 * g1 - h01 * g0) / det
        step = np.maximum(np.abs(da), np.abs(db))
        scale = np.where(step > 5.0, 5.0 / np.where(step > 0, step, 1.0), 1.0)
        a, b = a + scale * np.nan_to_num(da), b + scale * np.nan_to_num(db)
        if np.all(~np.isfinite(step) | (step < tol)):
            break
    bad = ~np.isfinite(a) | ~np.isfinite(b) | (np.abs(b) > 1e3) | ~np.isfinite(step) | (step > 1e-4)
    return np.where(bad, np.nan, a), np.where(bad, np.nan, b)


def test_the_slope_fit_is_bit_identical_to_its_plain_expressions(demo_data) -> None:
    d = demo_data["logreg"]
    rng = np.random.default_rng(1)
    z = rng.normal(-1.0, 1.3, 3000)
    cases = [(d.arrays["y"], d.arrays["p"], d.units),
             (rng.random(3000) < 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(-0.8 * z)), np.repeat(np.arange(1500), 2))]
    for y, p, units in cases:
        n_units, inverse = iv.unit_index(units)
        counts = iv.resample_counts(n_units, 200, 0)
        rows = cal.logistic_rows(y, p, inverse, n_units)
        w = counts[:, rows.unit]
        with np.errstate(all="ignore"):
            for got, want in zip(cal.fit_logistic(rows.x, rows.n, rows.s, w), _newton_as_expressions(rows.x, rows.n, rows.s, w)):
                assert np.array_equal(got, want, equal_nan=True)
    # multi-label: per-unit bin tables, one weighted fit per resample on the bins
    y2 = rng.random((600, 12)) < 0.2
    p2 = np.clip(0.5 * y2 + rng.random((600, 12)) * 0.5, 0.01, 0.99)
    n_units, inverse = iv.unit_index(np.repeat(np.arange(300), 2))
    counts = iv.resample_counts(n_units, 100, 2)
    rows = cal.logistic_rows(y2, p2, inverse, n_units)
    ones = np.ones((100, 1))
    got = cal.fit_logistic(rows.x, counts @ rows.n, counts @ rows.s, ones)
    want = _newton_as_expressions(rows.x, counts @ rows.n, counts @ rows.s, ones)
    assert all(np.array_equal(g, v, equal_nan=True) for g, v in zip(got, want))


def _figures_reference(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, counts: np.ndarray) -> dict:
    """calibration.calibration_figures as it read before it skipped the resamples of withheld intervals."""
    out = {}
    for metric, stat in cal.calibration_stats(y, p, inverse, counts.shape[1]).items():
        value, lo, hi = iv.interval(stat, counts)
        method = iv.CI_METHOD + (cal.SLOPE_BINNED if metric == "slope" and np.ndim(p) == 2 else "")
        if metric in iv.BIASED or iv.outside(value, lo, hi) or not np.isfinite(value):
            lo, hi, method = float("nan"), float("nan"), method + iv.WITHHELD
        out[metric] = (value, lo, hi, method)
    return out


def test_calibration_figures_equal_the_figures_computed_with_every_resample(demo_data) -> None:
    """A withheld interval (the ECE; a slope whose estimate is NaN, as for most_frequent's one probability) is no
    longer resampled; every stored figure stays bit for bit what it was."""
    for model, d in demo_data.items():
        y, p = d.arrays["y"].astype(np.float64), d.arrays["p"]
        n_units, inverse = iv.unit_index(d.units)
        counts = iv.resample_counts(n_units, iv.N_BOOT, 0)
        with np.errstate(all="ignore"):
            got, want = cal.calibration_figures(y, p, inverse, counts), _figures_reference(y, p, inverse, counts)
        assert got.keys() == want.keys()
        if model == "most_frequent":  # the skipped case is exercised: one probability for everyone has no slope
            assert len(np.unique(p)) == 1 and np.isnan(got["slope"][0]) and got["slope"][3].endswith(iv.WITHHELD)
        for metric in got:
            assert np.array_equal(np.array(got[metric][:3]), np.array(want[metric][:3]), equal_nan=True), (model, metric)
            assert got[metric][3] == want[metric][3]


def _rows(con, table: str, run_id: str) -> list[tuple]:
    return sorted(con.execute(f"SELECT * EXCLUDE (run_id) FROM {table} WHERE run_id = ?", [run_id]).fetchall(),
                  key=repr)


def test_a_reference_change_rewrites_the_verdicts_as_a_full_recompute_would(demo_runs, tmp_path: Path) -> None:
    """The GRU was recorded before any reference, then most_frequent and logreg each changed it: its per-group rows
    were rewritten by `refresh_verdicts` only; a full recompute of every trust table must find nothing to change."""
    import shutil

    from medtx.evaluation.trust import TABLES, write_trust

    db, runs = demo_runs
    full = tmp_path / "full.duckdb"
    shutil.copy(db, full)
    con_full, con = connect(full), connect(db, read_only=True)
    try:
        (reference,), = con.execute("SELECT DISTINCT reference_run_id FROM ml.comparisons WHERE run_id = ?",
                                    [runs["gru"]]).fetchall()
        assert reference in (runs["most_frequent"], runs["logreg"])
        named = {r for r, in con.execute("SELECT DISTINCT reference_run_id FROM ml.subgroups WHERE run_id = ?",
                                         [runs["gru"]]).fetchall()}
        assert named == {reference}, "the GRU's per-group verdicts name the reference its comparisons name"
        for run_id in runs.values():
            write_trust(con_full, run_id, compute_trust(con_full, run_id))
        for run_id in runs.values():
            for table in TABLES:
                assert _rows(con, table, run_id) == _rows(con_full, table, run_id), (run_id, table)
    finally:
        con.close()
        con_full.close()


def test_refresh_verdicts_rewrites_the_subgroup_rows_and_nothing_else(demo_runs, tmp_path: Path) -> None:
    import shutil

    db, runs = demo_runs
    copy = tmp_path / "w.duckdb"
    shutil.copy(db, copy)
    con = connect(copy)
    try:
        gru = runs["gru"]
        before = _rows(con, "ml.subgroups", gru)
        con.execute("UPDATE ml.subgroups SET reference_run_id = 'gone', verdict = NULL WHERE run_id = ?", [gru])
        con.execute("DELETE FROM ml.decision_curve WHERE run_id = ?", [gru])
        assert _rows(con, "ml.subgroups", gru) != before
        assert refresh_verdicts(con, gru)
        assert _rows(con, "ml.subgroups", gru) == before
        assert _rows(con, "ml.decision_curve", gru) == []  # left alone: it never reads the reference
        with pytest.raises(ValueError, match="no ml.runs row"):
            refresh_verdicts(con, "no-such-run")
    finally:
        con.close()


def test_the_cards_of_real_demo_runs_draw_no_conclusion_from_a_handful_of_patients(demo_runs) -> None:
    """Issue 42 on real runs: the demo's test split is a handful of patients, so every group is withheld, no map is
    fitted on its few validation admissions, and the summary's recommendation says no conclusion can be drawn."""
    from medtx.evaluation.card import build_card
    from medtx.evaluation.floors import MIN_VAL_ALERTS

    db, runs = demo_runs
    with open_warehouse(db, read_only=True) as con:
        for model, run_id in runs.items():
            card = build_card(con, run_id)
            assert card.data["summary"][-1]["finding"] == "Recommendation: no conclusion can be drawn", model
            assert all(g["auroc"] is None and g["withheld"] for g in card.data["subgroups"]), model
            assert all(r["status"] == "not_fitted" for r in card.data["recalibration"]), model
            # a target is unreachable, or chosen where validation had at least the floor's alerts (the demo's one
            # patient split leaves 15 validation admissions: a weak model can alert 10 of them)
            assert all(o["status"] == "unreachable" or o["validation_alerts"] >= MIN_VAL_ALERTS
                       for o in card.data["operating_points"]), model
            assert any(o["status"] == "unreachable" for o in card.data["operating_points"]), model
