"""Run detail, "would a clinician trust it?": the subgroup forest plot and the largest gap, the reliability curve
before/after recalibration (fitted on validation), the operating-point table with a threshold control, and a link
to the run's model card (served at /card/<run id>, rendered from the snapshot by medtx.evaluation.card)."""

from __future__ import annotations

from pathlib import Path

import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, dcc, html

from dashboard import components as ui
from dashboard import validate
from dashboard.queries import trust as tq
from dashboard.queries.core import open_snapshot

CARD_PATH = "/card/"
FIGURES = ("sensitivity", "specificity", "ppv", "npv", "alerts_per_100", "nne")
METHOD_COLOURS = {"none": "#d62728", "platt": "#1f77b4", "isotonic": "#2ca02c", "temperature": "#9467bd"}


def _ci(value, lo, hi, digits: int = 3) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None and hi is not None \
        else f"{value:.{digits}f}"


def trust_view(snapshot: Path, run_id: str) -> html.Div:
    """The section of the run page; an empty state for runs without these figures."""
    link = html.A("Model card (one page, printable)", href=f"{CARD_PATH}{run_id}", target="_blank", id="card-link",
                  className="btn btn-outline-primary btn-sm mb-2")
    groups = tq.subgroups(snapshot, run_id)
    if not groups.height:
        return html.Div([link, ui.empty("No subgroup, calibration or operating-point figures: they are computed for "
                                        "binary and multi-label EHR runs.")], id="run-trust")
    return html.Div([
        link,
        dbc.Row([dbc.Col(ui.card("Subgroups (test, 95% patient-bootstrap intervals)",
                                 _forest(snapshot, run_id, groups)), lg=7),
                 dbc.Col(ui.card("Calibration before/after recalibration (fitted on validation)",
                                 _reliability(snapshot, run_id)), lg=5)]),
        ui.card("Operating points (thresholds chosen on validation; each cell: validation / test [95% CI])",
                _operating(snapshot, run_id)),
    ], id="run-trust")


def _forest(snapshot: Path, run_id: str, groups: pl.DataFrame) -> object:
    metric = groups["metric"][0]
    preferred = ("auroc", "pr_auc_samples")
    for m in preferred:
        if m in groups["metric"].to_list():
            metric = m
            break
    rows = groups.filter((pl.col("metric") == metric) & (pl.col("attribute") != "overall"))
    shown = rows.filter(~pl.col("too_small") & pl.col("value").is_not_null())
    small = rows.filter(pl.col("too_small"))
    labels = [f"{a}: {g}" for a, g in zip(shown["attribute"], shown["grp"], strict=True)]
    plot = ui.empty(f"No group reaches the floors (30 test patients, 10 events, 10 non-events): no {metric} to "
                    "plot per group.") if not shown.height else None
    fig = {"data": [{"type": "scatter", "mode": "markers", "x": shown["value"].to_list(), "y": labels,
                     "error_x": {"type": "data", "symmetric": False,
                                 "array": (shown["ci_high"] - shown["value"]).to_list(),
                                 "arrayminus": (shown["value"] - shown["ci_low"]).to_list()},
                     "text": [f"n={n} patients · {v or 'no verdict'}" for n, v in
                              zip(shown["n_patients"], shown["verdict"], strict=True)],
                     "hovertemplate": "%{y}: %{x:.3f} %{text}<extra></extra>", "name": metric}],
           "layout": {"xaxis": {"title": {"text": f"{metric} (test)"}}, "yaxis": {"autorange": "reversed",
                                                                                  "type": "category"},
                      "showlegend": False}}
    gaps = tq.subgroup_gaps(snapshot, run_id)
    lines = []
    for g in gaps.iter_rows(named=True):
        if not g["largest"]:
            continue
        lines.append(html.Div(
            f"Largest {g['metric']} gap: {g['attribute']} {g['group_high']} − {g['group_low']} = "
            f"{_ci(g['gap'], g['ci_low'], g['ci_high'])} (simultaneous interval) · "
            + ("DETECTED" if g["detected"] else "no detectable gap"), className="small"))
    if small.height:
        lines.append(html.Div("Withheld (below the floors: 30 test patients, 10 events, 10 non-events; no figure): "
                              + ", ".join(f"{a}: {g} ({n} patients, {e} events)" for a, g, n, e in zip(
                                  small["attribute"], small["grp"], small["n_patients"], small["n_positives"],
                                  strict=True)), className="small text-muted"))
    return html.Div([plot or ui.graph(fig, id="subgroup-forest", height=max(260, 22 * len(labels) + 80)),
                     html.Div(lines, id="subgroup-gap")])


def _reliability(snapshot: Path, run_id: str) -> object:
    rel = tq.reliability(snapshot, run_id)
    cal = tq.calibration(snapshot, run_id)
    if not rel.height:
        return ui.empty("No calibration figures (truncated predictions or no validation predictions).")
    data = [{"type": "scatter", "x": [0, 1], "y": [0, 1], "mode": "lines", "name": "perfect",
             "line": {"dash": "dash", "color": "grey"}}]
    for method in rel["method"].unique(maintain_order=True).to_list():
        pts = rel.filter(pl.col("method") == method)
        colour = METHOD_COLOURS.get(method, "#333")
        name = "before (model)" if method == "none" else f"after: {method}"
        data.append({"type": "scatter", "x": pts["mean_pred"].to_list(), "y": pts["observed"].to_list(),
                     "mode": "lines+markers", "name": name, "line": {"color": colour},
                     "error_y": {"type": "data", "symmetric": False,
                                 "array": (pts["ci_high"] - pts["observed"]).to_list(),
                                 "arrayminus": (pts["observed"] - pts["ci_low"]).to_list(), "color": colour}})
    fig = {"data": data, "layout": {"xaxis": {"title": {"text": "mean predicted probability"}},
                                    "yaxis": {"title": {"text": "observed rate"}}}}
    rows = []
    for method in cal["method"].unique(maintain_order=True).to_list():
        c = {r["metric"]: r for r in cal.filter(pl.col("method") == method).iter_rows(named=True)}
        rows.append({"method": method, **{m: _ci(c[m]["value"], c[m]["ci_low"], c[m]["ci_high"]) if m in c else "–"
                                          for m in ("ece", "brier", "citl", "slope")}})
    return html.Div([ui.graph(fig, id="reliability-graph", height=340),
                     ui.grid(pl.DataFrame(rows), id="calibration-grid", height=170)])


def _operating(snapshot: Path, run_id: str) -> object:
    ops = tq.operating_points(snapshot, run_id)
    if not ops.height:
        return ui.empty("No operating points: they are computed for binary tasks with validation predictions.")
    named = ops.filter(pl.col("target") != "grid")
    status = {r["target"]: r for r in tq.operating_targets(snapshot, run_id).iter_rows(named=True)}
    rows = []
    for target in named["target"].unique(maintain_order=True).to_list():
        t = {r["metric"]: r for r in named.filter(pl.col("target") == target).iter_rows(named=True)}
        digits = {f: 1 if f in ("alerts_per_100", "nne") else 3 for f in FIGURES}
        rows.append({"target": target, "threshold": round(next(iter(t.values()))["threshold"], 4),
                     "validation alerts": status[target]["val_alerts"] if target in status else None,
                     **{f: (f"{t[f]['val_value']:.{digits[f]}f} / " if t[f]["val_value"] is not None else "")
                        + _ci(t[f]["value"], t[f]["ci_low"], t[f]["ci_high"], digits[f]) for f in FIGURES if f in t}})
    rows += [{"target": name, "threshold": None, "validation alerts": r["val_alerts"], FIGURES[0]: r["reason"]}
             for name, r in status.items() if r["status"] == "unreachable"]
    grid = ops.filter(pl.col("target") == "grid")
    marks = {round(x, 2): f"{x:.1f}" for x in (0.1, 0.3, 0.5, 0.7, 0.9)}
    control = html.Div([
        html.Label("Threshold, exploratory: test figures at any threshold (not chosen on validation, unlike the "
                   "rows above); 95% patient-bootstrap intervals", className="small"),
        dcc.Slider(id="threshold-slider", min=0.01, max=0.99, step=0.01, value=0.5, marks=marks,
                   tooltip={"placement": "bottom", "always_visible": False}),
        dcc.Store(id="threshold-run", data=run_id),
        html.Div(_threshold_line(grid, 0.5), id="threshold-figures", className="small"),
    ]) if grid.height else None
    return html.Div([ui.grid(pl.DataFrame(rows), id="operating-grid", height=200), control])


def _threshold_line(grid: pl.DataFrame, threshold: float) -> str:
    at = grid.filter((pl.col("threshold") - threshold).abs() < 1e-9)
    if not at.height:
        return f"threshold {threshold:.2f}: no figures stored"
    f = {r["metric"]: r for r in at.iter_rows(named=True)}
    parts = [f"{name} {_ci(f[name]['value'], f[name]['ci_low'], f[name]['ci_high'], 1 if name in ('alerts_per_100', 'nne') else 3)}"
             for name in FIGURES if name in f]
    return f"threshold {threshold:.2f}: " + " · ".join(parts)


def register(app: Dash, snapshot: Path) -> None:
    @app.callback(Output("threshold-figures", "children"), Input("threshold-slider", "value"),
                  Input("threshold-run", "data"), prevent_initial_call=True)
    def at_threshold(value: float | None, run_id: str | None):
        if value is None or not run_id:
            return ""
        run_id = validate.run_id(run_id)
        ops = tq.operating_points(snapshot, run_id)
        return _threshold_line(ops.filter(pl.col("target") == "grid"), round(float(value), 2))

    def card(run_id: str):
        from medtx.evaluation.card import render

        plain = {"Content-Type": "text/plain; charset=utf-8"}  # an echoed id is never read as markup
        try:
            run_id = validate.run_id(run_id)
        except validate.InvalidParameter as exc:
            return validate.public_error(exc), 400, plain
        con = open_snapshot(snapshot)
        try:
            page, _ = render(con, run_id)
        except ValueError as exc:
            return validate.public_error(str(exc)), 404, plain
        finally:
            con.close()
        return page, 200, {"Content-Type": "text/html; charset=utf-8"}

    app.server.add_url_rule(f"{CARD_PATH}<run_id>", "model_card", card)
