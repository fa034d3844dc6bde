"""Patient-bootstrap confidence intervals and paired comparisons, vectorised over resamples.

A bootstrap WITH replacement over units (patients; text groups for MTSamples; pairs for the FAQ) is a matrix
`counts` of shape (n_boot, n_units): how often each unit was drawn in each resample (n_units uniform
draws with replacement, i.e. a multinomial count vector). Every metric is written as a `Stat`: a function of such a count matrix returning one
value per row, so a resample never copies data:
- mean-type metrics (per-visit PR-AUC, Jaccard, Brier, token F1 ...) are ratios of per-unit sums,
  `counts @ sums / counts @ n` — a matrix product;
- pooled ranking metrics (binary AUROC, AUPRC, RP80) use the counts as sample weights on one fixed sort
  order (weighted Mann-Whitney / weighted average precision, one cumulative sum per chunk of resamples);
- multi-class F1 and the 15-bin ECE aggregate per-unit count tables (tp / support / predicted per class;
  n / sum(p) / sum(y) per bin) by the same matrix product.
The point estimate is the same Stat evaluated on a row of ones (every unit once), so point and resamples can
never disagree on a convention. The interval is the 2.5–97.5 percentile of the resampled values; it is withheld
for the ECE, whose bootstrap is biased (`BIASED`), and wherever it does not contain its estimate (`outside`); a paired
comparison evaluates two runs' Stats on the SAME count matrix and takes the percentile interval of the
difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

Stat = Callable[[np.ndarray], np.ndarray]

N_BOOT = 1000
ALPHA = 0.05
MIN_UNITS = 30  # fewer test units than this: no verdict (`too_small`)
ECE_BINS = 15
CI_METHOD = "patient_bootstrap_percentile"  # over test patients; `ci_method` names the other units


def ci_method(split_unit: str = "patient") -> str:
    """The stored name (ml.metrics.ci_method) of the percentile bootstrap over `split_unit`, the unit a task
    splits and resamples by (`Task.samples.split_unit`: patient, text_group, pair)."""
    return f"{split_unit}_bootstrap_percentile"

# Appended to ci_method where no interval is stored because the bootstrap is biased for the metric: always for
# `BIASED` metrics, and for any other whose estimate lies outside its own percentile interval (`outside`).
WITHHELD = "_withheld_biased"
# The binned ECE: resampling noise only adds miscalibration, so its resamples sit above the estimate. Simulated
# (benchmarks/archive/ece_coverage.py: 500 patients x 2 visits, 100 splits): the percentile interval covered a calibrated
# model's true ECE (0) in 0 of 100 splits, a mildly miscalibrated one's (p^1.2, ECE 0.045) in 43, a strongly
# miscalibrated one's (p^2, 0.167) in 94; on real runs 15 of 24 intervals lay wholly above their estimate.
BIASED = ("ece",)
# Resamples x samples evaluated at once by the statistics that gather the counts per sample (the ranking metrics,
# the calibration slope): 2 MiB of float64, so a chunk's passes stay in cache. Resamples are independent rows, so
# the chunk changes no value (bar the last bit of a BLAS dot product). At full scale (11,000 test samples) it made
# the ranking metrics 2x and the slope's Newton fits 2.3x faster than one chunk of all 1,000 resamples.
CHUNK_CELLS = 262_144
FLOAT32_EXACT = 2 ** 24  # whole numbers below this add exactly in float32
VERDICTS = ("better", "worse", "no_detectable_difference", "too_small")


def unit_index(units: np.ndarray) -> tuple[int, np.ndarray]:
    """(number of distinct units, index of each sample's unit)."""
    units = np.asarray(units)
    if units.size == 0:
        raise ValueError("bootstrap: the test split is empty")
    unique, inverse = np.unique(units, return_inverse=True)
    return len(unique), inverse.reshape(-1)


def resample_counts(n_units: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, n_units) draw counts of a bootstrap with replacement over units; deterministic given `seed`. A
    run's intervals, comparisons and trust figures draw the same matrix, and so do the other runs on the same test
    split: drawn once (0.4 s at 9,000 test patients), kept compact (`_drawn`), returned as a fresh float64 copy."""
    return _drawn(n_units, n_boot, seed).astype(np.float64)


@lru_cache(maxsize=8)
def _drawn(n_units: int, n_boot: int, seed: int) -> np.ndarray:
    """The draw counts in the smallest unsigned integer type that holds them (uint8: 9 MB at 9,000 units), read-only."""
    if n_units < 1:
        raise ValueError("bootstrap: no units to resample")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_units, (n_boot, n_units))  # n_units draws with replacement per resample
    flat = (draws + np.arange(n_boot)[:, None] * n_units).ravel()
    counts = np.bincount(flat, minlength=n_boot * n_units).reshape(n_boot, n_units)
    counts = counts.astype(np.min_scalar_type(int(counts.max())))
    counts.flags.writeable = False
    return counts


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


@dataclass(frozen=True)
class _Ranking:
    """The fixed part of one run's ranking: its samples in descending score order, and the tie groups (runs of
    equal scores) that hold a positive sample. Only those groups move AUROC, AUPRC or RP80: a group without a
    positive adds no term to the AUROC's or the AUPRC's sum, and its recall equals the group before it at no
    higher precision, so it cannot hold RP80's best."""

    units: np.ndarray  # each sample's unit, in score order
    pos_units: np.ndarray  # each positive sample's unit, in score order
    pos_starts: np.ndarray  # where each positive group starts among the positive samples
    through: np.ndarray  # the last sample (in score order) of each positive group
    before: np.ndarray  # the last sample before each positive group (-1: none)


def _ranking(y: np.ndarray, scores: np.ndarray, inverse: np.ndarray) -> _Ranking:
    order = np.argsort(-scores, kind="stable")  # NaN last
    ranked = scores[order]
    new_group = np.r_[True, ranked[1:] != ranked[:-1]]  # NaN != NaN: each NaN is a group of its own
    group, starts = np.cumsum(new_group) - 1, np.flatnonzero(new_group)
    ends = np.r_[starts[1:], len(ranked)] - 1
    positive = np.flatnonzero(y[order])
    groups = group[positive]  # each positive sample's tie group
    first = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]]) if positive.size else positive
    held = groups[first]
    return _Ranking(inverse[order], inverse[order][positive], first, ends[held], starts[held] - 1)


def _ranking_rows(counts: np.ndarray, r: _Ranking, min_precision: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(AUROC, AUPRC, RP80) per row of `counts`. Draw counts are whole numbers, so every weight sum is exact in
    any order (float32 while it stays below 2**24, float64 after): the AUROC (a sum of multiples of 1/2) and the
    precisions compared with `min_precision` are bit-identical to a sum over every sample; the AUPRC sums
    fractions, so its last bit depends on the order of the sum (within 1e-15)."""
    exact32 = r.units.size * float(counts.max(initial=0.0)) < FLOAT32_EXACT
    weight = np.cumsum((counts.astype(np.float32) if exact32 else counts)[:, r.units], axis=1)
    through = weight[:, r.through].astype(np.float64)  # all weight down to the end of each positive group
    before = np.where(r.before >= 0, weight[:, np.maximum(r.before, 0)], 0).astype(np.float64)
    tp = counts[:, r.pos_units]
    if len(r.pos_starts) < tp.shape[1]:  # ties among positives: one column per positive group
        tp = np.add.reduceat(tp, r.pos_starts, axis=1)
    cum_tp = np.cumsum(tp, axis=1)
    total = cum_tp[:, -1] if tp.shape[1] else np.zeros(counts.shape[0])
    neg_total = weight[:, -1].astype(np.float64) - total
    below = neg_total[:, None] - (through - cum_tp)  # negatives scored strictly lower than the group
    below += 0.5 * (through - before - tp)  # ties count 1/2
    auroc = _ratio((tp * below).sum(axis=1), total * neg_total)
    precision = _share(cum_tp, through)
    auprc = np.where((total > 0) & (neg_total > 0), _ratio((tp * precision).sum(axis=1), total), np.nan)
    best = np.where(precision >= min_precision, _share(cum_tp, total[:, None]), 0.0).max(axis=1, initial=0.0)
    return auroc, auprc, np.where(total > 0, best, np.nan)


def _share(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else 0 (= np.nan_to_num of `_ratio` for finite inputs)."""
    return np.divide(num, den, out=np.zeros(np.broadcast_shapes(num.shape, den.shape)), where=den > 0)


def row_chunks(n_rows: int, width: int) -> Iterator[slice]:
    """Slices of at most CHUNK_CELLS // width resamples (at least one) covering `n_rows` rows of a count matrix."""
    step = max(1, CHUNK_CELLS // max(1, width))
    return (slice(start, start + step) for start in range(0, n_rows, step))


RankingStats = Callable[[np.ndarray], dict[str, np.ndarray]]


def binary_ranking(y: np.ndarray, scores: np.ndarray, inverse: np.ndarray, min_precision: float = 0.8
                   ) -> RankingStats:
    """AUROC, AUPRC and RP80 of one binary run from ONE pass over the resamples: counts -> {"auroc", "auprc",
    "rp80": values per row}. The samples are sorted once, by descending score; per chunk of resamples, one
    cumulative sum of the gathered counts gives every positive group's weight above and through it, which all
    three read. NaN scores sort last, each its own group; for the AUROC they rank above every score (the
    ascending order's convention), so with NaN scores the AUROC takes a second ranking. The answer for the last
    count matrix of more than one row is kept, by identity (the three Stats ask about the same matrix in turn; a
    count matrix is never written to once drawn)."""
    y, scores = np.asarray(y, dtype=bool), np.asarray(scores, dtype=np.float64)
    ranked = _ranking(y, scores, inverse)
    nan = np.isnan(scores)
    ranked_auroc = None
    if nan.any():  # NaN above every score, in sample order, for the AUROC
        top = scores.copy()
        top[nan] = np.nanmax(scores, initial=0.0) + 1.0 + np.arange(nan.sum())
        ranked_auroc = _ranking(y, top, inverse)
    memo: dict = {}

    def stats(counts: np.ndarray) -> dict[str, np.ndarray]:
        if memo.get("counts") is counts:
            return memo["values"]
        out = {k: np.empty(counts.shape[0]) for k in ("auroc", "auprc", "rp80")}
        for chunk in row_chunks(counts.shape[0], len(scores)):
            rows = counts[chunk]
            out["auroc"][chunk], out["auprc"][chunk], out["rp80"][chunk] = _ranking_rows(rows, ranked, min_precision)
            if ranked_auroc is not None:
                out["auroc"][chunk] = _ranking_rows(rows, ranked_auroc, min_precision)[0]
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
