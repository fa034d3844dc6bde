"""Patient-bootstrap confidence intervals and paired comparisons, vectorised over resamples.

A bootstrap WITH replacement over units (patients; text groups for MTSamples; pairs for the FAQ) is a matrix
`counts` of shape (n_boot, n_units): how often each unit was drawn in each resample (n_units uniform
draws with replacement, i.e. a multinomial count vector). Every metric is written as a `Stat`: a function of such a count matrix returning one
value per row, so a resample never copies data:
- mean-type metrics (per-visit PR-AUC, Jaccard, Brier, token F1 ...) are ratios of per-unit sums,
  `counts @ sums / counts @ n` — a matrix product;
- pooled ranking metrics (binary AUROC, AUPRC, RP80) use the counts as sample weights on one fixed sort
  order (weighted Mann-Whitney / weighted average precision, cumulative sums over tie groups);
- multi-class F1 and the 15-bin ECE aggregate per-unit count tables (tp / support / predicted per class;
  n / sum(p) / sum(y) per bin) by the same matrix product.
The point estimate is the same Stat evaluated on a row of ones (every unit once), so point and resamples can
never disagree on a convention. The interval is the 2.5–97.5 percentile of the resampled values; it is withheld
for the ECE, whose bootstrap is biased (`BIASED`), and wherever it does not contain its estimate (`outside`); a paired
comparison evaluates two runs' Stats on the SAME count matrix and takes the percentile interval of the
difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Stat = Callable[[np.ndarray], np.ndarray]

N_BOOT = 1000
ALPHA = 0.05
MIN_UNITS = 30  # fewer test units than this: no verdict (`too_small`)
ECE_BINS = 15
CI_METHOD = "patient_bootstrap_percentile"
# Appended to ci_method where no interval is stored because the bootstrap is biased for the metric: always for
# `BIASED` metrics, and for any other whose estimate lies outside its own percentile interval (`outside`).
WITHHELD = "_withheld_biased"
# The binned ECE: resampling noise only adds miscalibration, so its resamples sit above the estimate. Simulated
# (benchmarks/archive/ece_coverage.py: 500 patients x 2 visits, 100 splits): the percentile interval covered a calibrated
# model's true ECE (0) in 0 of 100 splits, a mildly miscalibrated one's (p^1.2, ECE 0.045) in 43, a strongly
# miscalibrated one's (p^2, 0.167) in 94; on real runs 15 of 24 intervals lay wholly above their estimate.
BIASED = ("ece",)
VERDICTS = ("better", "worse", "no_detectable_difference", "too_small")


def unit_index(units: np.ndarray) -> tuple[int, np.ndarray]:
    """(number of distinct units, index of each sample's unit)."""
    units = np.asarray(units)
    if units.size == 0:
        raise ValueError("bootstrap: the test split is empty")
    unique, inverse = np.unique(units, return_inverse=True)
    return len(unique), inverse.reshape(-1)


def resample_counts(n_units: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, n_units) draw counts of a bootstrap with replacement over units; deterministic given `seed`."""
    if n_units < 1:
        raise ValueError("bootstrap: no units to resample")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_units, (n_boot, n_units))  # n_units draws with replacement per resample
    flat = (draws + np.arange(n_boot)[:, None] * n_units).ravel()
    return np.bincount(flat, minlength=n_boot * n_units).reshape(n_boot, n_units).astype(np.float64)


def _unit_sums(values: np.ndarray, inverse: np.ndarray, n_units: int) -> np.ndarray:
    return np.bincount(inverse, weights=values, minlength=n_units)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else NaN (one division pass, written into a NaN-filled array)."""
    num, den = np.asarray(num), np.asarray(den)
    out = np.full(np.broadcast_shapes(num.shape, den.shape), np.nan)
    return np.divide(num, den, out=out, where=den > 0)


def mean_stat(values: np.ndarray, inverse: np.ndarray, n_units: int, averaging: str = "visit") -> Stat:
    """Mean of per-sample values, NaN samples skipped. 'visit': over samples (sklearn samples-average);
    'patient': within each unit, then over units (SafeDrug)."""
    values = np.asarray(values, dtype=np.float64)
    ok = np.isfinite(values)
    sums = _unit_sums(np.where(ok, values, 0.0), inverse, n_units)
    n = _unit_sums(ok.astype(np.float64), inverse, n_units)
    if averaging == "visit":
        return lambda counts: _ratio(counts @ sums, counts @ n)
    if averaging == "patient":
        means, has = _ratio(sums, n), (n > 0).astype(np.float64)
        means = np.nan_to_num(means)
        return lambda counts: _ratio(counts @ means, counts @ has)
    raise ValueError(f"mean_stat: averaging must be 'visit' or 'patient', got {averaging!r}")


def ratio_stat(num: np.ndarray, den: np.ndarray, inverse: np.ndarray, n_units: int, empty: float = 0.0) -> Stat:
    """Pooled ratio sum(num) / sum(den) (e.g. the DDI rate); `empty` where the denominator is 0."""
    s_num = _unit_sums(np.asarray(num, dtype=np.float64), inverse, n_units)
    s_den = _unit_sums(np.asarray(den, dtype=np.float64), inverse, n_units)

    def stat(counts: np.ndarray) -> np.ndarray:
        out = _ratio(counts @ s_num, counts @ s_den)
        return np.where(np.isnan(out), empty, out)
    return stat


def _tie_groups(scores: np.ndarray, descending: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sort order and the start index of each group of equal scores in that order."""
    order = np.argsort(-scores if descending else scores, kind="stable")
    s = scores[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    return order, starts


def _tie_weights(counts: np.ndarray, inverse: np.ndarray, order: np.ndarray, starts: np.ndarray,
                 y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(positive, negative, all) weights per tie group, (n_boot, n_groups) each, from ONE gather of the counts.
    Draw counts are whole numbers, so every sum here is exact whatever its order (they stay below 2**53)."""
    w = counts[:, inverse[order]]
    pos = w * y[order]
    if len(starts) < len(order):  # ties: sum each group (no ties: the groups are the samples themselves)
        pos, w = np.add.reduceat(pos, starts, axis=1), np.add.reduceat(w, starts, axis=1)
    return pos, w - pos, w


def _auroc(pos: np.ndarray, neg: np.ndarray, descending: bool) -> np.ndarray:
    """Mann-Whitney AUROC (ties 1/2) from per-tie-group weights in ascending or descending score order. Each
    term pos * (negatives below + neg / 2) is a multiple of 1/2 and so is every partial sum: the result does not
    depend on the order the groups come in."""
    cum = np.cumsum(neg, axis=1)
    below = (cum[:, -1:] - cum) if descending else (cum - neg)
    below += 0.5 * neg
    num = (pos * below).sum(axis=1)
    return _ratio(num, pos.sum(axis=1) * neg.sum(axis=1))


def _share(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else 0 (= np.nan_to_num of `_ratio` for finite inputs)."""
    return np.divide(num, den, out=np.zeros(np.broadcast_shapes(num.shape, den.shape)), where=den > 0)


def _precision_recall(tp: np.ndarray, allw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(precision, recall, total positives) at each threshold, 0 where undefined, from per-tie-group weights in
    DESCENDING score order."""
    cum_tp = np.cumsum(tp, axis=1)
    total = cum_tp[:, -1:]
    return _share(cum_tp, np.cumsum(allw, axis=1)), _share(cum_tp, total), total[:, 0]


def _average_precision(tp: np.ndarray, precision: np.ndarray, total: np.ndarray, neg_total: np.ndarray
                       ) -> np.ndarray:
    ap = (tp * precision).sum(axis=1)
    return np.where((total > 0) & (neg_total > 0), _ratio(ap, total), np.nan)


def _recall_at_precision(precision: np.ndarray, recall: np.ndarray, total: np.ndarray,
                         min_precision: float) -> np.ndarray:
    best = np.where(precision >= min_precision, recall, 0.0).max(axis=1)
    return np.where(total > 0, best, np.nan)


RankingStats = Callable[[np.ndarray], dict[str, np.ndarray]]


def binary_ranking(y: np.ndarray, scores: np.ndarray, inverse: np.ndarray, min_precision: float = 0.8
                   ) -> RankingStats:
    """AUROC, AUPRC and RP80 of one binary run from ONE pass over the resamples: counts -> {"auroc", "auprc",
    "rp80": values per row}. The samples are sorted once, by descending score; one gather of the counts gives the
    positive and negative weight of every tie group, which all three read (AUROC's sums are exact, so it needs no
    ascending order of its own; with NaN scores, which sort last both ways, it takes one). The answer for the last
    count matrix of more than one row is kept, by identity (the three Stats ask about the same matrix in turn; a
    count matrix is never written to once drawn)."""
    y, scores = np.asarray(y, dtype=bool), np.asarray(scores, dtype=np.float64)
    order, starts = _tie_groups(scores, descending=True)
    ascending = _tie_groups(scores, descending=False) if np.isnan(scores).any() else None
    memo: dict = {}

    def stats(counts: np.ndarray) -> dict[str, np.ndarray]:
        if memo.get("counts") is counts:
            return memo["values"]
        tp, neg, allw = _tie_weights(counts, inverse, order, starts, y)
        auroc = _auroc(tp, neg, descending=True) if ascending is None else \
            _auroc(*_tie_weights(counts, inverse, *ascending, y)[:2], descending=False)
        neg_total = neg.sum(axis=1)
        del neg
        precision, recall, total = _precision_recall(tp, allw)
        out = {"auroc": auroc, "auprc": _average_precision(tp, precision, total, neg_total),
               "rp80": _recall_at_precision(precision, recall, total, min_precision)}
        if counts.shape[0] > 1:  # a point estimate (one row of ones) is cheap and must not evict the resamples
            memo.update(counts=counts, values=out)
        return out
    return stats


def binary_auroc_stat(y: np.ndarray, scores: np.ndarray, inverse: np.ndarray) -> Stat:
    """Weighted Mann-Whitney AUROC (ties count 1/2) = sklearn `roc_auc_score` with the draw counts as weights."""
    ranking = binary_ranking(y, scores, inverse)
    return lambda counts: ranking(counts)["auroc"]


def binary_ap_stat(y: np.ndarray, scores: np.ndarray, inverse: np.ndarray) -> Stat:
    """Weighted average precision (sklearn `average_precision_score`: sum over thresholds of dR * P)."""
    ranking = binary_ranking(y, scores, inverse)
    return lambda counts: ranking(counts)["auprc"]


def binary_rp_stat(y: np.ndarray, scores: np.ndarray, inverse: np.ndarray, min_precision: float = 0.8) -> Stat:
    """Highest recall at any threshold with precision >= `min_precision` (RP80), weighted."""
    ranking = binary_ranking(y, scores, inverse, min_precision)
    return lambda counts: ranking(counts)["rp80"]


def ece_stat(y: np.ndarray, prob: np.ndarray, inverse: np.ndarray, n_units: int, n_bins: int = ECE_BINS) -> Stat:
    """Expected calibration error over all cells (samples x labels): sum over 15 equal-width probability bins
    of |sum(p) - sum(y)| / n. `y`/`prob` are (n_samples,) or (n_samples, n_labels); `inverse` per sample."""
    prob = np.asarray(prob, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if prob.ndim == 1:
        prob, y = prob[:, None], y[:, None]
    bins = np.clip((prob * n_bins).astype(np.int64), 0, n_bins - 1)
    flat = inverse[:, None] * n_bins + bins  # (unit, bin) cell index
    size = n_units * n_bins
    table = np.stack([np.bincount(flat.ravel(), weights=w.ravel(), minlength=size).reshape(n_units, n_bins)
                      for w in (np.ones_like(prob), prob, y)])  # (3, units, bins)

    def stat(counts: np.ndarray) -> np.ndarray:
        n, sp, sy = (counts @ t for t in table)
        return _ratio(np.abs(sp - sy).sum(axis=1), n.sum(axis=1))
    return stat


def multiclass_stats(y: np.ndarray, pred: np.ndarray, n_classes: int, inverse: np.ndarray,
                     n_units: int) -> dict[str, Stat]:
    """accuracy, macro_f1, weighted_f1 over all `n_classes` (absent classes score F1 0, zero_division=0)."""
    y, pred = np.asarray(y, dtype=np.int64), np.asarray(pred, dtype=np.int64)

    def table(cls: np.ndarray, weights: np.ndarray) -> np.ndarray:
        flat = inverse * n_classes + cls
        return np.bincount(flat, weights=weights, minlength=n_units * n_classes).reshape(n_units, n_classes)

    hit = (y == pred).astype(np.float64)
    tp, support, predicted = table(y, hit), table(y, np.ones(len(y))), table(pred, np.ones(len(y)))

    def f1(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t, s, p = counts @ tp, counts @ support, counts @ predicted
        return np.nan_to_num(_ratio(2 * t, s + p)), s

    def weighted(counts: np.ndarray) -> np.ndarray:
        scores, s = f1(counts)
        return _ratio((scores * s).sum(axis=1), s.sum(axis=1))

    return {
        "accuracy": lambda counts: _ratio((counts @ tp).sum(axis=1), (counts @ support).sum(axis=1)),
        "macro_f1": lambda counts: f1(counts)[0].mean(axis=1),
        "weighted_f1": weighted,
    }


def percentile_interval(values: np.ndarray, alpha: float = ALPHA) -> tuple[float, float]:
    """The (alpha/2, 1-alpha/2) percentiles of the finite resampled values; NaN when none is finite."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not values.size:
        return float("nan"), float("nan")
    lo, hi = np.percentile(values, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def column_percentiles(values: np.ndarray, q: float) -> np.ndarray:
    """`np.nanpercentile(values, q, axis=0)` with non-finite values left out, bit for bit (its linear rule and
    its interpolation), NaN for a column with none finite. numpy takes a slow path per column when a column has
    a NaN (the operating points' 19 thresholds x 6 figures: 1.4 of the default pipeline's 19.6 s analysis)."""
    values = np.where(np.isfinite(values), values, np.nan)
    ordered = np.sort(values, axis=0)  # NaN last
    n = np.sum(~np.isnan(values), axis=0)
    pos = q / 100 * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    t = pos - lo
    columns = np.arange(values.shape[1])
    a, b = ordered[lo, columns], ordered[hi, columns]
    diff = b - a
    out = a + diff * t
    np.subtract(b, diff * (1 - t), out=out, where=t >= 0.5)  # numpy's lerp: exact at both ends
    return np.where(n > 0, out, np.nan)


def point(stat: Stat, n_units: int) -> float:
    """The statistic on the test split itself (every unit drawn once)."""
    return float(stat(np.ones((1, n_units)))[0])


def interval(stat: Stat, counts: np.ndarray, alpha: float = ALPHA) -> tuple[float, float, float]:
    """(point estimate, ci_low, ci_high) of a Stat under the resample count matrix."""
    return point(stat, counts.shape[1]), *percentile_interval(stat(counts), alpha)


def outside(value: float, lo: float, hi: float) -> bool:
    """The point estimate lies outside its own percentile interval: the resampled statistic is biased against it,
    and that range is no 95% interval for it."""
    return bool(np.isfinite([value, lo, hi]).all() and not lo <= value <= hi)


@dataclass(frozen=True)
class Comparison:
    diff: float  # run minus reference, on the test split itself
    ci_low: float
    ci_high: float
    p_better: float  # share of resamples where the run beats the reference
    verdict: str
    n_units: int
    diffs: np.ndarray  # the resampled differences (for the run-detail histogram)


def paired_comparison(stat_run: Stat, stat_ref: Stat, counts: np.ndarray, alpha: float = ALPHA,
                      min_units: int = MIN_UNITS) -> Comparison:
    """Paired bootstrap: both runs' statistics on the SAME resampled units; the verdict reads the percentile
    interval of the difference (higher is better). Fewer than `min_units` units: `too_small`, no verdict."""
    n_units = counts.shape[1]
    diff = point(stat_run, n_units) - point(stat_ref, n_units)
    diffs = stat_run(counts) - stat_ref(counts)
    lo, hi = percentile_interval(diffs, alpha)
    finite = diffs[np.isfinite(diffs)]
    p_better = float((finite > 0).mean()) if finite.size else float("nan")
    if n_units < min_units or not finite.size:
        verdict = "too_small"
    elif lo > 0:
        verdict = "better"
    elif hi < 0:
        verdict = "worse"
    else:
        verdict = "no_detectable_difference"
    return Comparison(float(diff), lo, hi, p_better, verdict, n_units, diffs)
