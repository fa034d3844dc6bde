"""The standard figures of OHDSI PatientLevelPrediction (PLP) for one run's test predictions. Pure numpy: arrays
in, numbers out (the model card and the run page read them: medtx.evaluation.plp_card).

- `roc_curve`, `pr_curve`: one point per distinct predicted probability (as sklearn's `roc_curve(...,
  drop_intermediate=False)` and `precision_recall_curve`); `thin` keeps at most a few hundred for drawing.
- `distribution`: the predicted probabilities in 20 bins of [0, 1], by outcome (events, non-events).
- `smooth_calibration`: loess of the outcome on the predicted probability (Austin & Steyerberg, "The Integrated
  Calibration Index (ICI) and related metrics", Stat Med 2019;38:4051): local LINEAR regression with tricube
  weights over the nearest `SPAN` (75%, R's loess default) of the predictions, no robustness iterations (they
  would down-weight the events of a binary outcome). It is fitted at up to `GRID` (200) quantile points of the
  predictions and linearly interpolated between them (R's loess interpolates too); with at most `GRID` distinct
  predictions every one of them is a fitted point and nothing is interpolated.
- `e_statistics`: |smoothed(p_i) - p_i| over the test samples: Eavg (the ICI: mean), E50 (median), E90 (90th
  percentile), Emax (maximum). No interval: one loess per resample is not worth its cost for a secondary figure.
- `scaled_brier`: 1 - Brier / Brier_null, Brier_null = the Brier of predicting the test prevalence to everyone
  (binary: prev (1 - prev); multi-label: the mean over labels of prev_j (1 - prev_j)); 1 = perfect, 0 = no
  better than the prevalence, < 0 worse. 95% patient-bootstrap interval (numerator and prevalence resampled
  together).
- `demographic_cells`: observed and expected (mean predicted) rate per age band x sex, each cell under the
  floors of medtx.evaluation.floors (a cell below them shows counts and its reason, no figure).
- `per_label`: multi-label runs, each label with enough test events: its own loess and E-statistics.
Multi-label runs pool all (sample, label) cells for the pooled figures (an event is a positive cell).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from medtx.evaluation import floors
from medtx.metrics import intervals as iv

SPAN = 0.75
GRID = 200
BINS = 20
THIN = 300  # points kept per drawn curve
SMOOTHER = ("loess: local linear, tricube weights, span 0.75, no robustness iterations, fitted at up to 200 "
            "quantile points of the predictions and interpolated between them")
PER_LABEL_SHOWN = 6  # per-label curves drawn (the labels with most test events); the table lists every label


# ----------------------------------------------------------------------------------------------- curves


def _distinct_desc(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(thresholds, cumulative true positives, cumulative false positives) at each distinct probability, highest
    first: predicting 'event' for p >= threshold."""
    y, p = np.asarray(y, dtype=np.float64).ravel(), np.asarray(p, dtype=np.float64).ravel()
    order = np.argsort(-p, kind="mergesort")
    ps, ys = p[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(ps)), len(ps) - 1]  # the last sample of each run of equal values
    tp = np.cumsum(ys)[last]
    return ps[last], tp, (last + 1) - tp


def roc_curve(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) starting at (0, 0) with threshold +inf, one point per distinct probability."""
    thr, tp, fp = _distinct_desc(y, p)
    pos, neg = tp[-1], fp[-1]
    tpr = np.r_[0.0, tp / pos] if pos else np.r_[0.0, np.full(len(tp), np.nan)]
    fpr = np.r_[0.0, fp / neg] if neg else np.r_[0.0, np.full(len(fp), np.nan)]
    return fpr, tpr, np.r_[np.inf, thr]


def pr_curve(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(precision, recall, thresholds), highest threshold first, one point per distinct probability."""
    thr, tp, fp = _distinct_desc(y, p)
    pos = tp[-1]
    return tp / (tp + fp), tp / pos if pos else np.full(len(tp), np.nan), thr


def auc(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.trapezoid(y, x)) if hasattr(np, "trapezoid") else float(np.trapz(y, x))


def average_precision(precision: np.ndarray, recall: np.ndarray) -> float:
    """Step-wise area under the PR curve (sklearn's average_precision_score)."""
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def thin(*columns: np.ndarray, points: int = THIN) -> list[list[float]]:
    """At most `points` rows of aligned columns (first and last kept), for drawing; the figures' numbers are the
    full curves'."""
    n = len(columns[0])
    keep = np.unique(np.linspace(0, n - 1, min(n, points)).round().astype(int)) if n else np.array([], dtype=int)
    return [[float(v) for v in np.asarray(c)[keep]] for c in columns]


def distribution(y: np.ndarray, p: np.ndarray, bins: int = BINS) -> tuple[list[float], list[int], list[int]]:
    """(bin edges, events per bin, non-events per bin) of the predicted probabilities on [0, 1]."""
    y, p = np.asarray(y, dtype=np.float64).ravel(), np.clip(np.asarray(p, dtype=np.float64).ravel(), 0.0, 1.0)
    edges = np.linspace(0.0, 1.0, bins + 1)
    events = np.histogram(p[y >= 0.5], edges)[0]
    others = np.histogram(p[y < 0.5], edges)[0]
    return [float(e) for e in edges], [int(v) for v in events], [int(v) for v in others]


# ----------------------------------------------------------------------------------------------- calibration


def loess(x: np.ndarray, y: np.ndarray, at: np.ndarray, span: float = SPAN, chunk: int = 16) -> np.ndarray:
    """Local linear regression of y on x evaluated at `at`: tricube weights over the ceil(span * n) nearest x."""
    x, y, at = (np.asarray(a, dtype=np.float64).ravel() for a in (x, y, at))
    k = min(len(x), max(2, int(np.ceil(span * len(x)))))
    out = np.empty(len(at))
    for start in range(0, len(at), chunk):
        x0 = at[start:start + chunk, None]
        d = np.abs(x[None, :] - x0)
        h = np.partition(d, k - 1, axis=1)[:, k - 1:k]
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(h > 0, d / h, np.where(d == 0, 0.0, np.inf))
        w = np.where(u < 1, (1 - np.minimum(u, 1) ** 3) ** 3, 0.0)
        s0, s1, s2 = w.sum(1), w @ x, w @ (x * x)
        t0, t1 = w @ y, w @ (x * y)
        xc = x0[:, 0]
        det = s0 * s2 - s1 * s1
        flat = det <= 1e-12 * np.maximum(s0 * s2, 1e-300)  # all weight on one x: the weighted mean there
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(flat, 0.0, (s0 * t1 - s1 * t0) / np.where(flat, 1.0, det))
            out[start:start + chunk] = (t0 - slope * s1) / s0 + slope * xc
    return out


def grid_points(p: np.ndarray, grid: int = GRID) -> np.ndarray:
    """Where the loess is fitted: every distinct prediction when there are at most `grid`, else `grid` quantiles
    (the minimum and maximum included)."""
    p = np.asarray(p, dtype=np.float64).ravel()
    distinct = np.unique(p)
    return distinct if len(distinct) <= grid else np.unique(np.quantile(p, np.linspace(0, 1, grid)))


@dataclass(frozen=True)
class Smooth:
    """A smoothed calibration curve: the loess fitted at `x` (`y`), and each sample's smoothed value."""

    x: np.ndarray
    y: np.ndarray
    fitted: np.ndarray  # per sample (cells pooled), interpolated from (x, y)


def smooth_calibration(y: np.ndarray, p: np.ndarray, span: float = SPAN, grid: int = GRID) -> Smooth:
    y, p = np.asarray(y, dtype=np.float64).ravel(), np.asarray(p, dtype=np.float64).ravel()
    at = grid_points(p, grid)
    fit = loess(p, y, at, span)
    return Smooth(at, fit, np.interp(p, at, fit))


def e_statistics(p: np.ndarray, fitted: np.ndarray) -> dict[str, float]:
    """Eavg (ICI), E50, E90, Emax of |smoothed - predicted| over the samples (cells pooled)."""
    diff = np.abs(np.asarray(fitted, dtype=np.float64).ravel() - np.asarray(p, dtype=np.float64).ravel())
    if not diff.size:
        return {"eavg": float("nan"), "e50": float("nan"), "e90": float("nan"), "emax": float("nan")}
    return {"eavg": float(diff.mean()), "e50": float(np.median(diff)), "e90": float(np.quantile(diff, 0.9)),
            "emax": float(diff.max())}


def scaled_brier(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, counts: np.ndarray
                 ) -> dict[str, float]:
    """{value, low, high, brier, brier_null}: 1 - Brier / Brier_null with its patient-bootstrap interval."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    y2, p2 = (y[:, None], p[:, None]) if y.ndim == 1 else (y, p)
    n_units = counts.shape[1]
    inverse = np.asarray(inverse)
    sq = np.zeros((n_units, y2.shape[1]))
    pos = np.zeros((n_units, y2.shape[1]))
    np.add.at(sq, inverse, (p2 - y2) ** 2)
    np.add.at(pos, inverse, y2)
    n = np.bincount(inverse, minlength=n_units).astype(np.float64)

    def scaled(c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        total = c @ n
        with np.errstate(divide="ignore", invalid="ignore"):
            brier = (c @ sq).sum(axis=-1) / (total * y2.shape[1])
            prev = (c @ pos) / total[..., None]
            null = (prev * (1 - prev)).mean(axis=-1)
            return 1 - brier / null, brier, null

    value, brier, null = (float(v) for v in scaled(np.ones(n_units)))
    lo, hi = iv.percentile_interval(scaled(counts)[0]) if np.isfinite(value) else (float("nan"),) * 2
    if not np.isfinite(value) or iv.outside(value, lo, hi):
        lo, hi = float("nan"), float("nan")
    return {"value": value, "low": lo, "high": hi, "brier": brier, "brier_null": null}


# ----------------------------------------------------------------------------------------------- by group


@dataclass
class Cell:
    """One age band x sex cell: its counts; `withheld` (the floors' reason) or its observed and expected rate."""

    age_band: str
    sex: str
    patients: int
    samples: int
    events: int
    non_events: int
    withheld: str | None
    observed: float | None = None
    observed_low: float | None = None
    observed_high: float | None = None
    expected: float | None = None


def demographic_cells(y: np.ndarray, p: np.ndarray, units: np.ndarray, age_band: np.ndarray, sex: np.ndarray,
                      counts: np.ndarray, inverse: np.ndarray, bands: tuple[str, ...], sexes: tuple[str, ...]
                      ) -> list[Cell]:
    """Observed vs expected rate per (age band, sex) cell, cells pooled over labels for a multi-label run; the
    observed rate's 95% patient-bootstrap interval (a column subset of the run's resample counts)."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    per_y = y if y.ndim == 1 else y.sum(axis=1)
    per_p = p if p.ndim == 1 else p.sum(axis=1)
    cells_per = 1.0 if y.ndim == 1 else float(y.shape[1])
    n_units = counts.shape[1]
    out = []
    for band in bands:
        for s in sexes:
            mask = (age_band == band) & (sex == s)
            samples = int(mask.sum())
            if not samples:
                continue
            events = int(round(per_y[mask].sum()))
            non_events = int(round(samples * cells_per)) - events
            patients = int(len(np.unique(np.asarray(units)[mask])))
            why = floors.group_withheld(patients, events, non_events)
            cell = Cell(band, s, patients, samples, events, non_events, why)
            if why is None:
                num = np.bincount(inverse[mask], weights=per_y[mask], minlength=n_units)
                den = np.bincount(inverse[mask], minlength=n_units) * cells_per
                cell.observed = float(num.sum() / den.sum())
                cell.expected = float(per_p[mask].sum() / den.sum())
                with np.errstate(divide="ignore", invalid="ignore"):
                    cell.observed_low, cell.observed_high = iv.percentile_interval((counts @ num) / (counts @ den))
            out.append(cell)
    return out


@dataclass
class LabelCalibration:
    label: str
    events: int
    samples: int
    e: dict[str, float] = field(default_factory=dict)
    smooth: Smooth | None = None
    withheld: str | None = None


def per_label(y: np.ndarray, p: np.ndarray, labels: list[str]) -> list[LabelCalibration]:
    """Each label's own smoothed calibration and E-statistics, labels with most test events first; a label
    under the event floors keeps its counts and reason."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    out = []
    for j in np.argsort(-y.sum(axis=0), kind="mergesort"):
        events = int(y[:, j].sum())
        why = None
        if events < floors.MIN_GROUP_EVENTS:
            why = f"too few events ({events})"
        elif len(y) - events < floors.MIN_GROUP_NON_EVENTS:
            why = f"too few non-events ({len(y) - events})"
        item = LabelCalibration(labels[j] if j < len(labels) else str(j), events, len(y), withheld=why)
        if why is None:
            item.smooth = smooth_calibration(y[:, j], p[:, j])
            item.e = e_statistics(p[:, j], item.smooth.fitted)
        out.append(item)
    return out
