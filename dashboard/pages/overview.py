"""Overview: cohort and data-quality figures of one dataset, and the last pipeline run."""

from __future__ import annotations

from pathlib import Path

import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components as ui
from dashboard import queries, validate

PATH = "/"
NAME = "Overview"


def layout(snapshot: Path, params: dict[str, str]) -> html.Div:
    return html.Div(
        [
            dbc.Row(
                [
                    dbc.Col(html.H3("Overview"), md=8),
                    dbc.Col(dcc.Dropdown(id="overview-dataset", clearable=False, placeholder="dataset",
                                         value=params.get("dataset")), md=4),
                ],
                className="mb-2 align-items-center",
            ),
            html.Div(id="overview-pipeline"),
            ui.loading(None, id="overview-body"),
        ]
    )


def register(app: Dash, snapshot: Path) -> None:
    @app.callback(
        Output("overview-dataset", "options"),
        Output("overview-dataset", "value"),
        Input("snapshot-version", "data"),
        State("overview-dataset", "value"),
    )
    def dataset_options(_version: str | None, current: str | None):
        names = queries.datasets(snapshot)
        value = current if current in names else (names[0] if names else None)
        return ui.options(names), value

    @app.callback(Output("overview-pipeline", "children"), Input("snapshot-version", "data"))
    def pipeline(_version: str | None):
        return pipeline_card(snapshot)

    @app.callback(
        Output("overview-body", "children"),
        Input("overview-dataset", "value"),
        Input("snapshot-version", "data"),
    )
    def body(dataset: str | None, _version: str | None):
        if not dataset:
            return ui.empty("No dataset in the warehouse yet: run `medtx ingest` or `medtx pipeline`.")
        try:
            dataset = validate.dataset(dataset)
        except validate.InvalidParameter as exc:
            return ui.invalid(str(exc))
        return dataset_body(snapshot, dataset)


@queries.cached_view
def pipeline_card(snapshot: Path) -> dbc.Alert:
    last = queries.last_pipeline_run(snapshot)
    counts = queries.run_status_counts(snapshot)
    runs = ", ".join(f"{n} {s}" for s, n in counts.iter_rows()) if counts.height else "no training runs yet"
    if last is None:
        return dbc.Alert(f"No pipeline run recorded yet; {runs}.", color="secondary", id="pipeline-status")
    color = {"completed": "success", "failed": "danger", "running": "warning", "interrupted": "dark"}.get(
        last["status"], "secondary")
    finished = last["finished_at"].strftime("%Y-%m-%d %H:%M") if last["finished_at"] else "—"
    parts = [
        html.Strong(f"Last pipeline run: {last['status']}"),
        f" · {last['pipeline_run_id']} · started {last['started_at']:%Y-%m-%d %H:%M} · finished {finished} · runs: {runs}",
    ]
    if last["error"]:
        parts.append(html.Div(html.Code(validate.public_error(last["error"], 500)), className="mt-1"))
    steps = queries.pipeline_steps(snapshot, last["pipeline_run_id"])
    if steps.height:
        states = steps.group_by("state").len().sort("state")
        summary = ", ".join(f"{n} {s}" for s, n in states.iter_rows())
        parts.append(html.Details([html.Summary(f"{steps.height} steps: {summary}"),
                                   ui.grid(steps, id="pipeline-steps-grid", height=260)], className="mt-1"))
    return dbc.Alert(parts, color=color, id="pipeline-status")


@queries.cached_view
def dataset_body(snapshot: Path, dataset: str) -> html.Div:
    return html.Div(
        [
            _cohort(snapshot, dataset),
            dbc.Row(
                [
                    dbc.Col(ui.card("Samples per task and split", _samples(snapshot, dataset)), lg=6),
                    dbc.Col(ui.card("Ingest rejects by table and reason", _rejects(snapshot, dataset)), lg=6),
                ]
            ),
            dbc.Row(
                [
                    dbc.Col(ui.card("NDC → ATC coverage by route", _coverage(snapshot, dataset)), lg=6),
                    dbc.Col(ui.card("Top unmapped drugs", _unmapped(snapshot, dataset)), lg=6),
                ]
            ),
        ]
    )


def _cohort(snapshot: Path, dataset: str) -> dbc.Card:
    counts = queries.cohort_counts(snapshot)
    row = counts.filter(pl.col("dataset") == dataset).to_dicts() if counts.height else []
    if not row:
        return ui.card("Cohort", ui.empty(f"No raw tables for dataset {dataset} yet."))
    values = row[0]
    synthetic = dataset.startswith("synth")
    stats = dbc.Row(
        [ui.stat(name, int(values[name] or 0)) for name in ("patients", "admissions", "diagnoses", "prescriptions")
         if name in values]
    )
    title = f"Cohort — {dataset}" + (" (synthetic)" if synthetic else "")
    return ui.card(title, stats, id="cohort-card")


def _samples(snapshot: Path, dataset: str) -> object:
    df = queries.sample_counts(snapshot, dataset)
    if not df.height:
        return ui.empty("No task samples built yet (`medtx samples`).")
    order = {"train": 0, "val": 1, "test": 2}
    df = df.sort(pl.col("split").replace_strict(order, default=9, return_dtype=pl.Int64), "task")
    bar = {"type": "bar", "textposition": "outside", "cliponaxis": False}
    bars = ui.series(df, "split", bar, "task", "n", text="n")
    fig = {"data": bars, "layout": {"barmode": "group", "xaxis": {"title": {"text": "task"}, "type": "category"},
                                    "yaxis": {"title": {"text": "samples"}}, "legend": {"title": {"text": "split"}}}}
    return ui.graph(fig, id="samples-graph", height=300)


def _rejects(snapshot: Path, dataset: str) -> object:
    log = queries.ingest_log(snapshot, dataset)
    rejects = queries.ingest_rejects(snapshot, dataset)
    parts: list = []
    if log.height:
        parts.append(ui.grid(log, id="ingest-log-grid", height=190))
    if rejects.height:
        parts.append(html.Div("Rejected rows by table, error type and column", className="small fw-semibold mt-2"))
        parts.append(ui.grid(rejects, id="rejects-grid", height=200))
    elif log.height:
        parts.append(ui.empty("No rejected rows: every source row parsed."))
    return parts or ui.empty("Nothing ingested for this dataset yet.")


def _coverage(snapshot: Path, dataset: str) -> object:
    df = queries.mapping_coverage(snapshot, dataset)
    if not df.height:
        return ui.empty("No NDC → ATC coverage report yet (`medtx samples`).")
    routes = df.filter(pl.col("route") != "mapped")
    bar = {"type": "bar", "x": routes["route"].to_list(), "y": routes["n_rows"].to_list(),
           "text": routes["pct_rows"].to_list(), "customdata": routes["n_ndc"].to_list(),
           "texttemplate": "%{text:.1%}", "textposition": "outside", "cliponaxis": False,
           "hovertemplate": "%{x}: %{y} rows, %{customdata} NDCs<extra></extra>", "marker": {"color": ui.COLORS[0]}}
    fig = {"data": [bar], "layout": {"xaxis": {"title": {"text": "route"}},
                                     "yaxis": {"title": {"text": "prescription rows"}}}}
    return html.Div([ui.graph(fig, id="coverage-graph", height=240),
                     ui.grid(df, id="coverage-grid", height=170)])


def _unmapped(snapshot: Path, dataset: str) -> object:
    df = queries.top_unmapped_drugs(snapshot, dataset)
    if not df.height:
        return ui.empty("No unmapped drugs (or no prescriptions mapped yet).")
    df = df.with_columns(pl.coalesce(pl.col("drug"), pl.lit("?")).alias("drug") + " (" + pl.col("ndc") + ")")
    bar = {"type": "bar", "orientation": "h", "x": df["prescriptions"].to_list(), "y": df["drug"].to_list(),
           "marker": {"color": ui.COLORS[0]}}
    fig = {"data": [bar], "layout": {"yaxis": {"autorange": "reversed", "type": "category"},
                                     "xaxis": {"title": {"text": "prescriptions"}}}}
    return ui.graph(fig, id="unmapped-graph", height=300)
