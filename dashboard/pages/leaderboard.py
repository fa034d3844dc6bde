"""Leaderboard: every model and baseline of a task with its test metrics (mean ± sd over bootstraps)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlencode

import dash_ag_grid as dag
import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components as ui
from dashboard import queries, validate

PATH = "/leaderboard"
NAME = "Leaderboard"

# Metrics shown first, in this order, when a run has them; others follow alphabetically.
PREFERRED_METRICS = (
    "pr_auc_samples", "jaccard_samples", "f1_samples", "roc_auc", "auroc", "pr_auc", "auprc", "rp80",
    "accuracy", "macro_f1", "weighted_f1", "ddi_rate", "avg_drugs", "token_f1", "exact_match",
)
_AVERAGING_LABELS = {"visit": "visit-averaged (PyHealth)", "patient": "patient-averaged (SafeDrug)"}


def layout(snapshot: Path, params: dict[str, str]) -> html.Div:
    return html.Div(
        [
            html.H3("Leaderboard"),
            dbc.Row(
                [
                    dbc.Col(dcc.Dropdown(id="lb-task", clearable=False, placeholder="task",
                                         value=params.get("task")), md=3),
                    dbc.Col(dcc.Dropdown(id="lb-dataset", clearable=False, placeholder="dataset",
                                         value=params.get("dataset")), md=3),
                    dbc.Col(dbc.RadioItems(id="lb-averaging", inline=True, options=[], value=None), md=6),
                ],
                className="mb-2 g-2 align-items-center",
            ),
            html.Div(id="lb-note", className="small text-muted mb-2"),
            dcc.Loading(
                dag.AgGrid(
                    id="leaderboard-grid",
                    rowData=[],
                    columnDefs=[],
                    defaultColDef={"sortable": True, "filter": True, "resizable": True, "minWidth": 110},
                    columnSize="autoSize",
                    dashGridOptions={
                        "animateRows": False,
                        "tooltipShowDelay": 300,
                    },
                    getRowStyle={"styleConditions": [
                        {"condition": "params.data.collapsed", "style": {"backgroundColor": "#fff3cd"}},
                        {"condition": "params.data.status === 'failed'", "style": {"backgroundColor": "#f8d7da"}},
                    ]},
                    style={"height": "60vh"},
                    className="ag-theme-alpine",
                ),
                delay_show=200,
            ),
        ]
    )


def register(app: Dash, snapshot: Path) -> None:
    @app.callback(
        Output("lb-task", "options"),
        Output("lb-task", "value"),
        Input("snapshot-version", "data"),
        State("lb-task", "value"),
    )
    def task_options(_version: str | None, current: str | None):
        tasks = queries.task_datasets(snapshot)
        names = tasks["task"].unique(maintain_order=True).to_list() if tasks.height else []
        return ui.options(names), current if current in names else (names[0] if names else None)

    @app.callback(
        Output("lb-dataset", "options"),
        Output("lb-dataset", "value"),
        Input("lb-task", "value"),
        Input("snapshot-version", "data"),
        State("lb-dataset", "value"),
    )
    def dataset_options(task: str | None, _version: str | None, current: str | None):
        tasks = queries.task_datasets(snapshot)
        if not task or not tasks.height:
            return [], None
        names = tasks.filter(pl.col("task") == task)["dataset"].to_list()
        labels = [n or "(no dataset)" for n in names]
        return ui.options(names, labels), current if current in names else (names[0] if names else None)

    @app.callback(
        Output("lb-averaging", "options"),
        Output("lb-averaging", "value"),
        Input("lb-task", "value"),
        Input("lb-dataset", "value"),
        State("lb-averaging", "value"),
    )
    def averaging_options(task: str | None, dataset: str | None, current: str | None):
        if not task or dataset is None:
            return [], None
        conventions = queries.averaging_options(snapshot, validate.task(task), validate.dataset(dataset))
        opts = [{"label": _AVERAGING_LABELS.get(c, c), "value": c} for c in conventions]
        return opts, current if current in conventions else (conventions[0] if conventions else None)

    @app.callback(
        Output("leaderboard-grid", "rowData"),
        Output("leaderboard-grid", "columnDefs"),
        Output("lb-note", "children"),
        Input("lb-task", "value"),
        Input("lb-dataset", "value"),
        Input("lb-averaging", "value"),
        Input("snapshot-version", "data"),
    )
    def table(task: str | None, dataset: str | None, averaging: str | None, _version: str | None):
        if not task or dataset is None:
            return [], [], "No training runs in the warehouse yet: run `medtx train` or `medtx pipeline`."
        try:
            task, dataset = validate.task(task), validate.dataset(dataset)
        except validate.InvalidParameter as exc:
            return [], [], str(exc)
        runs = queries.leaderboard_runs(snapshot, task, dataset)
        metrics = queries.leaderboard_metrics(snapshot, task, dataset, averaging)
        rows, metric_names = leaderboard_rows(runs, metrics)
        note = (
            f"{len(rows)} runs · test metrics, mean ± sd over bootstrap resamples · "
            "yellow = collapsed predictions, red = failed · click a model for its run detail"
        )
        return rows, column_defs(metric_names), note


def _field(metric: str) -> str:
    """AG Grid treats dots in field names as paths: keep fields to [a-z0-9_]."""
    return "m_" + re.sub(r"[^A-Za-z0-9_]", "_", metric)


def order_metrics(names: list[str]) -> list[str]:
    first = [m for m in PREFERRED_METRICS if m in names]
    return first + sorted(set(names) - set(first))


def leaderboard_rows(runs: pl.DataFrame, metrics: pl.DataFrame) -> tuple[list[dict], list[str]]:
    """One row per run: its flags plus `m_<metric>` (mean) and `m_<metric>_sd` columns."""
    if not runs.height:
        return [], []
    names = order_metrics(metrics["metric"].unique().to_list()) if metrics.height else []
    by_run: dict[str, dict] = {}
    for run_id, metric, value, sd in metrics.iter_rows() if metrics.height else []:
        by_run.setdefault(run_id, {})[_field(metric)] = value
        by_run[run_id][_field(metric) + "_sd"] = sd
    rows = []
    for run in runs.iter_rows(named=True):
        flags = []
        if run["model"] == "oracle":
            flags.append("oracle (ground truth)")
        if run["is_synthetic"]:
            flags.append("synthetic")
        if run["collapsed"]:
            flags.append(f"COLLAPSED: {run['collapse_reason'] or 'constant predictions'}")
        if run["status"] != "completed":
            flags.append(run["status"] + (f": {validate.public_error(run['error'], 80)}" if run["error"] else ""))
        rows.append(
            {
                "run_id": run["run_id"],
                "model": f"[{run['model']}](/run?{urlencode({'run_id': run['run_id']})})"
                         + (f" ({run['variant']})" if run.get("variant") else ""),
                "seed": run["seed"],
                "status": run["status"],
                "collapsed": bool(run["collapsed"]),
                "flags": "; ".join(flags),
                "threshold": run["threshold"],
                "n_params": run["n_params"],
                "train_seconds": round(run["train_seconds"], 1) if run["train_seconds"] is not None else None,
                **by_run.get(run["run_id"], {}),
            }
        )
    return rows, names


def column_defs(metric_names: list[str]) -> list[dict]:
    metric_columns = [
        {
            "field": _field(m),
            "headerName": m,
            "type": "numericColumn",
            "filter": "agNumberColumnFilter",
            "valueFormatter": {"function": (
                f"params.value == null ? '' : d3.format('.3f')(params.value) + "
                f"(params.data['{_field(m)}_sd'] == null ? '' : ' ± ' + d3.format('.3f')(params.data['{_field(m)}_sd']))"
            )},
            **({"sort": "desc"} if i == 0 else {}),
        }
        for i, m in enumerate(metric_names)
    ]
    return [
        {"field": "model", "cellRenderer": "markdown", "pinned": "left", "minWidth": 140},
        {"field": "seed", "type": "numericColumn", "maxWidth": 90},
        *metric_columns,
        {"field": "flags", "minWidth": 200, "tooltipField": "flags"},
        {"field": "threshold", "type": "numericColumn"},
        {"field": "n_params", "headerName": "params", "type": "numericColumn"},
        {"field": "train_seconds", "headerName": "train s", "type": "numericColumn"},
        {"field": "run_id", "minWidth": 200},
    ]
