"""Intervals and paired verdicts on the dashboard: the forest plot of a task/dataset, the verdict
badge text and colours, the seed grouping of leaderboard rows, and the run detail's paired-difference histogram.
Pure functions of query results (plain figure dicts, see components.graph)."""

from __future__ import annotations

import numpy as np
import polars as pl

from medtx.metrics.intervals import MIN_UNITS

VERDICT_COLORS = {"better": "#198754", "worse": "#dc3545", "no_detectable_difference": "#6c757d",
                  "too_small": "#ffc107", "reference": "#0d6efd"}
VERDICT_LABELS = {"better": "better", "worse": "worse", "no_detectable_difference": "no detectable difference",
                  "too_small": "too small to compare", "reference": "reference baseline"}


def fmt_ci(value: float | None, lo: float | None, hi: float | None) -> str:
    """`0.780 [0.771, 0.789]`; the value alone when no interval was stored."""
    if value is None:
        return ""
    return f"{value:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else "")


def fmt_diff(diff: float, lo: float | None, hi: float | None) -> str:
    """`+0.004 [+0.001, +0.007]`: a paired difference with its interval; the difference alone without one."""
    return f"{diff:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None and hi is not None else "")


def verdict_text(verdict: str | None, diff: float | None, lo: float | None, hi: float | None) -> str:
    """Badge text: the verdict and the paired difference with its interval (no numbers when too small)."""
    if not verdict:
        return ""
    label = VERDICT_LABELS.get(verdict, verdict)
    if verdict == "too_small" or diff is None:
        return label
    return f"{label} ({fmt_diff(diff, lo, hi)})"


def badge_rules() -> dict:
    """AG Grid cellClassRules: one class per verdict (coloured in assets/intervals.css)."""
    return {f"verdict-{v}": f"params.data && params.data.verdict === '{v}'" for v in VERDICT_COLORS}


def too_small(n_units: int | None) -> bool:
    return n_units is not None and n_units < MIN_UNITS


def group_seeds(rows: list[dict], metric_fields: list[str]) -> list[dict]:
    """One row per (model label, config) across seeds: mean ± sd over seeds of each metric; the verdict only
    when every seed's verdict agrees (else 'seeds disagree'). Rows carry `group_key` (model + config)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row.get("group_key") or row["model"], []).append(row)
    out = []
    for members in groups.values():
        first = dict(members[0])
        first["seed"] = f"{len(members)} seeds" if len(members) > 1 else first["seed"]
        for field in metric_fields:
            values = [m.get(field) for m in members if m.get(field) is not None]
            first[field] = float(np.mean(values)) if values else None
            first[field + "_seed_sd"] = float(np.std(values, ddof=1)) if len(values) > 1 else None
            if len(members) > 1:  # per-seed intervals do not describe a mean over seeds
                first[field + "_lo"] = first[field + "_hi"] = None
        verdicts = {m.get("verdict") for m in members}
        if len(members) > 1:
            first["verdict"] = verdicts.pop() if len(verdicts) == 1 else "seeds_disagree"
            first["verdict_text"] = (VERDICT_LABELS.get(first["verdict"], first["verdict"])
                                     if first["verdict"] != "seeds_disagree" else "seeds disagree: no verdict")
        out.append(first)
    return out


def forest_figure(metrics: pl.DataFrame, runs: pl.DataFrame, metric: str, reference_run_id: str | None) -> dict:
    """One row per run (model · seed) with its 95% interval as whiskers on `metric`; the reference baseline's
    interval as a shaded band; the oracle (synthetic cohorts) as a dashed line."""
    part = metrics.filter(pl.col("metric") == metric).join(
        runs.select("run_id", "model", "seed"), on="run_id", how="inner").sort("value", nulls_last=True)
    if not part.height:
        return {"data": [], "layout": {"title": {"text": f"no test {metric} to plot"}}}
    labels = [f"{m} · s{s}" if s is not None else m for m, s in zip(part["model"], part["seed"], strict=True)]
    value = part["value"].to_list()
    lo = [v - low if v is not None and low is not None else None for v, low in zip(value, part["ci_low"], strict=True)]
    hi = [high - v if v is not None and high is not None else None for v, high in zip(value, part["ci_high"],
                                                                                         strict=True)]
    colors = [VERDICT_COLORS["reference"] if r == reference_run_id else VERDICT_COLORS.get(v or "", "#343a40")
              for r, v in zip(part["run_id"], part["verdict"], strict=True)]
    traces = [{"type": "scatter", "mode": "markers", "x": value, "y": labels, "name": metric,
               "marker": {"color": colors, "size": 9},
               "error_x": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo, "thickness": 1.5},
               "hovertemplate": "%{y}: %{x:.3f}<extra></extra>"}]
    shapes = []
    ref = part.filter(pl.col("run_id") == reference_run_id) if reference_run_id else part.clear()
    if ref.height and ref["ci_low"][0] is not None:
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": ref["ci_low"][0], "x1": ref["ci_high"][0],
                       "y0": 0, "y1": 1, "fillcolor": VERDICT_COLORS["reference"], "opacity": 0.12, "line": {"width": 0}})
    oracle = part.filter(pl.col("model") == "oracle")
    if oracle.height:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": oracle["value"][0],
                       "x1": oracle["value"][0], "y0": 0, "y1": 1, "line": {"dash": "dash", "color": "#6f42c1"}})
    return {"data": traces, "layout": {
        "title": {"text": f"test {metric}, 95% patient-bootstrap interval (band: reference baseline)"},
        "xaxis": {"title": {"text": metric}}, "yaxis": {"automargin": True}, "shapes": shapes, "showlegend": False}}


def difference_figure(comparisons: pl.DataFrame) -> dict:
    """Histogram of the paired bootstrap differences (run - reference), one panel colour per metric, with 0 and
    the percentile interval marked."""
    traces, shapes = [], []
    for row in comparisons.iter_rows(named=True):
        diffs = row["diffs"] or []
        name = f"{row['metric']} ({row['averaging']})"
        traces.append({"type": "histogram", "x": diffs, "name": name, "opacity": 0.6, "nbinsx": 40})
        for x in (row["ci_low"], row["ci_high"]):
            if x is not None:
                shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                               "line": {"dash": "dot", "width": 1}})
    shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": 0, "x1": 0, "y0": 0, "y1": 1,
                   "line": {"color": "#dc3545", "width": 2}})
    return {"data": traces, "layout": {"barmode": "overlay", "shapes": shapes,
                                       "xaxis": {"title": {"text": "run − reference (paired resamples)"}},
                                       "yaxis": {"title": {"text": "resamples"}}}}
