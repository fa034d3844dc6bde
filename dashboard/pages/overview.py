"""Overview: cohort and data-quality figures of one dataset, and the last pipeline run."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components as ui
from dashboard import queries, validate
from medtx.pipeline import progress

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
            return ui.empty("No dataset in the warehouse yet: run `medtx pipeline`, or `medtx ingest mimic3` for the bundled demo.")
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
    if last["status"] == "running":
        parts.append(_live_progress(snapshot, last))
    steps = queries.pipeline_steps(snapshot, last["pipeline_run_id"])
    if steps.height:
        states = steps.group_by("state").len().sort("state")
        summary = ", ".join(f"{n} {s}" for s, n in states.iter_rows())
        parts.append(html.Details([html.Summary(f"{steps.height} steps: {summary}"),
                                   ui.grid(steps, id="pipeline-steps-grid", height=260)], className="mt-1"))
    return dbc.Alert(parts, color=color, id="pipeline-status")


def _live_progress(snapshot: Path, last: dict) -> html.Div:
    """Steps done / running / queued / failed of the running pipeline, elapsed time and ETA (from the
    previous runs' step durations), as of the latest publish."""
    plan = queries.pipeline_progress(snapshot, last["pipeline_run_id"])
    if not plan.height:
        return html.Div("Running (no plan recorded).", id="pipeline-progress", className="mt-1")
    steps = [progress.StepProgress(r["step"], r["kind"], progress.step_status(r["state"], r["started_at"]),
                                   r["expected_seconds"], r["started_at"], r["seconds"])
             for r in plan.iter_rows(named=True)]
    now = datetime.now()
    n = progress.counts(steps)
    total = len(steps)
    bar = dbc.Progress([
        dbc.Progress(value=100 * n[progress.DONE] / total, color="success", bar=True),
        dbc.Progress(value=100 * n[progress.FAILED] / total, color="danger", bar=True),
        dbc.Progress(value=100 * n[progress.RUNNING] / total, color="info", bar=True, striped=True, animated=True),
    ], className="my-1")
    running = [s.name for s in steps if s.status == progress.RUNNING]
    text = (f"{n[progress.DONE]} done · {n[progress.RUNNING]} running · {n[progress.QUEUED]} queued · "
            f"{n[progress.FAILED]} failed of {total} steps · elapsed "
            f"{progress.format_seconds((now - last['started_at']).total_seconds())} · "
            f"ETA {progress.format_seconds(progress.remaining_seconds(steps, now))}")
    return html.Div([bar, html.Div(text, id="pipeline-progress-text"),
                     html.Div(("running: " + ", ".join(running)) if running else "", className="small")],
                    id="pipeline-progress", className="mt-1")


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
            ui.card("Plausibility checks at the latest ingest, per table and rule",
                    _plausibility(snapshot, dataset), id="plausibility-card"),
            ui.card("Leakage gate per task (split overlap, codes after the prediction time, shortcuts)",
                    _gates(snapshot, dataset), id="gate-card"),
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
        [ui.stat(name, int(values[name] or 0)) for name in ("patients", "admissions", "diagnoses", "procedures",
                                                         "prescriptions")
         if name in values]
    )
    title = f"Cohort — {dataset}" + (" (synthetic)" if synthetic else "")
    return ui.card(title, stats, id="cohort-card")


def _samples(snapshot: Path, dataset: str) -> object:
    df = queries.sample_counts(snapshot, dataset)
    if not df.height:
        return ui.empty(f"No task samples built yet (`medtx build-samples --dataset {dataset}`).")
    order = {"train": 0, "val": 1, "test": 2}
    df = df.sort(pl.col("split").replace_strict(order, default=9, return_dtype=pl.Int64), "task")
    bar = {"type": "bar", "textposition": "outside", "cliponaxis": False}
    bars = ui.series(df, "split", bar, "task", "n", text="n")
    fig = {"data": bars, "layout": {"barmode": "group", "xaxis": {"title": {"text": "task"}, "type": "category"},
                                    "yaxis": {"title": {"text": "samples"}}, "legend": {"title": {"text": "split"}}}}
    return ui.graph(fig, id="samples-graph", height=300)


def _gates(snapshot: Path, dataset: str) -> object:
    df = queries.leakage_gates(snapshot, dataset)
    if not df.height:
        return ui.empty(f"No leakage gate record for {dataset} (the gate runs when a task's samples are built).")
    rows = [html.Tr([html.Td(r["task"]), html.Td(dbc.Badge(r["status"], color=ui.GATE_COLORS[r["status"]])),
                     html.Td(f"{r['split_overlap']:,}"), html.Td("-" if r["late_codes"] is None else f"{r['late_codes']:,}"),
                     html.Td(r["flagged"] or "-"), html.Td(r["message"], className="small")])
            for r in df.to_dicts()]
    head = html.Thead(html.Tr([html.Th(h) for h in ("task", "gate", "patients in 2 splits", "codes after prediction",
                                                    "flagged features", "verdict")]))
    return dbc.Table([head, html.Tbody(rows)], size="sm", bordered=False, className="mb-0", id="gate-table")


POLICY_COLORS = {"warn": "warning", "reject": "danger"}


def _plausibility(snapshot: Path, dataset: str) -> object:
    """Rows that parsed but cannot be true (medtx.ingest.plausibility), as raw.ingest_checks holds them
    for the dataset's latest ingest: one row per table and rule with its count, the policy and what it did."""
    df = queries.ingest_checks(snapshot, dataset)
    if not df.height:
        if queries.ingest_log(snapshot, dataset).height:
            return ui.empty("No plausibility findings: no duplicate ids with other data, no discharge before "
                            "admission, no birth after admission, no year outside 1750..2300.")
        return ui.empty("Nothing ingested for this dataset yet.")
    rows = [html.Tr([html.Td(r["table_name"]), html.Td([html.Code(r["rule"]), html.Div(r["says"], className="small")]),
                     html.Td(f"{r['n_rows']:,}", className="text-end"),
                     html.Td(dbc.Badge(r["policy"], color=POLICY_COLORS.get(r["policy"], "secondary"))),
                     html.Td(r["action"]), html.Td(r["example"] or "-", className="small")])
            for r in df.to_dicts()]
    head = html.Thead(html.Tr([html.Th(h) for h in ("table", "rule", "rows", "policy", "rows are", "example")]))
    total = int(df["n_rows"].sum())
    summary = html.Div(f"{df.height} rule(s) found {total:,} row(s) at the latest ingest "
                       "(policy: medtx ingest --plausibility, pipeline config ingest.plausibility).",
                       className="small mb-1", id="plausibility-summary")
    return html.Div([summary, dbc.Table([head, html.Tbody(rows)], size="sm", bordered=False, className="mb-0",
                                        id="plausibility-table")])


def _rejects(snapshot: Path, dataset: str) -> object:
    log = queries.ingest_log(snapshot, dataset)
    rejects = queries.ingest_rejects(snapshot, dataset)
    parts: list = []
    if log.height:
        parts.append(ui.grid(log, id="ingest-log-grid", height=190))
    meds = queries.meds_codes(snapshot, dataset)
    if meds.height:  # a MEDS import: which code prefixes became rows, and which were left out
        parts.append(html.Div("MEDS codes by prefix", className="small fw-semibold mt-2"))
        parts.append(ui.grid(meds, id="meds-codes-grid", height=190))
    if rejects.height:
        parts.append(html.Div("Rejected rows by table, error type and column", className="small fw-semibold mt-2"))
        parts.append(ui.grid(rejects, id="rejects-grid", height=200))
    elif log.height:
        parts.append(ui.empty("No rejected rows: every source row parsed."))
    return parts or ui.empty("Nothing ingested for this dataset yet.")


def _coverage(snapshot: Path, dataset: str) -> object:
    df = queries.mapping_coverage(snapshot, dataset)
    if not df.height:
        return ui.empty(f"No NDC → ATC coverage report yet (`medtx map-codes --dataset {dataset}`).")
    routes = df.filter(pl.col("route") != "mapped")
    bar = {"type": "bar", "x": routes["route"].to_list(), "y": routes["n_rows"].to_list(),
           "text": routes["pct_rows"].to_list(), "customdata": routes["n_ndc"].to_list(),
           "texttemplate": "%{text:.1%}", "textposition": "outside", "cliponaxis": False,
           "hovertemplate": "%{x}: %{y} rows, %{customdata} NDCs<extra></extra>", "marker": {"color": ui.COLORS[0]}}
    fig = {"data": [bar], "layout": {"xaxis": {"title": {"text": "route"}},
                                     "yaxis": {"title": {"text": "prescription rows"}}}}
    # pct_rows stays a number (it sorts) and is shown as a percentage
    columns = [{"field": c, "headerName": c.replace("_", " ")} for c in df.columns if c != "pct_rows"]
    columns.append({"field": "pct_rows", "headerName": "% of rows", "type": "numericColumn",
                    "valueFormatter": {"function": "params.value == null ? '' : d3.format('.1%')(params.value)"}})
    return html.Div([ui.graph(fig, id="coverage-graph", height=240),
                     ui.grid(df, id="coverage-grid", height=170, column_defs=columns)])


def _unmapped(snapshot: Path, dataset: str) -> object:
    df = queries.top_unmapped_drugs(snapshot, dataset)
    if not df.height:
        return ui.empty("No unmapped drugs (or no prescriptions mapped yet).")
    df = df.with_columns(pl.coalesce(pl.col("drug"), pl.lit("?")).alias("drug") + " (" + pl.col("ndc") + ")")
    bar = {"type": "bar", "orientation": "h", "x": df["prescriptions"].to_list(), "y": df["drug"].to_list(),
           "marker": {"color": ui.COLORS[0]}}
    # dtick 1 + a height per bar: plotly otherwise thins out category labels that do not fit (every other drug)
    fig = {"data": [bar], "layout": {"yaxis": {"autorange": "reversed", "type": "category", "dtick": 1,
                                               "automargin": True, "tickfont": {"size": 11}},
                                     "xaxis": {"title": {"text": "prescriptions"}}}}
    return ui.graph(fig, id="unmapped-graph", height=max(300, 22 * df.height + 80))
