"""Calibration of one run's test probabilities, and post-hoc recalibration fitted on VALIDATION only. Pure numpy.

Figures (each a `Stat` of the run's patient-resample count matrix, medtx.metrics.intervals, so each carries a 95%
patient-bootstrap interval except the ECE, whose bootstrap is biased — `intervals.BIASED`):
- `citl`, calibration-in-the-large: observed minus expected event rate, mean(y) - mean(p) over samples (binary)
  or over all (sample, label) cells (multi-label); 0 when calibrated, > 0 when the model under-predicts;
- `slope`, calibration slope: b of the logistic fit y ~ a + b * logit(p); 1 when calibrated, < 1 when the
  predictions are too extreme (over-fitting), > 1 when too timid. Binary: one row per sample, exact. Multi-label:
  the cells are pooled into 20 quantile bins of logit(p) (each cell takes its bin's mean logit), so a resample
  refits on its 20 bin sums (`counts @ per-patient table`) instead of every cell; `SLOPE_BINNED` names that in ci_method;
- `brier` and the 15-bin `ece`, as in ml.metrics.
A reliability curve: 10 quantile bins of the predicted probability (cells pooled), the mean prediction and the
observed rate per bin, the observed rate with its patient-bootstrap band.

Recalibration maps a probability to a new one and is fitted on the validation predictions of the run
(ml.val_predictions) — the fitting functions take validation arrays only, and tests/test_trust.py changes the
test labels and checks the fitted maps do not move:
- `platt` (binary): logistic regression of y on logit(p);
- `isotonic` (binary): monotone step function (sklearn IsotonicRegression, clipped outside the fitted range);
- `temperature` (multi-label): one temperature T for every label, p' = sigmoid(logit(p) / T), minimising the
  validation log-loss over all cells.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from medtx.metrics import intervals as iv

EPS = 1e-6
RELIABILITY_BINS = 10
SLOPE_BINS = 20
SLOPE_BINNED = "_binned20"
METHODS = {"binary": ("platt", "isotonic"), "multilabel": ("temperature",)}


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), EPS, 1 - EPS)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def fit_logistic(x: np.ndarray, n: np.ndarray, s: np.ndarray, weights: np.ndarray, iters: int = 30,
                 tol: float = 1e-8) -> tuple[np.ndarray, np.ndarray]:
    """Weighted logistic fits y ~ a + b x, one per row of `weights` (shape (k, rows)): row r holds n[r] trials
    with s[r] successes at x[r] (`n`, `s` may also be (k, rows): per-fit tables). Newton's method from (a, b) =
    (0, 1), a calibrated model (a start nearer each resample's optimum, the split's own fit, changed which
    ill-posed resamples converge, and so the intervals of isotonic maps' slopes); (NaN, NaN) where a fit does not
    converge (separation, a single class)."""
    k = weights.shape[0]
    a, b = np.zeros(k), np.ones(k)
    wn, ws = weights * n, weights * s
    xx = x * x
    for _ in range(iters):
        # The same operations, in the same order, as mu = sigmoid(a + b x), r = ws - wn mu, v = wn mu (1 - mu),
        # written into two buffers per iteration instead of seven temporaries (bit-identical results).
        mu = b[:, None] * x
        mu += a[:, None]
        mu *= 0.5
        np.tanh(mu, out=mu)
        mu += 1.0
        mu *= 0.5
        r = wn * mu
        v = np.subtract(1.0, mu, out=mu)
        v *= r
        r = np.subtract(ws, r, out=r)  # score contributions
        g0, g1 = r.sum(axis=1), r @ x
        h00, h01, h11 = v.sum(axis=1), v @ x, v @ xx
        det = h00 * h11 - h01 * h01
        with np.errstate(invalid="ignore", divide="ignore"):
            da = (h11 * g0 - h01 * g1) / det
            db = (h00 * g1 - h01 * g0) / det
        step = np.maximum(np.abs(da), np.abs(db))
        scale = np.where(step > 5.0, 5.0 / np.where(step > 0, step, 1.0), 1.0)  # damp wild first steps
        a, b = a + scale * np.nan_to_num(da), b + scale * np.nan_to_num(db)
        if np.all(~np.isfinite(step) | (step < tol)):
            break
    bad = ~np.isfinite(a) | ~np.isfinite(b) | (np.abs(b) > 1e3) | ~np.isfinite(step) | (step > 1e-4)
    return np.where(bad, np.nan, a), np.where(bad, np.nan, b)


@dataclass(frozen=True)
class LogisticRows:
    """The data of a calibration fit. Binary: one row per sample (x = logit(p), its unit, y). Multi-label: the
    cells binned by logit(p) into SLOPE_BINS quantile bins, x = each bin's mean logit, and per-unit tables of
    cells `n` and positives `s` per bin (units x bins), so a resample's fit reads `counts @ n`, `counts @ s`."""

    x: np.ndarray
    n: np.ndarray
    s: np.ndarray
    unit: np.ndarray | None  # binary: each row's unit; None when n/s are per-unit tables


def logistic_rows(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, n_units: int) -> LogisticRows:
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    if p.ndim == 1:
        return LogisticRows(logit(p), np.ones(len(p)), y, np.asarray(inverse))
    x = logit(p).ravel()
    units = np.repeat(np.asarray(inverse), p.shape[1])
    edges = np.unique(np.quantile(x, np.linspace(0, 1, SLOPE_BINS + 1)[1:-1]))
    bins = np.searchsorted(edges, x, side="right")
    k = len(edges) + 1
    centre = np.nan_to_num(iv._ratio(np.bincount(bins, weights=x, minlength=k), np.bincount(bins, minlength=k)))
    cell = units * k + bins
    n = np.bincount(cell, minlength=n_units * k).reshape(n_units, k).astype(np.float64)
    s = np.bincount(cell, weights=y.ravel(), minlength=n_units * k).reshape(n_units, k)
    return LogisticRows(centre, n, s, None)


def slope_stat(rows: LogisticRows) -> iv.Stat:
    """The calibration slope as a Stat of the resample counts (binary: chunks of resamples bound memory)."""
    def stat(counts: np.ndarray) -> np.ndarray:
        if rows.unit is None:  # per-unit tables: each resample is a weighted fit on the bins
            return fit_logistic(rows.x, counts @ rows.n, counts @ rows.s, np.ones((counts.shape[0], 1)))[1]
        out = np.empty(counts.shape[0])
        for chunk in iv.row_chunks(counts.shape[0], len(rows.x)):
            out[chunk] = fit_logistic(rows.x, rows.n, rows.s, counts[chunk][:, rows.unit])[1]
        return out
    return stat


def citl_stat(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, n_units: int) -> iv.Stat:
    """Calibration-in-the-large, observed minus expected rate, over samples (1-D) or all label cells (2-D)."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    per_sample = (y - p) if p.ndim == 1 else (y - p).sum(axis=1)
    cells = 1.0 if p.ndim == 1 else float(p.shape[1])
    return iv.ratio_stat(per_sample, np.full(len(p), cells), inverse, n_units, empty=np.nan)


def calibration_stats(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, n_units: int) -> dict[str, iv.Stat]:
    """{metric: Stat}: citl, slope, brier, ece over samples (binary, 1-D) or all cells (multi-label, 2-D)."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    o_e = citl_stat(y, p, inverse, n_units)
    sq = (p - y) ** 2 if p.ndim == 1 else ((p - y) ** 2).mean(axis=1)
    return {"citl": o_e, "slope": slope_stat(logistic_rows(y, p, inverse, n_units)),
            "brier": iv.mean_stat(sq, inverse, n_units), "ece": iv.ece_stat(y, p, inverse, n_units)}


def calibration_figures(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, counts: np.ndarray
                        ) -> dict[str, tuple[float, float, float, str]]:
    """{metric: (value, ci_low, ci_high, ci_method)}; the ECE (and any estimate outside its own interval) without
    an interval, as ml.metrics stores it."""
    n_units = counts.shape[1]
    binned = np.asarray(p).ndim == 2
    out = {}
    for metric, stat in calibration_stats(y, p, inverse, n_units).items():
        value = iv.point(stat, n_units)
        # no resample is computed for an interval that would be withheld whatever it is (the ECE; an estimate
        # that is not finite, e.g. the slope of a model giving everyone one probability, 30 failing Newton steps
        # per resample)
        withheld = metric in iv.BIASED or not np.isfinite(value)
        lo, hi = (float("nan"),) * 2 if withheld else iv.percentile_interval(stat(counts))
        method = iv.CI_METHOD + (SLOPE_BINNED if metric == "slope" and binned else "")
        if withheld or iv.outside(value, lo, hi):
            lo, hi, method = float("nan"), float("nan"), method + iv.WITHHELD
        out[metric] = (value, lo, hi, method)
    return out


def reliability(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, counts: np.ndarray,
                n_bins: int = RELIABILITY_BINS) -> list[tuple]:
    """(bin, p_low, p_high, n, mean_pred, observed, ci_low, ci_high) per quantile bin of the predictions (cells
    pooled); the band is the patient-bootstrap interval of the observed rate."""
    y, p = np.asarray(y, dtype=np.float64), np.asarray(p, dtype=np.float64)
    n_units = counts.shape[1]
    flat_p, flat_y = p.ravel(), y.ravel()
    units = np.asarray(inverse) if p.ndim == 1 else np.repeat(np.asarray(inverse), p.shape[1])
    edges = np.unique(np.quantile(flat_p, np.linspace(0, 1, n_bins + 1)[1:-1]))
    bins = np.searchsorted(edges, flat_p, side="right")
    k = len(edges) + 1
    cell = units * k + bins
    tables = [np.bincount(cell, weights=w, minlength=n_units * k).reshape(n_units, k)
              for w in (np.ones_like(flat_p), flat_y, flat_p)]
    n_b, y_b, p_b = (t.sum(axis=0) for t in tables)
    observed = iv._ratio(counts @ tables[1], counts @ tables[0])
    lows = np.r_[flat_p.min(), edges]
    highs = np.r_[edges, flat_p.max()]
    rows = []
    for b in range(k):
        if n_b[b] == 0:
            continue
        lo, hi = iv.percentile_interval(observed[:, b])
        rows.append((b, float(lows[b]), float(highs[b]), int(n_b[b]), float(p_b[b] / n_b[b]), float(y_b[b] / n_b[b]),
                     lo, hi))
    return rows


# ----------------------------------------------------------------------------------------------- recalibration


@dataclass(frozen=True)
class Recalibrator:
    """A fitted probability map; `params` are all it needs (stored as JSON in ml.calibration)."""

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    n_fit: int = 0  # validation samples it was fitted on

    def apply(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.float64)
        if self.method == "platt":
            return sigmoid(self.params["a"] + self.params["b"] * logit(p))
        if self.method == "temperature":
            return sigmoid(logit(p) / self.params["temperature"])
        if self.method == "isotonic":
            return np.interp(p, self.params["x"], self.params["y"])
        raise ValueError(f"unknown recalibration method {self.method!r}")


def fit_platt(y_val: np.ndarray, p_val: np.ndarray) -> Recalibrator:
    y_val, x = np.asarray(y_val, dtype=np.float64).ravel(), logit(p_val).ravel()
    a, b = fit_logistic(x, np.ones(len(x)), y_val, np.ones((1, len(x))))
    if not np.isfinite(a[0]):
        raise ValueError("platt: the validation fit did not converge (one class, or separable)")
    return Recalibrator("platt", {"a": float(a[0]), "b": float(b[0])}, len(y_val))


def fit_isotonic(y_val: np.ndarray, p_val: np.ndarray) -> Recalibrator:
    from sklearn.isotonic import IsotonicRegression

    iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    iso.fit(np.asarray(p_val, dtype=np.float64).ravel(), np.asarray(y_val, dtype=np.float64).ravel())
    return Recalibrator("isotonic", {"x": [float(v) for v in iso.X_thresholds_],
                                     "y": [float(v) for v in iso.y_thresholds_]}, len(np.ravel(y_val)))


def fit_temperature(y_val: np.ndarray, p_val: np.ndarray) -> Recalibrator:
    from scipy.optimize import minimize_scalar

    y, z = np.asarray(y_val, dtype=np.float64).ravel(), logit(p_val).ravel()

    def loss(log_t: float) -> float:
        q = np.clip(sigmoid(z / np.exp(log_t)), EPS, 1 - EPS)
        return float(-(y * np.log(q) + (1 - y) * np.log1p(-q)).mean())

    res = minimize_scalar(loss, bounds=(np.log(0.05), np.log(20.0)), method="bounded", options={"xatol": 1e-6})
    return Recalibrator("temperature", {"temperature": float(np.exp(res.x))}, int(np.shape(y_val)[0]))


FITTERS = {"platt": fit_platt, "isotonic": fit_isotonic, "temperature": fit_temperature}


def fit_recalibrators(kind: str, y_val: np.ndarray, p_val: np.ndarray) -> tuple[list[Recalibrator], dict[str, str]]:
    """The recalibrators of a task kind fitted on validation arrays (the only data they are given), and
    {method: why it was not fitted}."""
    fitted, skipped = [], {}
    if np.asarray(y_val).size == 0 or len(np.unique(np.asarray(y_val))) < 2:
        return [], {m: "validation has a single class" for m in METHODS.get(kind, ())}
    for method in METHODS.get(kind, ()):
        try:
            fitted.append(FITTERS[method](y_val, p_val))
        except ValueError as exc:
            skipped[method] = str(exc)
    return fitted, skipped


# ----------------------------------------------------------------------------------------------- guards

OOF_FOLDS = 5
STATUSES = ("recommended", "not_recommended", "refused", "not_fitted")


@dataclass(frozen=True)
class RecalibrationDecision:
    """What the card says of one recalibration method: `status` (STATUSES) and its reason; `fitted` only when it was
    fitted and not refused (its test figures are then computed and shown)."""

    method: str
    status: str
    reason: str
    fitted: Recalibrator | None = None
    n_fit: int = 0
    n_events: int = 0
    oof_original: float = float("nan")  # out-of-fold validation log-loss of the original probabilities
    oof_mapped: float = float("nan")  # ... of the map fitted on the other folds


def log_loss(y: np.ndarray, p: np.ndarray) -> float:
    """Mean log-loss over samples (binary) or all cells (multi-label)."""
    y, q = np.asarray(y, dtype=np.float64).ravel(), np.clip(np.asarray(p, dtype=np.float64).ravel(), EPS, 1 - EPS)
    return float(-(y * np.log(q) + (1 - y) * np.log1p(-q)).mean())


def oof_log_loss(method: str, y_val: np.ndarray, p_val: np.ndarray, units: np.ndarray | None = None,
                 folds: int = OOF_FOLDS, seed: int = 0) -> tuple[float, float]:
    """(original, mapped) log-loss on validation, out of fold: the validation units (patients when `units` is
    given, else samples) split into `folds` folds; each fold is scored by the map fitted on the others. A fold
    whose training part has a single class or does not converge is scored with the original probabilities (the
    map is not credited for it)."""
    y, p = np.asarray(y_val, dtype=np.float64), np.asarray(p_val, dtype=np.float64)
    ids = np.arange(len(y)) if units is None else np.unique(np.asarray(units), return_inverse=True)[1].reshape(-1)
    fold_of_unit = np.random.default_rng(seed).permutation(ids.max() + 1) % folds
    fold = fold_of_unit[ids]
    mapped = p.copy()
    for k in range(folds):
        held, fit = fold == k, fold != k
        if not held.any() or len(np.unique(y[fit])) < 2:
            continue
        try:
            mapped[held] = FITTERS[method](y[fit], p[fit]).apply(p[held])
        except ValueError:
            continue
    return log_loss(y, p), log_loss(y, mapped)


def recalibration_decisions(kind: str, y_val: np.ndarray, p_val: np.ndarray, units: np.ndarray | None = None
                            ) -> list[RecalibrationDecision]:
    """One decision per method of the task kind, fitted on validation only (the floors of
    medtx.evaluation.floors first; a Platt map with slope <= 0 is refused: it reverses the ranking); a fitted map
    is recommended only when it lowers the out-of-fold validation log-loss, and then only the one that lowers it
    most."""
    from medtx.evaluation.floors import recalibration_withheld

    y = np.asarray(y_val, dtype=np.float64)
    n_fit = int(np.shape(y)[0]) if y.size else 0
    events = int(y.sum())
    why = recalibration_withheld(events, int(y.size) - events)
    out: list[RecalibrationDecision] = []
    for method in METHODS.get(kind, ()):
        if why is not None:
            out.append(RecalibrationDecision(method, "not_fitted", why, None, n_fit, events))
            continue
        try:
            fitted = FITTERS[method](y_val, p_val)
        except ValueError as exc:
            out.append(RecalibrationDecision(method, "not_fitted", f"not fitted: {exc}", None, n_fit, events))
            continue
        if method == "platt" and fitted.params["b"] <= 0:
            out.append(RecalibrationDecision(
                method, "refused", f"refused: slope {fitted.params['b']:.3f} <= 0 would reverse the ranking "
                "(higher risk mapped to lower probability)", None, n_fit, events))
            continue
        original, mapped = oof_log_loss(method, y_val, p_val, units)
        if mapped < original:
            status, reason = "recommended", (f"lowers the out-of-fold validation log-loss from {original:.4f} to "
                                             f"{mapped:.4f}")
        else:
            status, reason = "not_recommended", (f"does not lower the out-of-fold validation log-loss ({mapped:.4f} "
                                                 f"vs {original:.4f} for the original probabilities)")
        out.append(RecalibrationDecision(method, status, reason, fitted, n_fit, events, original, mapped))
    best = min((d for d in out if d.status == "recommended"), key=lambda d: d.oof_mapped, default=None)
    return [d if d.status != "recommended" or d is best else RecalibrationDecision(
        d.method, "not_recommended", f"{d.reason}, but {best.method} lowers it more", d.fitted, d.n_fit, d.n_events,
        d.oof_original, d.oof_mapped) for d in out]
