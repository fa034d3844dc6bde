"""Run detail: config, training curves, per-label scores, confusion matrix and calibration of one run."""

from __future__ import annotations

import json
from pathlib import Path

import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components as ui
from dashboard import intervals as ci
from dashboard import queries, validate
from dashboard.pages.run_figures import standard_view
from dashboard.pages.run_trust import register as register_trust
from dashboard.pages.run_trust import trust_view
from medtx.tasks import find_task
from medtx.tasks.verdict import gated

PATH = "/run"
NAME = "Run detail"
MAX_LABELS = 30  # per-label bars beyond this are unreadable on a laptop screen: show the most supported


def layout(snapshot: Path, params: dict[str, str]) -> html.Div:
    problem = None
    initial = params.get("run_id")
    if initial is not None:
        try:
            initial = validate.run_id(initial)
        except validate.InvalidParameter as exc:
            problem, initial = ui.invalid(str(exc)), None
    return html.Div(
        [
            dbc.Row(
                [
                    dbc.Col(html.H3("Run detail"), md=4),
                    dbc.Col(dcc.Dropdown(id="run-select", clearable=False, placeholder="run", value=initial), md=8),
                ],
                className="mb-2 align-items-center",
            ),
            problem,
            ui.loading(None, id="run-body"),
        ]
    )


def register(app: Dash, snapshot: Path) -> None:
    register_trust(app, snapshot)  # the threshold control and the model card route (/card/<run id>)

    @app.callback(
        Output("run-select", "options"),
        Output("run-select", "value"),
        Input("snapshot-version", "data"),
        State("run-select", "value"),
    )
    def run_options(_version: str | None, current: str | None):
        runs = queries.runs_index(snapshot)
        if not runs.height:
            return [], None
        ids = runs["run_id"].to_list()
        labels = [f"{r['task']} · {r['model']} · {r['dataset'] or '-'} · seed {r['seed']} · {r['status']} · {r['run_id']}"
                  for r in runs.iter_rows(named=True)]
        return ui.options(ids, labels), current if current in ids else queries.default_run(snapshot) or ids[0]

    @app.callback(Output("run-body", "children"), Input("run-select", "value"), Input("snapshot-version", "data"))
    def body(run_id: str | None, _version: str | None):
        if not run_id:
            return ui.empty("No runs in the warehouse yet: run `medtx train` or `medtx pipeline`.")
        try:
            run_id = validate.run_id(run_id)
        except validate.InvalidParameter as exc:
            return ui.invalid(str(exc))
        return run_body(snapshot, run_id)


@queries.cached_view
def run_body(snapshot: Path, run_id: str) -> html.Div:
    run = queries.run(snapshot, run_id)
    if run is None:
        return ui.invalid(f"run {run_id} is not in the published snapshot")
    return html.Div(
        [
            _summary(run),
            _gate(snapshot, run),
            dbc.Row(
                [
                    dbc.Col(ui.card("Training and validation curves", _curves(snapshot, run_id)), lg=7),
                    dbc.Col(ui.card("Metrics", _metrics(snapshot, run_id)), lg=5),
                ]
            ),
            dbc.Row(
                [
                    dbc.Col(ui.card("Per-label / per-class scores (test)", _labels(snapshot, run_id)), lg=6),
                    dbc.Col(ui.card("Calibration (test, pooled over labels)", _calibration(snapshot, run_id)), lg=6),
                ]
            ),
            ui.card("Paired comparison with the reference baseline (test, patient bootstrap)",
                    _comparison(snapshot, run_id)),
            ui.card("Would a clinician trust it? Subgroups, calibration, operating points",
                    trust_view(snapshot, run_id)),
            ui.card("Standard figures (OHDSI PatientLevelPrediction): ROC, precision-recall, distribution, smoothed "
                    "calibration, age x sex, train / validation / test, decision curve",
                    standard_view(snapshot, run_id)),
            ui.card("Confusion matrix (test)", _confusion(snapshot, run_id)),
            ui.card("Config", html.Pre(_pretty(run["config"]), className="config small mb-0")),
        ]
    )


def _summary(run: dict) -> dbc.Alert:
    color = {"completed": "success", "failed": "danger"}.get(run["status"], "warning")
    facts = [
        f"{run['task']} · {run['model']} · dataset {run['dataset'] or '-'}" + (" (synthetic)" if run["is_synthetic"] else ""),
        f"seed {run['seed']} · device {run['device'] or '-'} · status {run['status']}",
        f"threshold {run['threshold']} ({run['threshold_source'] or '-'}) · best epoch {run['best_epoch']} · "
        f"params {run['n_params'] or '-'} · train {run['train_seconds'] or 0:.1f} s",
        f"code {run['code_version'] or '-'} · data {run['data_fingerprint'] or '-'}",
    ]
    children: list = [html.Div(f) for f in facts]
    if run["collapsed"]:
        children.append(html.Div(html.Strong(f"Collapsed: {run['collapse_reason'] or 'constant predictions'}")))
    if run["error"]:
        children.append(html.Pre(validate.public_error(run["error"], 500), className="small mb-0"))
    return dbc.Alert(children, color="warning" if run["collapsed"] else color, id="run-summary", className="small")


def _gate(snapshot: Path, run: dict) -> object:
    """The leakage gate's verdict of the run's task and dataset (tasks split by patient only)."""
    task = find_task(run["task"])  # a snapshot may hold runs of a task this version does not know
    if task is None or not gated(task):
        return None
    return ui.gate_alert(queries.leakage_gate(snapshot, run["task"], run["dataset"] or ""), id="run-gate")


def _pretty(config: object) -> str:
    if config is None:
        return "(no config recorded)"
    try:
        return json.dumps(json.loads(config) if isinstance(config, str) else config, indent=2, sort_keys=True)
    except (TypeError, ValueError):
        return str(config)


def _curves(snapshot: Path, run_id: str) -> object:
    df = queries.run_epochs(snapshot, run_id)
    if not df.height:
        return ui.empty("No per-epoch curves (baselines are fitted in one step).")
    metrics = df["metric"].unique().sort().to_list()
    line = {"type": "scatter", "mode": "lines+markers"}
    panels = [(m, ui.series(df.filter(pl.col("metric") == m).sort("split", "epoch"), "split", line, "epoch", "value"))
              for m in metrics]
    fig = ui.facets(panels, cols=3, layout={"legend": {"title": {"text": "split"}}})
    rows = (len(metrics) + 2) // 3
    return ui.graph(fig, id="curves-graph", height=260 * rows)


def _metrics(snapshot: Path, run_id: str) -> object:
    df = queries.run_metrics(snapshot, run_id)
    if not df.height:
        return ui.empty("No metrics recorded for this run.")
    return ui.grid(df.with_columns(pl.col("value", "ci_low", "ci_high", "safedrug_sd").round(4)), id="run-metrics-grid",
                   height=340)


def _comparison(snapshot: Path, run_id: str) -> object:
    """The distribution of the paired differences (same resampled patients for both runs) and the verdict."""
    df = queries.run_comparisons(snapshot, run_id)
    if not df.height:
        return ui.empty("No paired comparison: this run is the reference baseline of its task and dataset, no "
                        "non-neural baseline was recorded for it, or it was recorded before paired comparisons were kept.")
    lines = [html.Div(f"{r['metric']} ({r['averaging']}) vs {r['reference_model']} ({r['reference_run_id']}): "
                      f"{ci.verdict_text(r['verdict'], r['diff'], r['ci_low'], r['ci_high'])} · "
                      f"P(run ahead) {r['p_better']:.3f} · {r['n_units']} test units, {r['n_boot']} resamples"
                      if r["p_better"] is not None else f"{r['metric']}: {r['verdict']}", className="small")
             for r in df.iter_rows(named=True)]
    return html.Div([*lines, ui.graph(ci.difference_figure(df), id="paired-diff-graph", height=300)],
                    id="run-comparison")


def _labels(snapshot: Path, run_id: str) -> object:
    df = queries.run_label_metrics(snapshot, run_id)
    if not df.height:
        return ui.empty("No per-label scores recorded for this run.")
    top = df.select("label", "support").unique().sort("support", descending=True, nulls_last=True).head(MAX_LABELS)
    df = top.select("label").join(df, on="label", how="left", maintain_order="left")  # most supported first
    bar = {"type": "bar", "hovertemplate": "%{x} %{y:.3f} (support %{customdata})"}
    fig = {"data": ui.series(df.sort("metric", maintain_order=True), "metric", bar, "label", "value",
                             customdata="support"),
           "layout": {"barmode": "group", "xaxis": {"tickangle": -45, "type": "category",
                                                    "categoryorder": "array", "categoryarray": top["label"].to_list()},
                      "legend": {"title": {"text": "metric"}}}}
    return ui.graph(fig, id="labels-graph", height=360)


def _calibration(snapshot: Path, run_id: str) -> object:
    df = queries.run_calibration(snapshot, run_id)
    if not df.height:
        return ui.empty("No stored test predictions with probabilities for this run.")
    fig = {
        "data": [
            {"type": "scatter", "x": [0, 1], "y": [0, 1], "mode": "lines", "name": "perfect",
             "line": {"dash": "dash", "color": "grey"}},
            {"type": "scatter", "x": df["mean_prob"].to_list(), "y": df["observed"].to_list(), "mode": "lines+markers",
             "name": "model", "text": [f"n={n}" for n in df["n"].to_list()],
             "hovertemplate": "p=%{x:.2f} obs=%{y:.2f} %{text}"},
        ],
        "layout": {"xaxis": {"title": {"text": "mean predicted probability"}, "range": [0, 1]},
                   "yaxis": {"title": {"text": "observed frequency"}, "range": [0, 1]}},
    }
    return ui.graph(fig, id="calibration-graph", height=360)


def _confusion(snapshot: Path, run_id: str) -> object:
    df = queries.run_confusion(snapshot, run_id)
    if not df.height:
        return ui.empty("No confusion matrix: this is not a classification run (or nothing was recorded).")
    labels = sorted(set(df["true_label"].to_list()) | set(df["pred_label"].to_list()))
    index = {label: i for i, label in enumerate(labels)}
    matrix = [[0] * len(labels) for _ in labels]
    for true, pred, n in df.iter_rows():
        matrix[index[true]][index[pred]] = n
    heatmap = {"type": "heatmap", "z": matrix, "x": labels, "y": labels, "colorscale": ui.BLUES,
               "colorbar": {"title": {"text": "n"}},
               "hovertemplate": "true %{y}<br>predicted %{x}<br>n %{z}<extra></extra>"}
    if len(labels) <= 15:
        heatmap["texttemplate"] = "%{z}"
    fig = {"data": [heatmap], "layout": {"xaxis": {"title": {"text": "predicted"}, "type": "category"},
                                         "yaxis": {"title": {"text": "true"}, "type": "category",
                                                   "autorange": "reversed"}}}
    return ui.graph(fig, id="confusion-graph", height=max(360, 18 * len(labels) + 150))
