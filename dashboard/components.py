"""Small UI building blocks shared by the pages: empty states, cards, tables, figure styling."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import dash_ag_grid as dag
import dash_bootstrap_components as dbc
import plotly.colors
import plotly.graph_objects as go
import plotly.io as pio
import polars as pl
from dash import dcc, html

FIGURE_MARGIN = {"l": 50, "r": 20, "t": 40, "b": 40}
# Plotly's default qualitative colours, assigned by series name so a series keeps its colour in every panel.
COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff",
          "#fecb52")
# Light -> dark, as plotly.py's "Blues": plotly.js's own "Blues" runs dark -> light, so a figure sent as a
# plain dict names the scale explicitly.
BLUES = plotly.colors.make_colorscale(plotly.colors.sequential.Blues)


def no_snapshot(snapshot: Path) -> dbc.Alert:
    """What every page shows before the first publish: what is missing and how to make it."""
    return dbc.Alert(
        [
            html.H4("No published warehouse yet", className="alert-heading"),
            html.P(["The dashboard reads the snapshot ", html.Code(str(snapshot)), ", which does not exist yet."]),
            html.P(
                [
                    "Run ",
                    html.Code("medtx pipeline"),
                    " (or any stage that publishes). This page picks the snapshot up as soon as it appears.",
                ],
                className="mb-0",
            ),
        ],
        color="info",
        id="empty-state",
    )


def empty(message: str) -> dbc.Alert:
    """An in-page empty state: a sentence, never a traceback."""
    return dbc.Alert(message, color="light", className="text-muted mb-2 empty-note")


def invalid(message: str) -> dbc.Alert:
    return dbc.Alert(message, color="warning", className="mb-2 invalid-parameter")


GATE_COLORS = {"pass": "success", "suspect": "warning", "blocked": "danger"}


def gate_alert(gate: dict | None, *, id: str) -> dbc.Alert:
    """The leakage gate's verdict of a task on a dataset (medtx.tasks.leakage) as one line: blocked (trainings
    refused), suspect (a single feature gives the label away and no person acknowledged it: verdicts are
    suspect), pass, or no record."""
    if gate is None:
        return dbc.Alert("Leakage gate: no record for this task and dataset (not gated, or samples built before it).",
                         color="secondary", className="py-2 small", id=id)
    status = gate["status"]
    lead = {"pass": "Leakage gate: pass.", "suspect": "Leakage gate: SUSPECT - verdicts below are suspect.",
            "blocked": "Leakage gate: BLOCKED - trainings of this task are refused."}[status]
    return dbc.Alert([html.Strong(lead), " ", gate["message"]], color=GATE_COLORS[status], className="py-2 small",
                     id=id)


def card(title: str, body: object, *, id: str | None = None) -> dbc.Card:
    return dbc.Card(
        [dbc.CardHeader(title, className="fw-semibold"), dbc.CardBody(body)],
        className="mb-3 shadow-sm",
        **({"id": id} if id else {}),
    )


def stat(label: str, value: object) -> dbc.Col:
    return dbc.Col(
        html.Div(
            [html.Div(f"{value:,}" if isinstance(value, int) else str(value), className="stat-value"),
             html.Div(label, className="stat-label")],
            className="stat",
        ),
        xs=6,
        md=3,
    )


def grid(df: pl.DataFrame, *, id: str, height: int = 320, column_defs: list[dict] | None = None) -> dag.AgGrid:
    """A sortable, filterable AG Grid of a polars frame (datetimes as ISO text)."""
    rows = df.with_columns(pl.col(pl.Datetime, pl.Date).dt.to_string("%Y-%m-%d %H:%M")).to_dicts()
    return dag.AgGrid(
        id=id,
        rowData=rows,
        columnDefs=column_defs or [{"field": c, "headerName": c.replace("_", " ")} for c in df.columns],
        defaultColDef={"sortable": True, "filter": True, "resizable": True, "minWidth": 90},
        columnSize="responsiveSizeToFit",
        dashGridOptions={"animateRows": False, "domLayout": "normal"},
        style={"height": f"{height}px"},
        className="ag-theme-alpine",
    )


Figure = go.Figure | dict


@functools.cache
def _template() -> dict:
    """The plotly_white template as plain JSON, built once (validating it per figure costs ~30-50 ms)."""
    return pio.templates["plotly_white"].to_plotly_json()


def graph(figure: Figure, *, id: str, height: int = 360) -> dcc.Graph:
    """A responsive graph. Figures travel as plain dicts: plotly.py's per-property validation (and
    plotly.express) cost 50-200 ms a figure on a busy 2-core machine, more than the query behind it."""
    spec = figure.to_plotly_json() if isinstance(figure, go.Figure) else figure
    spec["layout"] = {**spec.get("layout", {}), "height": height, "margin": FIGURE_MARGIN, "template": _template()}
    return dcc.Graph(id=id, figure=spec, config={"displaylogo": False, "responsive": True})


def color_of(names: list[str]) -> dict[str, str]:
    """A fixed colour per series name (in first-seen order)."""
    return {name: COLORS[i % len(COLORS)] for i, name in enumerate(dict.fromkeys(names))}


def series(df: pl.DataFrame, by: str, trace: dict, x: str, y: str, **columns: str) -> list[dict]:
    """One trace dict per value of `by` (in first-seen order), coloured by `color_of`; `columns` maps
    further trace properties to frame columns (e.g. text="n")."""
    colors = color_of(df[by].to_list()) if df.height else {}
    traces = []
    for name, part in df.group_by(by, maintain_order=True):
        name = name[0]
        color = colors[name]
        style = {"marker": {"color": color}} if trace.get("type") == "bar" else {
            "marker": {"color": color}, "line": {"color": color}}
        traces.append({**trace, "name": str(name), "legendgroup": str(name), "x": part[x].to_list(),
                       "y": part[y].to_list(), **style,
                       **{prop: part[col].to_list() for prop, col in columns.items()}})
    return traces


def facets(panels: list[tuple[str, list[dict]]], *, cols: int, gap: tuple[float, float] = (0.06, 0.12),
           layout: dict | None = None) -> dict:
    """Small multiples as a plain figure: one titled axis pair per panel, `cols` panels a row.

    What plotly.express's facet_col / make_subplots draw, without their validation cost. A series
    (legendgroup) shows in the legend once.
    """
    rows = max(1, math.ceil(len(panels) / cols))
    spec: dict = {"data": [], "layout": {"annotations": [], "showlegend": True, **(layout or {})}}
    seen: set[str] = set()
    for i, (title, traces) in enumerate(panels):
        row, col = divmod(i, cols)
        suffix = "" if i == 0 else str(i + 1)
        x0, x1 = col / cols + gap[0] / 2, (col + 1) / cols - gap[0] / 2
        # Vertical gaps only between rows: the top row's titles sit in the top margin, as in plotly.express.
        y1 = 1 - row / rows - (gap[1] / 2 if row else 0)
        y0 = 1 - (row + 1) / rows + (gap[1] / 2 if row < rows - 1 else 0)
        spec["layout"][f"xaxis{suffix}"] = {"domain": [max(0.0, x0), min(1.0, x1)], "anchor": f"y{suffix}"}
        spec["layout"][f"yaxis{suffix}"] = {"domain": [max(0.0, y0), min(1.0, y1)], "anchor": f"x{suffix}"}
        spec["layout"]["annotations"].append({"text": title, "x": (x0 + x1) / 2, "y": y1, "xref": "paper",
                                              "yref": "paper", "xanchor": "center", "yanchor": "bottom",
                                              "showarrow": False, "font": {"size": 12}})
        for trace in traces:
            group = trace.get("legendgroup")
            spec["data"].append({**trace, "xaxis": f"x{suffix}", "yaxis": f"y{suffix}",
                                 "showlegend": bool(group) and group not in seen})
            if group:
                seen.add(group)
    return spec


def loading(children: object, *, id: str) -> dcc.Loading:
    """Spinner while a slow callback fills `children` (delay_show avoids flicker on fast ones)."""
    return dcc.Loading(html.Div(children, id=id), type="default", delay_show=200)


def options(values: list[object], labels: list[str] | None = None) -> list[dict]:
    labels = labels or [str(v) for v in values]
    return [{"label": label, "value": value} for label, value in zip(labels, values, strict=True)]
