"""Issue 36: subgroups, calibration, recalibration and operating points (medtx.evaluation.trust and its parts).

Every figure the warehouse stores is recomputed here by other code: each resample is materialised as the list of
drawn patients (same generator and seed as the production count matrix), their samples concatenated, and the
metric computed by sklearn / plain numpy on that resampled data set."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from medtx.evaluation import calibration as cal
from medtx.evaluation import operating as op
from medtx.evaluation.groups import ATTRIBUTES, age_band, ethnicity_group
from medtx.evaluation.subgroups import largest_gaps, subgroup_results
from medtx.evaluation.trust import analyse_trust, compute_trust
from medtx.evaluation.uncertainty import RunData
from medtx.metrics import intervals as iv
from medtx.store.db import connect
from medtx.training import records
from medtx.tasks import get_task

N_BOOT = iv.N_BOOT


# ----------------------------------------------------------------------------------------------- a crafted warehouse


def _cohort(n_patients: int = 240, seed: int = 0, shift: float = 0.0):
    """Patients with demographics, 1-3 admissions each, a true risk and a model's probability; `shift` adds to
    the log-odds of the TRUE risk of women (the model does not know it)."""
    rng = np.random.default_rng(seed)
    female = rng.random(n_patients) < 0.5
    base_age = rng.uniform(30, 95, n_patients)
    visits = rng.integers(1, 4, n_patients)
    subj = np.repeat(np.arange(n_patients), visits) + 1000
    n = len(subj)
    x = rng.normal(0, 1.2, n)
    z = -1.6 + x
    true_logit = z + shift * female[subj - 1000]
    y = rng.random(n) < 1 / (1 + np.exp(-true_logit))
    prob = 1 / (1 + np.exp(-(z + rng.normal(0, 0.3, n))))
    return {"female": female, "age": base_age, "subj": subj, "hadm": np.arange(n) + 50_000, "y": y, "prob": prob,
            "rng": rng, "z": z}


def _insert(con, table: str, frame: pl.DataFrame) -> None:
    con.register("_rows", frame.to_arrow())
    try:
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _rows")
    finally:
        con.unregister("_rows")


def _demographics(con, c: dict, dataset: str = "sim") -> None:
    n_pat = len(c["female"])
    t0 = datetime(2150, 1, 1)
    dob = [t0 - timedelta(days=float(a) * 365.25) for a in c["age"]]
    _insert(con, "raw.patients", pl.DataFrame({
        "dataset": [dataset] * n_pat, "subject_id": np.arange(n_pat) + 1000,
        "gender": np.where(c["female"], "F", "M"), "dob": dob}))
    rng = np.random.default_rng(1)
    n = len(c["subj"])
    _insert(con, "raw.admissions", pl.DataFrame({
        "dataset": [dataset] * n, "subject_id": c["subj"], "hadm_id": c["hadm"],
        "admittime": [t0 + timedelta(days=30 * i) for i in range(n)],
        "ethnicity": rng.choice(["WHITE", "BLACK/AFRICAN AMERICAN", "HISPANIC OR LATINO", "UNKNOWN/NOT SPECIFIED"], n),
        "insurance": rng.choice(["Medicare", "Private", "Medicaid"], n),
        "admission_type": rng.choice(["EMERGENCY", "ELECTIVE", "URGENT"], n, p=[0.8, 0.15, 0.05])}))


def _record(con, run_id: str, model: str, c: dict, prob: np.ndarray, val: tuple[np.ndarray, np.ndarray] | None,
            val_auprc: float, dataset: str = "sim") -> None:
    records.start_run(con, run_id, task="readmission", model=model, dataset=dataset, seed=0, config={})
    records.write_metrics(con, run_id, "val", [("auprc", "none", val_auprc, None, None)])
    records.write_metrics(con, run_id, "test", [("auprc", "none", 0.5, 0.01, 10)])
    n = len(c["y"])
    records.write_predictions(con, run_id, pl.DataFrame({
        "sample_id": c["hadm"].astype(str), "subject_id": c["subj"], "hadm_id": c["hadm"],
        "label": ["readmission_30d"] * n, "prob": prob, "y_true": c["y"], "predicted": prob >= 0.5}))
    if val is not None:
        yv, pv = val
        _insert(con, "ml.val_predictions", pl.DataFrame({
            "run_id": [run_id] * len(yv), "sample_id": [f"v{i}" for i in range(len(yv))],
            "subject_id": np.arange(len(yv)), "label": ["readmission_30d"] * len(yv), "prob": pv, "y_true": yv}))
    records.finish_run(con, run_id)


def _val(seed: int, n: int = 600, power: float = 1.0):
    rng = np.random.default_rng(seed)
    z = -1.6 + rng.normal(0, 1.2, n)
    y = rng.random(n) < 1 / (1 + np.exp(-z))
    return y, (1 / (1 + np.exp(-(z + rng.normal(0, 0.3, n))))) ** power


@pytest.fixture
def trust_db(tmp_db: Path) -> Path:
    c = _cohort()
    con = connect(tmp_db)
    try:
        _demographics(con, c)
        ref_prob = np.clip(c["prob"] + np.random.default_rng(3).normal(0, 0.15, len(c["y"])), 0.001, 0.999)
        _record(con, "ref", "logreg", c, ref_prob, _val(5), val_auprc=0.5)
        _record(con, "run", "transformer", c, c["prob"], _val(6), val_auprc=0.6)
    finally:
        con.close()
    return tmp_db


# ----------------------------------------------------------------------------------------------- independent code


def _draws(n_units: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """The drawn unit indices of each resample (the production count matrix counts these)."""
    return np.random.default_rng(seed).integers(0, n_units, (n_boot, n_units))


def _resampled(frame: pl.DataFrame, draws_row: np.ndarray, patients: np.ndarray) -> pl.DataFrame:
    """The resampled data set: each drawn patient's rows, once per draw."""
    chosen = pl.DataFrame({"subject_id": patients[draws_row]})
    return chosen.join(frame, on="subject_id", how="inner", maintain_order="left")


def _pct(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return tuple(np.percentile(v, [2.5, 97.5]))


def _warehouse_frame(con, run_id: str) -> tuple[pl.DataFrame, np.ndarray]:
    frame = con.sql(
        "SELECT p.subject_id, p.hadm_id, p.prob, p.y_true, pt.gender, "
        "date_diff('day', pt.dob, a.admittime) / 365.25 AS age "
        "FROM ml.predictions p JOIN raw.admissions a ON a.hadm_id = p.hadm_id "
        "JOIN raw.patients pt ON pt.subject_id = a.subject_id WHERE p.run_id = ? ORDER BY p.sample_id",
        params=[run_id]).pl()
    patients = np.unique(frame["subject_id"].to_numpy())
    return frame, patients


def test_subgroup_intervals_and_verdicts_agree_with_an_independent_bootstrap(trust_db: Path):
    con = connect(trust_db)
    try:
        frame, patients = _warehouse_frame(con, "run")
        ref = con.sql("SELECT subject_id, hadm_id, prob AS ref_prob FROM ml.predictions WHERE run_id = 'ref'").pl()
        frame = frame.join(ref.select("hadm_id", "ref_prob"), on="hadm_id")
        draws = _draws(len(patients))
        stored = {(a, g, m): row for a, g, m, *row in con.sql(
            "SELECT attribute, grp, metric, n_patients, n_samples, n_positives, value, ci_low, ci_high, "
            "diff, diff_ci_low, diff_ci_high, verdict, too_small FROM ml.subgroups WHERE run_id = 'run'").fetchall()}
        for group, condition in (("female", pl.col("gender") == "F"), ("male", pl.col("gender") == "M"),
                                 (">=80", pl.col("age") >= 80)):
            attribute = "age_band" if group == ">=80" else "sex"
            sub = frame.filter(condition)
            auc, auprc, dauc = [], [], []
            for b in range(N_BOOT):
                r = _resampled(sub, draws[b], patients)
                y, p, q = r["y_true"].to_numpy(), r["prob"].to_numpy(), r["ref_prob"].to_numpy()
                if 0 < y.sum() < len(y):
                    auc.append(roc_auc_score(y, p))
                    auprc.append(average_precision_score(y, p))
                    dauc.append(average_precision_score(y, p) - average_precision_score(y, q))
            n_pat, n_samp, n_pos, value, lo, hi, diff, dlo, dhi, verdict, small = stored[(attribute, group, "auprc")]
            assert (n_pat, n_samp, n_pos) == (sub["subject_id"].n_unique(), sub.height, int(sub["y_true"].sum()))
            assert not small
            assert value == pytest.approx(average_precision_score(sub["y_true"], sub["prob"]))
            assert (lo, hi) == pytest.approx(_pct(auprc), abs=1e-9)
            assert (dlo, dhi) == pytest.approx(_pct(dauc), abs=1e-9)
            assert verdict == ("better" if dlo > 0 else "worse" if dhi < 0 else "no_detectable_difference")
            _, _, _, value, lo, hi, *_ = stored[(attribute, group, "auroc")]
            assert value == pytest.approx(roc_auc_score(sub["y_true"], sub["prob"]))
            assert (lo, hi) == pytest.approx(_pct(auc), abs=1e-9)
    finally:
        con.close()


def test_a_group_under_30_patients_is_too_small_and_shows_no_number(trust_db: Path):
    con = connect(trust_db)
    try:
        rows = con.sql("SELECT attribute, grp, n_patients, too_small, value, ci_low, verdict FROM ml.subgroups "
                       "WHERE run_id = 'run' AND metric = 'auprc'").fetchall()
        small = [r for r in rows if r[2] < 30]
        assert small, "the crafted cohort has small groups (urgent admissions)"
        assert all(r[3] and r[4] is None and r[5] is None and r[6] == "too_small" for r in small)
        assert all(not r[3] and r[4] is not None for r in rows if r[2] >= 30)
        gaps = con.sql("SELECT group_high, group_low FROM ml.subgroup_gaps WHERE run_id = 'run'").fetchall()
        named = {g for pair in gaps for g in pair}
        assert not named & {r[1] for r in small} - {r[1] for r in rows if r[2] >= 30}
        assert "unknown" not in named  # 'unknown' is reported, never part of a gap
    finally:
        con.close()


def test_operating_points_agree_with_an_independent_bootstrap(trust_db: Path):
    con = connect(trust_db)
    try:
        val = con.sql("SELECT prob, y_true FROM ml.val_predictions WHERE run_id = 'run'").pl()
        pv, yv = val["prob"].to_numpy(), val["y_true"].to_numpy()
        # sensitivity 0.80 on validation: the highest threshold catching >= 80% of validation positives
        ranked = np.sort(pv[yv])[::-1]
        t80 = ranked[int(np.ceil(0.8 * yv.sum())) - 1]
        t10 = np.quantile(pv, 0.9)
        stored = {(t, m): (th, v, lo, hi) for t, th, m, v, lo, hi in con.sql(
            "SELECT target, threshold, metric, value, ci_low, ci_high FROM ml.operating_points WHERE run_id = 'run' "
            "AND target <> 'grid'").fetchall()}
        assert stored[("sensitivity_0.80", "sensitivity")][0] == pytest.approx(t80)
        assert stored[("top_10pct", "alerts_per_100")][0] == pytest.approx(t10)
        frame = con.sql("SELECT subject_id, prob, y_true FROM ml.predictions WHERE run_id = 'run'").pl()
        patients = np.unique(frame["subject_id"].to_numpy())
        draws = _draws(len(patients))

        def figures(f: pl.DataFrame, t: float) -> dict[str, float]:
            flag, y = f["prob"].to_numpy() >= t, f["y_true"].to_numpy()
            tp, fp = (flag & y).sum(), (flag & ~y).sum()
            fn, tn = (~flag & y).sum(), (~flag & ~y).sum()
            div = lambda a, b: a / b if b else float("nan")  # noqa: E731
            return {"sensitivity": div(tp, tp + fn), "specificity": div(tn, tn + fp), "ppv": div(tp, tp + fp),
                    "npv": div(tn, tn + fn), "alerts_per_100": 100 * (tp + fp) / len(y), "nne": div(tp + fp, tp)}

        for target in ("sensitivity_0.80", "top_10pct"):
            t = stored[(target, "sensitivity")][0]
            point = figures(frame, t)
            boots = [figures(_resampled(frame, draws[b], patients), t) for b in range(N_BOOT)]
            for metric in op.FIGURES:
                _, v, lo, hi = stored[(target, metric)]
                assert v == pytest.approx(point[metric])
                assert (lo, hi) == pytest.approx(_pct([x[metric] for x in boots]), abs=1e-9), (target, metric)
        # the decision curve at 0.2: net benefit = TP/n - FP/n * 0.25
        (nb, treat_all), = con.sql("SELECT net_benefit, treat_all FROM ml.decision_curve WHERE run_id = 'run' "
                                   "AND threshold = 0.2").fetchall()
        flag, y = frame["prob"].to_numpy() >= 0.2, frame["y_true"].to_numpy()
        assert nb == pytest.approx(((flag & y).sum() - 0.25 * (flag & ~y).sum()) / len(y))
        assert treat_all == pytest.approx(y.mean() - (1 - y.mean()) * 0.25)
    finally:
        con.close()


def test_calibration_figures_agree_with_an_independent_fit():
    from sklearn.linear_model import LogisticRegression

    c = _cohort(300, seed=4)
    _, inverse = np.unique(c["subj"], return_inverse=True)
    n_units = len(np.unique(c["subj"]))
    counts = iv.resample_counts(n_units, 200)
    p = c["prob"] ** 1.4  # under-predicting and too extreme
    figures = cal.calibration_figures(c["y"], p, inverse, counts)
    x = cal.logit(p).reshape(-1, 1)
    fit = LogisticRegression(C=1e12, tol=1e-10, max_iter=1000).fit(x, c["y"])
    assert figures["slope"][0] == pytest.approx(fit.coef_[0, 0], abs=1e-4)
    assert figures["citl"][0] == pytest.approx(c["y"].mean() - p.mean())
    draws = _draws(n_units, 200)
    frame = pl.DataFrame({"subject_id": inverse, "y": c["y"], "x": x[:, 0], "p": p})
    slopes = []
    for b in range(200):
        r = _resampled(frame, draws[b], np.arange(n_units))
        slopes.append(LogisticRegression(C=1e12, tol=1e-10, max_iter=1000).fit(
            r["x"].to_numpy().reshape(-1, 1), r["y"].to_numpy()).coef_[0, 0])
    assert figures["slope"][1:3] == pytest.approx(_pct(slopes), abs=2e-3)
    assert figures["ece"][1] != figures["ece"][1]  # NaN: the ECE is stored without an interval


def test_multilabel_binned_slope_is_close_to_the_exact_fit():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(2)
    p = rng.beta(1, 8, (800, 30))
    y = rng.random(p.shape) < p ** 1.3
    exact = LogisticRegression(C=1e12, max_iter=1000).fit(cal.logit(p).reshape(-1, 1), y.ravel()).coef_[0, 0]
    slope = cal.slope_stat(cal.logistic_rows(y, p, np.arange(800), 800))(np.ones((1, 800)))[0]
    assert slope == pytest.approx(exact, rel=0.02)


# ----------------------------------------------------------------------------------------------- recalibration


def test_recalibration_never_reads_test_labels(trust_db: Path):
    """Flip every test label: the fitted maps stay the same (they saw validation only) while the test figures
    move; change the validation labels instead and the maps move (the check can fail)."""
    con = connect(trust_db)
    try:
        def fitted():
            return dict(con.sql("SELECT method || ':' || metric, params FROM ml.calibration WHERE run_id = 'run' "
                                "AND method <> 'none'").fetchall())

        def thresholds():
            return con.sql("SELECT target, threshold FROM ml.operating_points WHERE run_id = 'run' AND target <> "
                           "'grid' AND metric = 'ppv' ORDER BY target").fetchall()

        before, before_t = fitted(), thresholds()
        assert {k.split(":")[0] for k in before} == {"platt", "isotonic"}
        (brier_before,), = con.sql("SELECT value FROM ml.calibration WHERE run_id = 'run' AND method = 'platt' "
                                   "AND metric = 'brier'").fetchall()
        con.execute("UPDATE ml.predictions SET y_true = NOT y_true WHERE run_id = 'run'")
        analyse_trust(con, "run")
        (brier_after,), = con.sql("SELECT value FROM ml.calibration WHERE run_id = 'run' AND method = 'platt' "
                                  "AND metric = 'brier'").fetchall()
        assert brier_after != pytest.approx(brier_before)  # test labels do reach the test figures
        assert fitted() == before and thresholds() == before_t
        con.execute("UPDATE ml.val_predictions SET y_true = NOT y_true WHERE run_id = 'run' AND prob > 0.3")
        analyse_trust(con, "run")
        assert fitted() != before and thresholds() != before_t
    finally:
        con.close()


@pytest.mark.parametrize("power", [2.5, 0.4])
def test_recalibration_lowers_the_ece_of_a_miscalibrated_binary_model(power: float):
    yv, pv = _val(11, 3000, power)
    yt, pt = _val(12, 3000, power)
    fitted, skipped = cal.fit_recalibrators("binary", yv, pv)
    assert not skipped
    inverse = np.arange(len(yt))
    ece = lambda p: iv.point(iv.ece_stat(yt, p, inverse, len(yt)), len(yt))  # noqa: E731
    before = ece(pt)
    assert before > 0.05
    for r in fitted:
        assert ece(r.apply(pt)) < before / 2, r.method


def test_temperature_lowers_the_ece_of_an_overconfident_multilabel_model():
    rng = np.random.default_rng(8)

    def split(n):
        z = rng.normal(-2.5, 1.0, (n, 25))
        y = rng.random(z.shape) < 1 / (1 + np.exp(-z))
        return y, 1 / (1 + np.exp(-2.5 * z))  # logits 2.5x too large

    (yv, pv), (yt, pt) = split(400), split(400)
    (r,), _ = cal.fit_recalibrators("multilabel", yv, pv)
    assert r.params["temperature"] == pytest.approx(2.5, rel=0.15)
    inverse = np.arange(400)
    ece = lambda p: iv.point(iv.ece_stat(yt, p, inverse, 400), 400)  # noqa: E731
    assert ece(r.apply(pt)) < ece(pt) / 2


def test_calibration_rows_before_and_after_are_stored(trust_db: Path):
    con = connect(trust_db)
    try:
        rows = con.sql("SELECT method, metric, value, ci_low, ci_high, ci_method, n_fit FROM ml.calibration "
                       "WHERE run_id = 'run' ORDER BY method, metric").fetchall()
        methods = {r[0] for r in rows}
        assert methods == {"none", "platt", "isotonic"}
        for r in rows:
            if r[1] == "ece":
                assert r[3] is None and r[5].endswith(iv.WITHHELD)
            elif r[1] in ("citl", "slope", "brier", "auroc"):
                assert r[3] is not None and r[3] <= r[2] <= r[4], r
        assert {r[6] for r in rows if r[0] != "none"} == {600}  # fitted on the 600 validation samples
        rel = con.sql("SELECT method, count(*), sum(n) FROM ml.reliability WHERE run_id = 'run' GROUP BY method "
                      "ORDER BY method").fetchall()
        n_test = con.sql("SELECT count(*) FROM ml.predictions WHERE run_id = 'run'").fetchall()[0][0]
        assert all(total == n_test for _, _, total in rel) and len(rel) == 3
    finally:
        con.close()


# ----------------------------------------------------------------------------------------------- gaps


def _sim_groups(c: dict) -> dict[str, np.ndarray]:
    subj = c["subj"] - 1000
    n = len(subj)
    return {"sex": np.where(c["female"][subj], "female", "male").astype(object),
            "age_band": age_band(c["age"][subj]).astype(object),
            **{a: np.full(n, "unknown", dtype=object) for a in ATTRIBUTES if a not in ("sex", "age_band")}}


def _gaps(c: dict, prob: np.ndarray, metrics, n_boot: int = N_BOOT, seed: int = 0):
    n_units, inverse = iv.unit_index(c["subj"])
    counts = iv.resample_counts(n_units, n_boot, seed)
    data = RunData(c["hadm"].astype(str), c["subj"], {"y": c["y"], "p": prob}, "binary")
    attrs = ("sex", "age_band")
    _, boot = subgroup_results(data, None, _sim_groups(c), metrics, counts, inverse, attributes=attrs)
    return largest_gaps(boot, metrics, attributes=attrs), boot


def test_a_planted_risk_shift_is_detected_and_a_model_that_knows_it_shows_none():
    c = _cohort(1200, seed=21, shift=1.2)
    gaps, _ = _gaps(c, c["prob"], [("citl", "none")])
    sex = next(g for g in gaps if g.attribute == "sex")
    assert sex.detected and (sex.group_high, sex.group_low) == ("female", "male") and sex.largest
    assert not next(g for g in gaps if g.attribute == "age_band").detected
    oracle = 1 / (1 + np.exp(-(c["z"] + 1.2 * c["female"][c["subj"] - 1000])))
    gaps, _ = _gaps(c, oracle, [("citl", "none")])
    assert not any(g.detected for g in gaps)


def test_false_gaps_stay_at_the_nominal_rate_over_120_null_simulations():
    """No group differs: a gap (any attribute, AUROC or calibration-in-the-large) is reported in <= 5% of runs.
    The naive interval of the largest pair (not simultaneous) would report one far more often."""
    n_sims, false_simultaneous, false_naive = 120, 0, 0
    for seed in range(n_sims):
        c = _cohort(300, seed=1000 + seed)
        metrics = [("auroc", "none"), ("citl", "none")]
        gaps, boot = _gaps(c, c["prob"], metrics, seed=seed)
        false_simultaneous += any(g.detected for g in gaps)
        naive = False
        for g in gaps:
            hi = boot[(g.attribute, g.group_high, g.metric, g.averaging)][1]
            lo = boot[(g.attribute, g.group_low, g.metric, g.averaging)][1]
            naive |= _pct(hi - lo)[0] > 0
        false_naive += naive
    assert false_simultaneous / n_sims <= iv.ALPHA, (false_simultaneous, false_naive)
    assert false_naive / n_sims > 2 * iv.ALPHA  # the selection effect the simultaneous interval corrects


def test_groupings_are_stated_once():
    assert list(age_band(np.array([49.9, 50, 64.99, 65, 79.9, 80, 300, np.nan]))) == [
        "<50", "50-64", "50-64", "65-79", "65-79", ">=80", ">=80", "unknown"]
    assert list(ethnicity_group(np.array(["WHITE - RUSSIAN", "BLACK/HAITIAN", "HISPANIC/LATINO - PUERTO RICAN",
                                          "ASIAN - CHINESE", "UNKNOWN/NOT SPECIFIED", "MULTI RACE ETHNICITY", None],
                                         dtype=object))) == [
        "white", "black", "hispanic", "asian", "unknown", "other", "unknown"]


def test_runs_other_than_binary_or_multilabel_ehr_get_no_trust_rows(tmp_db: Path):
    con = connect(tmp_db)
    try:
        records.start_run(con, "spec", task="specialty", model="majority", dataset="mtsamples", seed=0, config={})
        assert compute_trust(con, "spec") is None
    finally:
        con.close()


# ----------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_shift_planted_in_a_synthetic_cohort_is_found_where_it_was_planted(tmp_path: Path):
    """Generate 6,000 synthetic patients whose women have +2.0 log-odds of 30-day readmission, build the
    readmission task, fit logreg (codes only: blind to sex) and the oracle (knows the shift): logreg's
    calibration-in-the-large gap between women and men is detected, the oracle's is not."""
    from medtx.codes import map_codes
    from medtx.ingest import ingest_mimic3
    from medtx.tasks.build import build_samples
    from medtx.synth import generate_mimic3
    from medtx.synth.oracle import load_oracle
    from medtx.synth.shift import RiskShift
    from medtx.pipeline.steps import train_in_process
    from tests.conftest import DATA

    src, db = tmp_path / "synth", tmp_path / "w.duckdb"
    summary = generate_mimic3(src, 6000, seed=3, risk_shift=RiskShift.parse("sex=female:2.0"))
    assert summary.risk_shift == "sex=female:+2" and "planted subgroup shift" in (src / "README.md").read_text()
    ingest_mimic3(db, src, "synth_shift", tmp_path / "cache")
    con = connect(db)
    try:
        load_oracle(con, src, "synth_shift")
        map_codes(con, DATA, ["synth_shift"])
        build_samples(con, DATA, ["readmission"], ["synth_shift"])
        # the oracle knows the shift: its mean risk for women's stays is far above men's
        (women, men), = con.sql(
            "SELECT avg(o.prob) FILTER (WHERE p.gender = 'F'), avg(o.prob) FILTER (WHERE p.gender = 'M') "
            "FROM raw.synth_oracle_readmission o JOIN raw.admissions a USING (dataset, hadm_id) "
            "JOIN raw.patients p USING (dataset, subject_id) WHERE o.dataset = 'synth_shift'").fetchall()
        assert women > 1.4 * men
    finally:
        con.close()
    runs = {m: train_in_process(db, get_task("readmission"), m, dataset="synth_shift") for m in ("logreg", "oracle")}
    con = connect(db, read_only=True)
    try:
        gaps = {(m, a, metric): (hi, lo, detected) for m, run in runs.items()
                for a, metric, hi, lo, detected in con.execute(
                    "SELECT attribute, metric, group_high, group_low, detected FROM ml.subgroup_gaps WHERE run_id = ?",
                    [run]).fetchall()}
        assert gaps[("logreg", "sex", "citl")] == ("female", "male", True)
        assert not gaps[("oracle", "sex", "citl")][2]
        n_val = con.execute("SELECT count(*) FROM ml.val_predictions WHERE run_id = ?", [runs["logreg"]]).fetchall()
        assert n_val[0][0] > 0
    finally:
        con.close()


# ----------------------------------------------------------------------------------------------- the model card


def test_the_model_card_has_every_section_and_renders_offline(trust_db: Path, tmp_path: Path):
    import re
    from html.parser import HTMLParser

    from medtx.evaluation.card import SECTIONS, render

    con = connect(trust_db, read_only=True)
    try:
        page, markdown = render(con, "run")
        with pytest.raises(ValueError, match="not in this warehouse"):
            render(con, "nope")
    finally:
        con.close()
    ids = re.findall(r"<section id='([^']+)'>", page)
    assert tuple(ids) == SECTIONS
    # self-contained: no script, no external stylesheet, image or font; figures are inline SVG
    assert not re.search(r"<script|<link|src=['\"]https?:|url\(", page)
    # forest plot, reliability curve, decision curve; standard figures: ROC, PR, distribution, smoothed
    # calibration, age x sex (one panel per sex)
    assert page.count("<svg") == 9
    sections = dict(zip(ids, re.split(r"<section id='[^']+'>", page)[1:], strict=True))
    assert "female" in sections["subgroups"] and "too small" in sections["subgroups"]
    assert "aria-label='forest plot of auroc'" in sections["subgroups"]
    assert "platt" in sections["calibration"] and "isotonic" in sections["calibration"]
    assert "sensitivity_0.80" in sections["operating-points"] and "net benefit" in sections["operating-points"]
    assert "auprc" in sections["headline"]
    assert re.search(r"(better|worse|no_detectable_difference) \([+-]", sections["headline"])  # verdict + diff
    assert "30-day" in sections["clock"] or "discharge" in sections["clock"]
    assert "Not collapsed" in sections["flags"]
    assert "leakage" in sections["leakage"].lower()

    class Strict(HTMLParser):
        def error(self, message):  # pragma: no cover - html.parser calls it only in old versions
            raise AssertionError(message)

    Strict().feed(page)
    for title in ("Data and lineage", "Subgroups", "Calibration", "Operating points", "Limitations"):
        assert f"## {title}" in markdown


def test_medtx_report_writes_html_and_markdown_and_refuses_an_unknown_run(trust_db: Path, tmp_path: Path):
    from typer.testing import CliRunner

    from flows.cli import app

    out = tmp_path / "cards" / "run.html"
    result = CliRunner().invoke(app, ["report", "--run", "run", "--out", str(out), "--db", str(trust_db)])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("<!DOCTYPE html>") and out.with_suffix(".md").exists()
    bad = CliRunner().invoke(app, ["report", "--run", "nope", "--db", str(trust_db)])
    assert bad.exit_code == 2 and "not in this warehouse" in bad.output


def test_a_bad_risk_shift_is_one_line_and_exit_2(tmp_path: Path):
    from typer.testing import CliRunner

    from flows.cli import app
    from medtx.synth.shift import RiskShift

    for text, message in (("sex=woman:1", "sex group must be one of"), ("sex=female", "expected ATTRIBUTE=GROUP"),
                          ("height=tall:1", "attribute must be one of"), ("sex=female:x", "is not a number"),
                          ("age_band=>=80:9", "within [-5, 5]")):
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            RiskShift.parse(text)
    result = CliRunner().invoke(app, ["synth", "mimic3", "--patients", "5", "--out", str(tmp_path / "s"),
                                      "--risk-shift", "sex=woman:1"])
    assert result.exit_code == 2 and "--risk-shift" in result.output and not (tmp_path / "s").exists()
    assert RiskShift.parse("age_band=>=80:-0.8").members(np.array([True]), np.array([85.0])).tolist() == [True]


def test_every_subgroup_interval_agrees_with_sklearn_on_the_same_draws(trust_db: Path):
    """Every group of every attribute that is not too small: its AUROC interval equals sklearn's weighted AUROC
    over the same 1,000 patient draws (weights = how often each patient was drawn; groups read by SQL here)."""
    from medtx.evaluation.groups import ethnicity_group

    con = connect(trust_db)
    try:
        frame = con.sql(
            "SELECT p.subject_id, p.prob, p.y_true, pt.gender, date_diff('day', pt.dob, a.admittime) / 365.25 AS age, "
            "a.ethnicity, lower(a.insurance) AS insurance, lower(a.admission_type) AS admission_type "
            "FROM ml.predictions p JOIN raw.admissions a ON a.hadm_id = p.hadm_id "
            "JOIN raw.patients pt ON pt.subject_id = a.subject_id WHERE p.run_id = 'run' ORDER BY p.sample_id").pl()
        stored = {(a, g): row for a, g, *row in con.sql(
            "SELECT attribute, grp, n_patients, too_small, ci_low, ci_high FROM ml.subgroups "
            "WHERE run_id = 'run' AND metric = 'auroc'").fetchall()}
    finally:
        con.close()
    patients, unit = np.unique(frame["subject_id"].to_numpy(), return_inverse=True)
    draws = _draws(len(patients))
    weights = np.stack([np.bincount(d, minlength=len(patients)) for d in draws])[:, unit]  # (boot, samples)
    labels = {"sex": np.where(frame["gender"].to_numpy() == "F", "female", "male"),
              "age_band": age_band(frame["age"].to_numpy()),
              "ethnicity": ethnicity_group(frame["ethnicity"].to_numpy()),
              "insurance": frame["insurance"].to_numpy(), "admission_type": frame["admission_type"].to_numpy()}
    y, p = frame["y_true"].to_numpy(), frame["prob"].to_numpy()
    checked = 0
    for attribute, values in labels.items():
        for group in np.unique(values.astype(str)):
            members = values.astype(str) == group
            n_pat = len(np.unique(unit[members]))
            _, too_small, lo, hi = stored[(attribute, group)]
            assert stored[(attribute, group)][0] == n_pat and too_small == (n_pat < iv.MIN_UNITS)
            if too_small:
                assert lo is None and hi is None
                continue
            aucs = []
            for w in weights[:, members]:
                yy, pp, ww = y[members][w > 0], p[members][w > 0], w[w > 0]
                if 0 < yy.sum() < len(yy):
                    aucs.append(roc_auc_score(yy, pp, sample_weight=ww))
            assert (lo, hi) == pytest.approx(_pct(aucs), abs=1e-9), (attribute, group)
            checked += 1
    assert checked >= 10
