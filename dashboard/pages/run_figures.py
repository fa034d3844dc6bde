"""Run detail, the standard figures (OHDSI PatientLevelPrediction): ROC and precision-recall curves, the prediction
distribution by outcome, smoothed calibration with the histogram of predictions and the E-statistics, calibration
by age band x sex, scaled Brier, train vs validation vs test, per-label calibration of a multi-label run, and the
decision curve. The same numbers and drawings as the model card's `standard-figures` section
(medtx.evaluation.plp_card), computed from the published snapshot when the page is drawn; a figure with nothing
to draw is a sentence, never empty axes."""

from __future__ import annotations

import base64
from pathlib import Path

import dash_bootstrap_components as dbc
import polars as pl
from dash import html

from dashboard import components as ui
from dashboard.queries import trust as tq
from dashboard.queries.core import open_snapshot, query


def _img(svg: str, title: str) -> html.Img:
    return html.Img(src="data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode(), alt=title,
                    title=title, className="plp-figure me-2 mb-2", style={"maxWidth": "100%"})


def _table(head: list[str], rows: list[list[str]]) -> dbc.Table:
    return dbc.Table([html.Thead(html.Tr([html.Th(h) for h in head])),
                      html.Tbody([html.Tr([html.Td(c) for c in r]) for r in rows])],
                     bordered=True, size="sm", className="small w-auto")


def standard_view(snapshot: Path, run_id: str) -> html.Div:
    from medtx.evaluation.plp_card import TRAIN_NOTE, standard_figures

    con = open_snapshot(snapshot)
    try:
        std = standard_figures(con, run_id)
    finally:
        con.close()
    figures, notes = [], []
    for panel in std.panels:
        if panel.svg:
            figures.append(html.Div(_img(panel.svg, panel.title), id=f"plp-{panel.id}", className="d-inline-block"))
            if panel.caption:
                notes.append(html.Div(f"{panel.title}: {panel.caption}", className="small text-muted"))
        else:
            notes.append(ui.empty(f"{panel.title}: {panel.note}"))
    figures.append(decision_view(snapshot, run_id))
    return html.Div([html.Div(figures), *notes, *[html.P(p, className="small") for p in (TRAIN_NOTE, *std.paragraphs)],
                     *[_table(h, r) for h, r in std.tables]], id="run-standard-figures")


def decision_view(snapshot: Path, run_id: str) -> object:
    """The decision curve: the model's net benefit and treat-all's, both cut at the same floor (minus the test
    prevalence), treat-none the 0 line with its tick."""
    curve = tq.decision_curve(snapshot, run_id)
    if not curve.height:
        return ui.empty("Decision curve: none stored (binary runs with validation predictions only).")
    prevalence = query(snapshot, "SELECT avg(CAST(y_true AS DOUBLE)) AS p FROM ml.predictions WHERE run_id = ?",
                       [run_id])
    prev = prevalence["p"][0] if prevalence.height and prevalence["p"][0] is not None else 0.05
    shown = curve.filter(pl.col("threshold") <= 0.5)
    floor, top = -prev, max(prev, 0.01)
    clip = lambda col: [None if v is None else max(v, floor) for v in shown[col].to_list()]  # noqa: E731
    t = shown["threshold"].to_list()
    fig = {"data": [
        {"type": "scatter", "x": t, "y": clip("net_benefit"), "mode": "lines", "name": "model",
         "line": {"color": "#1f77b4"}},
        {"type": "scatter", "x": t, "y": clip("treat_all"), "mode": "lines", "name": "treat all",
         "line": {"color": "#ff7f0e"}},
        {"type": "scatter", "x": t, "y": [0.0] * len(t), "mode": "lines", "name": "treat none",
         "line": {"color": "#7f7f7f", "dash": "dash"}}],
        "layout": {"title": {"text": f"Decision curve (test; both curves cut at {floor:.3f})"},
                   "xaxis": {"title": {"text": "threshold probability"}},
                   "yaxis": {"title": {"text": "net benefit"}, "range": [floor * 1.05, top * 1.05],
                             "zeroline": True, "tick0": 0, "dtick": _step(top - floor)}}}
    return html.Div(ui.graph(fig, id="decision-graph", height=320), className="d-inline-block",
                    style={"width": "480px", "maxWidth": "100%", "verticalAlign": "top"})


def _step(span: float) -> float:
    """A round tick step giving about 4 ticks over span, 0 among them (tick0 = 0)."""
    for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5):
        if span / step <= 5:
            return step
    return 1.0
