"""Patient-bootstrap intervals and paired comparisons (issue 14).

The vectorised statistics (count matrix x per-unit sums, weighted ranking metrics) are checked against an
independent naive loop that materialises every resampled dataset and scores it with scikit-learn; the interval
procedure itself is checked for coverage over simulated datasets; the warehouse part runs on a real DuckDB file.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

from medtx.evaluation.comparisons import compare_runs, reference_run
from medtx.store.db import connect
from medtx.metrics import intervals as iv
from medtx.training import records
from medtx.evaluation.uncertainty import record_intervals
from medtx.tasks import get_task


def _naive_interval(units, per_sample_score, n_units, draws):
    """Independent implementation: for each resample, build the resampled dataset explicitly (a patient drawn
    twice contributes all its samples twice), score it, and take the 2.5/97.5 percentiles."""
    members = [np.flatnonzero(units == u) for u in range(n_units)]
    values = []
    for draw in draws:
        idx = np.concatenate([members[u] for u in draw])
        values.append(per_sample_score(idx))
    return np.percentile(values, [2.5, 97.5])


def _constructed_split(seed: int = 3, n_units: int = 40):
    rng = np.random.default_rng(seed)
    visits = rng.integers(1, 5, n_units)  # 1-4 visits per patient
    units = np.repeat(np.arange(n_units), visits)
    values = np.round(rng.random(len(units)), 2)  # known per-visit metric values
    y = rng.random(len(units)) < 0.35
    scores = np.round(np.clip(rng.normal(0.4 + 0.3 * y, 0.25), 0, 1), 1)  # coarse: many ties
    return units, values, y, scores


def _draws(n_units: int, n_boot: int, seed: int = 11) -> tuple[np.ndarray, np.ndarray]:
    draws = np.random.default_rng(seed).integers(0, n_units, (n_boot, n_units))
    counts = np.stack([np.bincount(d, minlength=n_units) for d in draws]).astype(np.float64)
    return draws, counts


def test_ci_matches_naive_loop_on_constructed_split():
    units, values, y, scores = _constructed_split()
    n_units, inverse = iv.unit_index(units)
    draws, counts = _draws(n_units, 300)
    cases = {
        "visit mean": (iv.mean_stat(values, inverse, n_units, "visit"), lambda idx: values[idx].mean()),
        "auroc": (iv.binary_auroc_stat(y, scores, inverse), lambda idx: roc_auc_score(y[idx], scores[idx])),
        "auprc": (iv.binary_ap_stat(y, scores, inverse), lambda idx: average_precision_score(y[idx], scores[idx])),
        "brier": (iv.mean_stat((scores - y) ** 2, inverse, n_units), lambda idx: np.mean((scores[idx] - y[idx]) ** 2)),
    }
    for name, (stat, naive) in cases.items():
        lo, hi = _naive_interval(units, naive, n_units, draws)
        assert iv.percentile_interval(stat(counts)) == pytest.approx((lo, hi), abs=1e-12), name
        assert iv.point(stat, n_units) == pytest.approx(naive(np.arange(len(units))), abs=1e-12), name
    # SafeDrug averaging: a patient drawn twice counts twice, each time with its own mean over visits.
    patient_means = np.array([values[units == u].mean() for u in range(n_units)])
    stat = iv.mean_stat(values, inverse, n_units, "patient")
    naive = np.percentile([patient_means[d].mean() for d in draws], [2.5, 97.5])
    assert iv.percentile_interval(stat(counts)) == pytest.approx(tuple(naive), abs=1e-12)
    assert iv.point(stat, n_units) == pytest.approx(patient_means.mean(), abs=1e-12)


def test_multiclass_and_ece_match_naive_loop():
    rng = np.random.default_rng(5)
    units = np.repeat(np.arange(35), 3)
    n_units, inverse = iv.unit_index(units)
    y = rng.integers(0, 4, len(units))
    pred = np.where(rng.random(len(units)) < 0.6, y, rng.integers(0, 5, len(units)))
    prob = rng.random(len(units))
    truth = rng.random(len(units)) < prob
    draws, counts = _draws(n_units, 200)

    def ece(idx):
        bins = np.minimum((prob[idx] * 15).astype(int), 14)
        return sum(abs(prob[idx][bins == b].sum() - truth[idx][bins == b].sum()) for b in range(15)) / len(idx)

    stats = iv.multiclass_stats(y, pred, 5, inverse, n_units)
    for stat, naive in ((stats["macro_f1"], lambda idx: f1_score(y[idx], pred[idx], labels=range(5),
                                                                  average="macro", zero_division=0)),
                        (stats["weighted_f1"], lambda idx: f1_score(y[idx], pred[idx], labels=range(5),
                                                                     average="weighted", zero_division=0)),
                        (iv.ece_stat(truth, prob, inverse, n_units), ece)):
        assert iv.percentile_interval(stat(counts)) == pytest.approx(
            tuple(_naive_interval(units, naive, n_units, draws)), abs=1e-12)


def test_resamples_are_with_replacement():
    counts = iv.resample_counts(50, 400, seed=1)
    assert counts.shape == (400, 50) and (counts.sum(axis=1) == 50).all()
    assert (counts > 1).any(axis=1).mean() > 0.99  # some patient drawn twice in (nearly) every resample
    assert np.array_equal(counts, iv.resample_counts(50, 400, seed=1))


def test_coverage_of_mean_type_metric():
    """200 simulated test splits (patients with 1-4 visits, Beta(2, 5) values, mean 2/7): the 95% interval
    of the visit-averaged metric covers the truth 90-99% of the time (vectorised: all splits at once)."""
    rng = np.random.default_rng(2024)
    n_sets, n_units, truth = 200, 150, 2 / 7
    covered = []
    counts = iv.resample_counts(n_units, 1000, seed=7)
    for _ in range(n_sets):
        visits = rng.integers(1, 5, n_units)
        units = np.repeat(np.arange(n_units), visits)
        values = rng.beta(2, 5, len(units))
        _, inverse = iv.unit_index(units)
        lo, hi = iv.percentile_interval(iv.mean_stat(values, inverse, n_units)(counts))
        covered.append(lo <= truth <= hi)
    assert 0.90 <= np.mean(covered) <= 0.99, np.mean(covered)


def test_run_against_itself_gives_zero_difference():
    units, values, y, scores = _constructed_split(n_units=60)
    n_units, inverse = iv.unit_index(units)
    counts = iv.resample_counts(n_units, 1000)
    for stat in (iv.mean_stat(values, inverse, n_units), iv.binary_auroc_stat(y, scores, inverse)):
        c = iv.paired_comparison(stat, stat, counts)
        assert (c.diff, c.ci_low, c.ci_high) == (0.0, 0.0, 0.0) and c.verdict == "no_detectable_difference"


def test_paired_verdicts_and_small_sample_guard():
    units, values, y, scores = _constructed_split(n_units=200)
    n_units, inverse = iv.unit_index(units)
    counts = iv.resample_counts(n_units, 1000)
    good, bad = iv.mean_stat(values + 0.1, inverse, n_units), iv.mean_stat(values, inverse, n_units)
    assert iv.paired_comparison(good, bad, counts).verdict == "better"
    worse = iv.paired_comparison(bad, good, counts)
    assert worse.verdict == "worse" and worse.diff == pytest.approx(-0.1) and worse.p_better == 0.0
    # Two patients: whatever the difference, no verdict.
    two = np.array([0, 0, 1])
    n2, inv2 = iv.unit_index(two)
    c = iv.paired_comparison(iv.mean_stat(np.array([0.9, 0.9, 0.9]), inv2, n2),
                             iv.mean_stat(np.array([0.1, 0.1, 0.1]), inv2, n2), iv.resample_counts(n2, 1000))
    assert c.verdict == "too_small" and c.n_units == 2


def test_empty_split_is_refused():
    with pytest.raises(ValueError, match="empty"):
        iv.unit_index(np.array([]))


# ----------------------------------------------------------------------------------------------- warehouse


def _record_binary_run(con, run_id: str, model: str, probs: np.ndarray, y: np.ndarray, subjects: np.ndarray,
                       val_auprc: float | None, config: dict | None = None) -> None:
    import polars as pl

    records.start_run(con, run_id, task="readmission", model=model, dataset="sim", seed=0, config=config or {})
    if val_auprc is not None:
        records.write_metrics(con, run_id, "val", [("auprc", "none", val_auprc, None, None)])
    records.write_metrics(con, run_id, "test", [("auprc", "none", 0.5, 0.01, 10), ("auroc", "none", 0.5, 0.01, 10)])
    records.write_predictions(con, run_id, pl.DataFrame({
        "sample_id": [str(i) for i in range(len(y))], "subject_id": subjects, "hadm_id": np.arange(len(y)),
        "label": ["readmission"] * len(y), "prob": probs, "y_true": y, "predicted": probs >= 0.5}))
    records.finish_run(con, run_id)


def _sim(n_patients: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    subjects = np.repeat(np.arange(n_patients), 2)
    y = rng.random(len(subjects)) < 0.3
    return rng, subjects, y


def test_warehouse_intervals_reference_on_validation_and_verdicts(tmp_db: Path):
    rng, subjects, y = _sim(80)
    noise = rng.random(len(y))
    con = connect(tmp_db)
    try:
        # logreg is better on TEST but most_frequent is better on VALIDATION: the reference is most_frequent.
        _record_binary_run(con, "lr", "logreg", 0.5 * noise + 0.4 * y, y, subjects, val_auprc=0.60)
        _record_binary_run(con, "mf", "most_frequent", 0.3 * noise + 0.1 * y, y, subjects, val_auprc=0.70)
        _record_binary_run(con, "tf", "transformer", 0.2 * noise + 0.8 * y, y, subjects, val_auprc=0.95)
        _record_binary_run(con, "rnd", "rnn", noise, y, subjects, val_auprc=0.99)
        assert reference_run(con, get_task("readmission"), "sim") == "mf"
        rows = {(r, m): (ref, v, lo, hi) for r, ref, m, v, lo, hi in con.sql(
            "SELECT run_id, reference_run_id, metric, verdict, ci_low, ci_high FROM ml.comparisons").fetchall()}
        assert {r for r, _ in rows} == {"lr", "tf", "rnd"}  # every run but the reference, against the reference
        assert all(ref == "mf" for ref, *_ in rows.values())
        assert rows[("tf", "auprc")][1] == "better" and rows[("rnd", "auprc")][1] == "worse"
        lo, hi, n_boot, method, sd_method = con.sql(
            "SELECT ci_low, ci_high, n_boot, ci_method, sd_method FROM ml.metrics "
            "WHERE run_id = 'lr' AND split = 'test' AND metric = 'auroc'").fetchall()[0]
        assert 0.7 < lo < hi < 1.0 and n_boot == 1000 and method == iv.CI_METHOD
        # The runner's value (0.5 here) is replaced by the point estimate on the whole test split.
        (value,), = con.sql("SELECT value FROM ml.metrics WHERE run_id = 'lr' AND split = 'test' "
                            "AND metric = 'auroc'").fetchall()
        lr_scores = con.sql("SELECT y_true, prob FROM ml.predictions WHERE run_id = 'lr'").fetchall()
        assert value == pytest.approx(roc_auc_score([t for t, _ in lr_scores], [p for _, p in lr_scores]))
        assert lo <= value <= hi
        assert sd_method == "subsample_10x80pct_sd"
        # brier gets an interval; the ECE is stored without one, its method saying why (a biased bootstrap)
        assert con.sql("SELECT metric, ci_low IS NOT NULL, ci_method FROM ml.metrics WHERE run_id = 'tf' "
                       "AND metric IN ('brier', 'ece') ORDER BY metric").fetchall() == [
            ("brier", True, iv.CI_METHOD), ("ece", False, iv.CI_METHOD + iv.WITHHELD)]
        # A better baseline on validation arrives: every run is recompared against it, none against the old one.
        _record_binary_run(con, "cl", "copy_last", 0.4 * noise + 0.5 * y, y, subjects, val_auprc=0.80)
        refs = {r for r, in con.sql("SELECT DISTINCT reference_run_id FROM ml.comparisons").fetchall()}
        assert refs == {"cl"}
        assert con.sql("SELECT count(DISTINCT run_id) FROM ml.comparisons").fetchall()[0][0] == 4
    finally:
        con.close()


def test_a_baseline_on_a_pretrained_encoder_is_never_the_reference(tmp_db: Path):
    """FAQ retrieval over MiniLM embeddings is model `retrieval`, like TF-IDF retrieval, but not a non-neural
    baseline: the reference is the TF-IDF run even when the MiniLM one ran last or scored higher."""
    rng, subjects, y = _sim(40)
    noise = rng.random(len(y))
    con = connect(tmp_db)
    try:
        _record_binary_run(con, "tfidf", "retrieval", 0.5 * noise + 0.3 * y, y, subjects, val_auprc=None,
                           config={"faq": {"embedding": "tfidf"}})
        _record_binary_run(con, "mini", "retrieval", 0.2 * noise + 0.8 * y, y, subjects, val_auprc=None,
                           config={"faq": {"embedding": "minilm"}})
        assert reference_run(con, get_task("readmission"), "sim") == "tfidf"
    finally:
        con.close()


def test_warehouse_two_patients_is_too_small(tmp_db: Path):
    rng, subjects, y = _sim(2)
    y[:] = [True, False, True, False]
    con = connect(tmp_db)
    try:
        _record_binary_run(con, "mf", "most_frequent", rng.random(4), y, subjects, val_auprc=0.5)
        _record_binary_run(con, "tf", "transformer", y * 0.9, y, subjects, val_auprc=0.9)
        verdicts = {v for v, in con.sql("SELECT verdict FROM ml.comparisons WHERE run_id = 'tf'").fetchall()}
        assert verdicts == {"too_small"}
    finally:
        con.close()


def test_warehouse_mismatched_test_samples_fail_loudly(tmp_db: Path):
    rng, subjects, y = _sim(40)
    con = connect(tmp_db)
    try:
        _record_binary_run(con, "mf", "most_frequent", rng.random(len(y)), y, subjects, val_auprc=0.5)
        with pytest.raises(ValueError, match="different test samples"):
            _record_binary_run(con, "tf", "transformer", rng.random(len(y) - 2), y[:-2], subjects[:-2], 0.9)
        with pytest.raises(ValueError, match="no ml.runs row for run 'nope'"):
            record_intervals(con, "nope")
        status, error = con.sql("SELECT status, error FROM ml.runs WHERE run_id = 'tf'").fetchall()[0]
        assert status == "failed" and "different test samples" in error
        # The reference's stored intervals are untouched by the failure.
        assert con.sql("SELECT count(*) FROM ml.metrics WHERE run_id = 'mf' AND ci_low IS NOT NULL").fetchall()[0][0] > 0
        assert compare_runs(con, get_task("readmission"), "sim", ["mf"]) == 0
    finally:
        con.close()


def test_warehouse_text_runs_resample_groups_and_pairs(tmp_db: Path):
    """MTSamples runs resample text groups (from samples.specialty), FAQ runs resample question/answer pairs."""
    import polars as pl

    rng = np.random.default_rng(4)
    con = connect(tmp_db)
    try:
        notes = pl.DataFrame({"note_id": np.arange(80), "text": ["t"] * 80, "label": ["a"] * 80,
                              "group_id": np.arange(80) // 2, "split": ["test"] * 80, "conflicting": [False] * 80})
        con.register("n", notes.to_arrow())
        con.execute("INSERT INTO samples.specialty SELECT * FROM n")
        classes = ["a", "b", "c"]
        y = rng.integers(0, 3, 80)
        pred = np.where(rng.random(80) < 0.7, y, rng.integers(0, 3, 80))
        records.start_run(con, "spec", task="specialty", model="tfidf_logreg", dataset="mtsamples", seed=0, config={})
        records.write_metrics(con, "spec", "test", [("macro_f1", "none", 0.6, 0.02, 10)])
        records.write_predictions(con, "spec", pl.DataFrame({
            "sample_id": np.repeat(np.arange(80).astype(str), 3), "label": classes * 80,
            "prob": rng.random(240), "y_true": np.repeat(y, 3) == np.tile(np.arange(3), 80),
            "predicted": np.repeat(pred, 3) == np.tile(np.arange(3), 80)}))
        records.finish_run(con, "spec")
        f1 = rng.random(50)
        records.start_run(con, "faq1", task="faq", model="retrieval", dataset="mental_health_faq", seed=0, config={})
        records.write_metrics(con, "faq1", "test", [("token_f1", "none", float(f1.mean()), 0.01, 10)])
        records.write_predictions(con, "faq1", pl.DataFrame({
            "sample_id": np.arange(50).astype(str), "label": ["answer"] * 50, "prob": f1, "y_true": f1 > 0.9,
            "predicted": f1 > 0.9}))
        records.finish_run(con, "faq1")
        units = dict(con.sql("SELECT run_id, n_test_units || ' ' || test_unit FROM ml.runs").fetchall())
        assert units == {"spec": "40 text groups", "faq1": "50 pairs"}
        (lo, hi), = con.sql("SELECT ci_low, ci_high FROM ml.metrics WHERE run_id = 'faq1' "
                            "AND metric = 'token_f1'").fetchall()
        assert lo < f1.mean() < hi
        naive = np.percentile([f1[d].mean() for d in np.random.default_rng(0).integers(0, 50, (1000, 50))],
                              [2.5, 97.5])
        assert abs(lo - naive[0]) < 0.03 and abs(hi - naive[1]) < 0.03  # another resample draw, same law
        (lo, hi, method), = con.sql("SELECT ci_low, ci_high, ci_method FROM ml.metrics WHERE run_id = 'spec' "
                                    "AND metric = 'macro_f1'").fetchall()
        assert 0 < lo < hi < 1 and method == "text_group_bootstrap_percentile"  # its unit's name, not patients'
        assert con.execute("SELECT ci_method FROM ml.metrics WHERE run_id = 'faq1' AND metric = 'token_f1'"
                           ).fetchall() == [("pair_bootstrap_percentile",)]
    finally:
        con.close()


def test_an_old_run_on_another_split_does_not_fail_a_new_one(tmp_db: Path, caplog):
    """When a new reference triggers a recompare, a stale run (other test samples) is skipped with a warning;
    the run being recorded still completes with its comparison."""
    rng, subjects, y = _sim(40)
    con = connect(tmp_db)
    try:
        _record_binary_run(con, "old", "rnn", rng.random(len(y) - 2), y[:-2], subjects[:-2], val_auprc=0.9)
        _record_binary_run(con, "mf", "most_frequent", rng.random(len(y)), y, subjects, val_auprc=0.5)
        _record_binary_run(con, "tf", "transformer", rng.random(len(y)), y, subjects, val_auprc=0.9)
        status = dict(con.sql("SELECT run_id, status FROM ml.runs").fetchall())
        assert status == {"old": "completed", "mf": "completed", "tf": "completed"}
        compared = {r for r, in con.sql("SELECT DISTINCT run_id FROM ml.comparisons").fetchall()}
        assert compared == {"tf"} and "old left without a comparison" in caplog.text
    finally:
        con.close()


def test_truncated_predictions_are_named_in_ci_method(tmp_db: Path):
    """A multi-label run that stored only part of its (visit, label) cells: set metrics are exact, ranking
    metrics' intervals are computed from the stored cells and say so; the runner's ranking value is kept."""
    import polars as pl

    rng = np.random.default_rng(9)
    n, labels = 40, ["A01", "B02", "C03", "D04", "E05"]
    p = rng.random((n, 5))
    y = rng.random((n, 5)) < 0.4
    keep = y | (p >= 0.5) | (np.argsort(np.argsort(-p, axis=1), axis=1) < 2)  # true, predicted or top-2
    rows, cols = np.nonzero(keep)
    con = connect(tmp_db)
    try:
        records.start_run(con, "trunc", task="drug_rec", model="logreg", dataset="sim", seed=0, config={})
        records.write_metrics(con, "trunc", "test", [("pr_auc_samples", "visit", 0.123, 0.01, 10),
                                                     ("jaccard_samples", "visit", 0.5, 0.01, 10)])
        records.write_predictions(con, "trunc", pl.DataFrame({
            "sample_id": rows.astype(str), "subject_id": rows, "hadm_id": rows,
            "label": np.array(labels)[cols], "prob": p[rows, cols], "y_true": y[rows, cols],
            "predicted": p[rows, cols] >= 0.5}))
        records.finish_run(con, "trunc")
        got = {m: (v, method) for m, v, method in con.sql(
            "SELECT metric, value, ci_method FROM ml.metrics WHERE run_id = 'trunc' AND averaging = 'visit' "
            "AND metric IN ('pr_auc_samples', 'jaccard_samples')").fetchall()}
        assert got["pr_auc_samples"] == (0.123, iv.CI_METHOD + "_truncated_predictions")
        inter, union = (y & (p >= 0.5)).sum(axis=1), (y | (p >= 0.5)).sum(axis=1)
        jaccard = np.where(union > 0, inter / np.maximum(union, 1), 0).mean()
        assert got["jaccard_samples"] == (pytest.approx(jaccard), iv.CI_METHOD)
    finally:
        con.close()


def test_the_ece_bootstrap_is_biased_so_its_interval_is_withheld():
    """Why the ECE gets no interval (intervals.BIASED): resampling only adds miscalibration, so the percentile
    interval of the binned ECE misses a calibrated model's true ECE (0) in every simulated split, while a
    mean-type metric's covers its truth (test_coverage_of_mean_type_metric). The point estimate often lies
    below the whole interval; `outside` says so for any metric."""
    n_sets, covered, below = 40, 0, 0
    for seed in range(n_sets):
        rng = np.random.default_rng(seed)
        subjects = np.repeat(np.arange(300), 2)
        p = rng.random(len(subjects))
        y = rng.random(len(subjects)) < p  # calibrated: the true ECE is 0
        n_units, inverse = iv.unit_index(subjects)
        value, lo, hi = iv.interval(iv.ece_stat(y, p, inverse, n_units), iv.resample_counts(n_units, 400, seed))
        covered += lo <= 0.0 <= hi
        below += iv.outside(value, lo, hi)
        assert value < hi
    assert covered == 0 and below >= 5
    assert iv.outside(0.2, 0.3, 0.5) and iv.outside(0.6, 0.3, 0.5) and not iv.outside(0.3, 0.3, 0.5)
    assert not iv.outside(float("nan"), 0.3, 0.5) and not iv.outside(0.2, float("nan"), float("nan"))


def test_a_withheld_interval_is_said_in_the_warehouse_and_the_train_table(tmp_db: Path):
    """A calibrated run: its ECE is stored as a value with no interval, ci_method ending in WITHHELD, and the
    `medtx train` table prints why; its AUROC keeps its interval."""
    from rich.console import Console

    from flows.cli.train import _metrics_table

    rng, subjects, _ = _sim(200, seed=3)
    p = rng.random(len(subjects))
    y = rng.random(len(subjects)) < p
    con = connect(tmp_db)
    try:
        _record_binary_run(con, "cal", "logreg", p, y, subjects, val_auprc=0.5)
        rows = {m: (v, lo, hi, method) for m, v, lo, hi, method in con.sql(
            "SELECT metric, value, ci_low, ci_high, ci_method FROM ml.metrics WHERE run_id = 'cal' "
            "AND split = 'test'").fetchall()}
        value, lo, hi, method = rows["ece"]
        assert 0 < value < 0.2 and lo is None and hi is None and method == iv.CI_METHOD + iv.WITHHELD
        assert rows["auroc"][1] <= rows["auroc"][0] <= rows["auroc"][2] and rows["auroc"][3] == iv.CI_METHOD
    finally:
        con.close()
    console = Console(width=200, record=True)
    console.print(_metrics_table(tmp_db, "cal"))
    lines = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if line.count("│") > 2}
    assert f"{value:.4f} (no interval: biased bootstrap)" in lines["ece"]
    assert "[" in lines["auroc"]


def test_column_percentiles_equal_numpy_nanpercentile_bit_for_bit() -> None:
    """The operating points' intervals: the vectorised percentile must store what np.nanpercentile stored."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        values = rng.random((int(rng.integers(1, 1200)), int(rng.integers(1, 25)))) * rng.choice([1, 100, 1e-3])
        values[rng.random(values.shape) < rng.random() * 0.6] = np.nan
        values[rng.random(values.shape) < 0.01] = np.inf  # non-finite: left out like NaN
        if trial % 7 == 0:
            values[:, 0] = np.nan  # a column with nothing finite: NaN
        if trial % 5 == 0:
            values = np.round(values, 2)  # ties
        finite = np.where(np.isfinite(values), values, np.nan)
        for q in (2.5, 50, 97.5):
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                expected = np.nanpercentile(finite, q, axis=0)
            np.testing.assert_array_equal(iv.column_percentiles(values, q), expected)
