"""Operating points of a binary risk model: thresholds chosen on VALIDATION for named targets, their figures on
test with 95% patient-bootstrap intervals, a threshold grid for the dashboard's control, and a decision curve.
Pure numpy.

A sample is flagged (an alert) when its probability is >= the threshold. Targets, each chosen on validation
predictions only (ml.val_predictions):
- `sensitivity_0.80`, `sensitivity_0.90`: the highest threshold whose validation sensitivity is >= the target
  (the fewest alerts that still catch that share of validation positives);
- `ppv_0.50`: the lowest threshold whose validation PPV is >= 0.50 (the most positives caught while at least
  every second alert is a true one); unreachable on validation: no row;
- `top_10pct`: the validation 90th percentile of risk (the top 10% of validation admissions flagged).
Every target needs at least `floors.MIN_VAL_ALERTS` (10) validation alerts at its threshold (a PPV of 2 alerts is
an anecdote); a target no threshold reaches under that floor is `unreachable`, stored as a row that says why
(ml.operating_targets), never silently dropped.
On test, per threshold: sensitivity, specificity, ppv, npv, `alerts_per_100` (alerts per 100 admissions; a sample
is an admission) and `nne` (number needed to evaluate = alerts per true positive = 1 / PPV). Each is a ratio of
per-patient sums, so a resample is a matrix product (`counts @ table`); the interval is the percentile interval.
Decision curve (Vickers): net benefit at threshold probability t = TP/n - FP/n * t / (1 - t), beside treat-all
(prevalence - (1 - prevalence) * t / (1 - t)) and treat-none (0).
"""

from __future__ import annotations

import numpy as np

from dataclasses import dataclass

from medtx.evaluation.floors import MIN_VAL_ALERTS
from medtx.metrics import intervals as iv

TARGETS = (("sensitivity_0.80", "sensitivity", 0.80), ("sensitivity_0.90", "sensitivity", 0.90),
           ("ppv_0.50", "ppv", 0.50), ("top_10pct", "top", 0.10))
FIGURES = ("sensitivity", "specificity", "ppv", "npv", "alerts_per_100", "nne")
GRID = np.round(np.arange(1, 100) / 100, 2)  # the dashboard's threshold control and the decision curve


@dataclass(frozen=True)
class TargetChoice:
    target: str
    threshold: float | None  # None: unreachable
    reason: str  # why unreachable ('' when chosen)
    val_alerts: int  # validation alerts at the threshold (0 when unreachable)
    val_events: int
    val_samples: int

    @property
    def status(self) -> str:
        return "chosen" if self.threshold is not None else "unreachable"


def choose_targets(y_val: np.ndarray, p_val: np.ndarray, min_alerts: int = MIN_VAL_ALERTS) -> list[TargetChoice]:
    """Every named target, chosen on validation, or unreachable with its reason."""
    y, p = np.asarray(y_val, dtype=bool), np.asarray(p_val, dtype=np.float64)
    out = []
    for name, kind, goal in TARGETS:
        t = choose_threshold(y, p, kind, goal, min_alerts)
        alerts = int((p >= t).sum()) if t is not None else 0
        reason = "" if t is not None else _unreachable(y, p, kind, goal, min_alerts)
        out.append(TargetChoice(name, t, reason, alerts, int(y.sum()), len(y)))
    return out


def _unreachable(y: np.ndarray, p: np.ndarray, kind: str, goal: float, min_alerts: int) -> str:
    if len(y) < min_alerts:
        return f"unreachable: {len(y)} validation samples, fewer than the {min_alerts} alerts a threshold needs"
    if kind == "sensitivity" and not y.any():
        return "unreachable: no validation events"
    if kind == "ppv" and choose_threshold(y, p, kind, goal, 0) is not None:
        return f"unreachable: PPV {goal:.2f} is reached on validation only with fewer than {min_alerts} alerts"
    if kind == "ppv":
        return f"unreachable: no validation threshold reaches PPV {goal:.2f}"
    if kind == "top":
        return (f"unreachable: the top {goal:.0%} of validation is fewer than {min_alerts} alerts "
                f"({int((p >= np.quantile(p, 1.0 - goal)).sum())})")
    return f"unreachable on validation with at least {min_alerts} alerts"


def choose_threshold(y_val: np.ndarray, p_val: np.ndarray, kind: str, target: float,
                     min_alerts: int = MIN_VAL_ALERTS) -> float | None:
    """The validation threshold for one target (None when no threshold reaches it with >= `min_alerts` alerts)."""
    y, p = np.asarray(y_val, dtype=bool), np.asarray(p_val, dtype=np.float64)
    if kind == "top":
        if not len(p):
            return None
        t = float(np.quantile(p, 1.0 - target))
        return t if (p >= t).sum() >= max(min_alerts, 1) else None
    cand = np.unique(p)[::-1]  # descending: flagged = p >= cand[i]
    order = np.argsort(-p, kind="stable")
    ps, ys = p[order], y[order]
    # alerts and true positives at each distinct threshold (all samples with p >= it)
    upto = np.searchsorted(-ps, -cand, side="right")
    tp = np.r_[0, np.cumsum(ys)][upto]
    alerts = upto
    if kind == "sensitivity":
        if y.sum() == 0:
            return None
        ok = np.flatnonzero((tp / y.sum() >= target) & (alerts >= min_alerts))
        return float(cand[ok[0]]) if ok.size else None  # highest threshold reaching it
    if kind == "ppv":
        ppv = np.where(alerts > 0, tp / np.maximum(alerts, 1), 0.0)
        ok = np.flatnonzero((ppv >= target) & (alerts >= max(min_alerts, 1)))
        return float(cand[ok[-1]]) if ok.size else None  # lowest threshold keeping it
    raise ValueError(f"unknown operating-point kind {kind!r}")


def confusion_tables(y: np.ndarray, p: np.ndarray, thresholds: np.ndarray, inverse: np.ndarray,
                     n_units: int) -> dict[str, np.ndarray]:
    """Per-unit (n_units, n_thresholds) sums of tp, fp, fn, tn at each threshold."""
    y, p = np.asarray(y, dtype=bool), np.asarray(p, dtype=np.float64)
    flagged = p[:, None] >= np.asarray(thresholds)[None, :]
    out = {}
    for name, mask in (("tp", flagged & y[:, None]), ("fp", flagged & ~y[:, None]),
                       ("fn", ~flagged & y[:, None]), ("tn", ~flagged & ~y[:, None])):
        table = np.zeros((n_units, mask.shape[1]))
        np.add.at(table, inverse, mask.astype(np.float64))
        out[name] = table
    return out


def figures(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The six test figures from (k, n_thresholds) sums of tp/fp/fn/tn (k resamples, or 1 for the point)."""
    tp, fp, fn, tn = sums["tp"], sums["fp"], sums["fn"], sums["tn"]
    n = tp + fp + fn + tn
    ppv = iv._ratio(tp, tp + fp)
    return {"sensitivity": iv._ratio(tp, tp + fn), "specificity": iv._ratio(tn, tn + fp), "ppv": ppv,
            "npv": iv._ratio(tn, tn + fn), "alerts_per_100": 100 * iv._ratio(tp + fp, n),
            "nne": iv._ratio(tp + fp, tp)}


def threshold_figures(y: np.ndarray, p: np.ndarray, thresholds: np.ndarray, inverse: np.ndarray,
                      counts: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """{figure: (value, ci_low, ci_high)} arrays over `thresholds`, test split, patient bootstrap."""
    n_units = counts.shape[1]
    tables = confusion_tables(y, p, thresholds, inverse, n_units)
    point = figures({k: t.sum(axis=0)[None, :] for k, t in tables.items()})
    boot = figures({k: counts @ t for k, t in tables.items()})
    out = {}
    for name in FIGURES:
        values = boot[name]
        with np.errstate(all="ignore"):
            lo = iv.column_percentiles(values, 100 * iv.ALPHA / 2)
            hi = iv.column_percentiles(values, 100 * (1 - iv.ALPHA / 2))
        out[name] = (point[name][0], lo, hi)
    return out


def operating_points(y_val: np.ndarray, p_val: np.ndarray, y: np.ndarray, p: np.ndarray, inverse: np.ndarray,
                     counts: np.ndarray) -> list[tuple]:
    """(target, threshold, metric, value, ci_low, ci_high, val_value) rows: the named targets reachable on
    validation (`choose_targets`) and the threshold grid (target 'grid')."""
    chosen = [(c.target, c.threshold) for c in choose_targets(y_val, p_val) if c.threshold is not None]
    thresholds = np.array([t for _, t in chosen] + GRID.tolist())
    test = threshold_figures(y, p, thresholds, inverse, counts)
    val_units = np.arange(len(np.asarray(y_val)))
    val = figures({k: t.sum(axis=0)[None, :] for k, t in confusion_tables(
        y_val, p_val, thresholds[:len(chosen)], val_units, len(val_units)).items()}) if chosen else {}
    rows = []
    for i, threshold in enumerate(thresholds):
        target = chosen[i][0] if i < len(chosen) else "grid"
        for name in FIGURES:
            value, lo, hi = (float(a[i]) for a in test[name])
            val_value = float(val[name][0, i]) if i < len(chosen) else float("nan")
            rows.append((target, float(threshold), name, value, lo, hi, val_value))
    return rows


def decision_curve(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, counts: np.ndarray,
                   thresholds: np.ndarray = GRID) -> list[tuple]:
    """(threshold, net_benefit, ci_low, ci_high, treat_all) per threshold probability."""
    n_units = counts.shape[1]
    tables = confusion_tables(y, p, thresholds, inverse, n_units)
    n_unit = np.bincount(inverse, minlength=n_units).astype(np.float64)
    pos_unit = np.bincount(inverse, weights=np.asarray(y, dtype=np.float64), minlength=n_units)
    odds = thresholds / (1 - thresholds)

    def nb(tp, fp, n):
        return iv._ratio(tp, n[:, None]) - iv._ratio(fp, n[:, None]) * odds

    point = nb(tables["tp"].sum(axis=0)[None, :], tables["fp"].sum(axis=0)[None, :], np.array([n_unit.sum()]))[0]
    boot = nb(counts @ tables["tp"], counts @ tables["fp"], counts @ n_unit)
    prev = pos_unit.sum() / n_unit.sum()
    treat_all = prev - (1 - prev) * odds
    rows = []
    for i, t in enumerate(thresholds):
        lo, hi = iv.percentile_interval(boot[:, i])
        rows.append((float(t), float(point[i]), lo, hi, float(treat_all[i])))
    return rows
