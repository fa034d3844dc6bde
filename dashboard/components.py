"""Small UI building blocks shared by the pages: empty states, cards, tables, figure styling."""

from __future__ import annotations

from pathlib import Path

import dash_ag_grid as dag
import dash_bootstrap_components as dbc
import plotly.graph_objects as go
import polars as pl
from dash import dcc, html

FIGURE_MARGIN = dict(l=50, r=20, t=40, b=40)


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


def graph(figure: go.Figure, *, id: str, height: int = 360) -> dcc.Graph:
    figure.update_layout(height=height, margin=FIGURE_MARGIN, template="plotly_white")
    return dcc.Graph(id=id, figure=figure, config={"displaylogo": False, "responsive": True})


def loading(children: object, *, id: str) -> dcc.Loading:
    """Spinner while a slow callback fills `children` (delay_show avoids flicker on fast ones)."""
    return dcc.Loading(html.Div(children, id=id), type="default", delay_show=200)


def options(values: list[object], labels: list[str] | None = None) -> list[dict]:
    labels = labels or [str(v) for v in values]
    return [{"label": label, "value": value} for label, value in zip(labels, values, strict=True)]
