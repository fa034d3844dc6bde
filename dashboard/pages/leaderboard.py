"""Leaderboard: every model and baseline of a task with its test metrics, each with its 95% patient-bootstrap
interval, n test patients / samples, and the paired verdict against the reference baseline; per run a link to its
model card, its calibration slope and its largest subgroup gap."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote, urlencode

import dash_ag_grid as dag
import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components as ui
from dashboard import intervals as ci
from dashboard import queries, validate
from dashboard.pages.run_trust import CARD_PATH
from medtx.tasks import find_task, get_task
from medtx.tasks.verdict import gated

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
                    dbc.Col(dbc.RadioItems(id="lb-averaging", inline=True, options=[], value=None), md=4),
                    dbc.Col(dbc.Checklist(id="lb-group", inline=True, value=[], options=[
                        {"label": "one row per model (mean ± sd over seeds)", "value": "group"}]), md=2),
                ],
                className="mb-2 g-2 align-items-center",
            ),
            html.Div(id="lb-size-alert"),
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
                        "suppressColumnVirtualisation": True,  # ~20 columns: every cell in the DOM
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
            html.Div(id="lb-forest", className="mt-3"),
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
        part = tasks.filter(pl.col("task") == task)
        names, sizes = part["dataset"].to_list(), part["n_test_units"].to_list()
        labels = [(n or "(no dataset)") + (f" · {k} test units" if k is not None else "")
                  + (" · too small to compare" if ci.too_small(k) else "") for n, k in zip(names, sizes, strict=True)]
        return ui.options(names, labels), current if current in names else default_dataset(names, sizes)

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
        Output("lb-size-alert", "children"),
        Output("lb-forest", "children"),
        Input("lb-task", "value"),
        Input("lb-dataset", "value"),
        Input("lb-averaging", "value"),
        Input("lb-group", "value"),
        Input("snapshot-version", "data"),
    )
    def table(task: str | None, dataset: str | None, averaging: str | None, group: list | None,
              _version: str | None):
        if not task or dataset is None:
            return [], [], "No training runs in the warehouse yet: run `medtx train` or `medtx pipeline`.", None, None
        try:
            task, dataset = validate.task(task), validate.dataset(dataset)
            # checked before they reach a (cached) query: a client's unchecked value is never kept
            averaging = None if averaging is None else validate.name("averaging", averaging)
            if group is not None and (not isinstance(group, list) or len(group) > 1):
                raise validate.InvalidParameter("group is not a valid selection")
            group = [validate.choice("group", g, ("group",)) for g in group or []]
        except validate.InvalidParameter as exc:
            return [], [], str(exc), None, None
        runs = queries.leaderboard_runs(snapshot, task, dataset)
        metrics = queries.leaderboard_metrics(snapshot, task, dataset, averaging)
        sizes = queries.leaderboard_sizes(snapshot, task, dataset)
        headline = headline_metric(task)  # once per callback (was twice)
        trust = queries.leaderboard_trust(snapshot, task, dataset)
        rows, metric_names = leaderboard_rows(runs, metrics, sizes, headline, trust)
        if group:
            rows = ci.group_seeds(rows, [_field(m) for m in metric_names])
        note = (
            f"{len(rows)} rows · test metrics: value [95% interval, bootstrap with replacement over test patients "
            "(text groups, FAQ pairs), 1,000 resamples] · verdict: paired bootstrap against the reference baseline "
            "(best non-neural baseline on validation) on the headline metric · yellow = collapsed, red = failed"
        )
        n_units = max((r.get("n_test_patients") or 0 for r in rows), default=0)
        small = dbc.Alert(
            f"Too small to compare models: at most {n_units} test patients (groups) in this dataset; a comparison "
            "needs at least 30. Intervals are shown, verdicts are not.", color="warning", className="py-2",
            id="lb-too-small") if rows and ci.too_small(n_units) else None
        gate = ui.gate_alert(queries.leakage_gate(snapshot, task, dataset), id="lb-gate") \
            if gated(get_task(task)) else None
        alert = html.Div([a for a in (gate, small) if a is not None]) if gate or small else None
        reference = next((r["run_id"] for r in rows if r.get("verdict") == "reference"), None)
        plotted = metrics.height and metrics.filter(pl.col("metric") == headline).height
        forest = (ui.graph(ci.forest_figure(metrics, runs, headline, reference), id="lb-forest-graph",
                           height=max(260, 28 * runs.height + 120)) if plotted
                  else ui.empty(f"No test {headline} recorded for these runs: no forest plot.")) if headline else None
        return rows, column_defs(metric_names), note, alert, forest


def default_dataset(names: list[str], sizes: list[int | None]) -> str | None:
    """The dataset with the most test patients (a 2-patient demo split must not be the first view); ties and
    datasets without a recorded size keep their listed order."""
    if not names:
        return None
    return max(zip(names, sizes, strict=True), key=lambda t: -1 if t[1] is None else t[1])[0]


def headline_metric(task: str) -> str | None:
    """The metric the verdict and forest plot are on (the task's first compared metric; None for a task that
    declares none or that the registry does not know)."""
    compared = spec.scoring.compared if (spec := find_task(task)) is not None else ()
    return compared[0][0] if compared else None


def _field(metric: str) -> str:
    """AG Grid treats dots in field names as paths: keep fields to [a-z0-9_]."""
    return "m_" + re.sub(r"[^A-Za-z0-9_]", "_", metric)


def order_metrics(names: list[str]) -> list[str]:
    first = [m for m in PREFERRED_METRICS if m in names]
    return first + sorted(set(names) - set(first))


HIDDEN_METRICS = ("n_samples", "n_patients")  # shown as the n test patients / samples columns


def trust_cells(trust: pl.DataFrame | None, headline: str | None) -> dict[str, dict]:
    """{run_id: {calibration_slope, largest_gap}} as text: the slope [95% CI] before recalibration; the largest
    subgroup gap on the headline metric (else AUROC, else the first metric with one) with its simultaneous
    interval."""
    out: dict[str, dict] = {}
    if trust is None or not trust.height:
        return out
    for run_id, part in trust.group_by("run_id", maintain_order=True):
        first = part.row(0, named=True)
        cells = out.setdefault(run_id[0], {})
        if first["slope"] is not None:
            cells["calibration_slope"] = ci.fmt_ci(first["slope"], first["slope_low"], first["slope_high"])
        gaps = [g for g in part.iter_rows(named=True) if g["gap_metric"] is not None]
        gap = next((g for m in (headline, "auroc") for g in gaps if g["gap_metric"] == m), gaps[0] if gaps else None)
        if gap is not None:
            cells["largest_gap"] = (f"{gap['gap_metric']}, {gap['gap_attribute']}: {gap['group_high']} − "
                                    f"{gap['group_low']} {ci.fmt_ci(gap['gap'], gap['gap_low'], gap['gap_high'])}"
                                    + (" detected" if gap["detected"] else ""))
    return out


def leaderboard_rows(runs: pl.DataFrame, metrics: pl.DataFrame, sizes: pl.DataFrame | None = None,
                     headline: str | None = None, trust: pl.DataFrame | None = None) -> tuple[list[dict], list[str]]:
    """One row per run: its flags plus `m_<metric>` (value), `m_<metric>_lo`/`_hi` (95% interval) and
    `m_<metric>_sd` (SafeDrug subsample sd, a named second convention) columns; n test patients / samples;
    the paired verdict on the `headline` metric (`verdict`, `verdict_text`, and its difference with the 95%
    interval: `verdict_diff`, `verdict_diff_low`, `verdict_diff_high`)."""
    if not runs.height:
        return [], []
    names = [m for m in order_metrics(metrics["metric"].unique().to_list()) if m not in HIDDEN_METRICS] \
        if metrics.height else []
    by_run: dict[str, dict] = {}
    references = set()
    for m in metrics.iter_rows(named=True) if metrics.height else []:
        row = by_run.setdefault(m["run_id"], {})
        field = _field(m["metric"])
        row[field], row[field + "_sd"] = m["value"], m["sd"]
        row[field + "_lo"], row[field + "_hi"] = m.get("ci_low"), m.get("ci_high")
        if m["metric"] == headline and m.get("verdict"):
            row["verdict"] = m["verdict"]
            row["verdict_text"] = ci.verdict_text(m["verdict"], m.get("diff"), m.get("diff_low"), m.get("diff_high"))
            row["verdict_diff"], row["verdict_diff_low"] = m.get("diff"), m.get("diff_low")
            row["verdict_diff_high"] = m.get("diff_high")
            references.add(m.get("reference_run_id"))
    for run_id in references:
        by_run.setdefault(run_id, {}).update(verdict="reference", verdict_text=ci.VERDICT_LABELS["reference"])
    size = {r["run_id"]: r for r in sizes.iter_rows(named=True)} if sizes is not None and sizes.height else {}
    judged = trust_cells(trust, headline)
    rows = []
    for run in runs.iter_rows(named=True):
        flags = []
        if run["model"] == "oracle":
            flags.append("oracle (ground truth)")
        if run["is_synthetic"]:
            flags.append("synthetic")
        if "trained outside medtx" in (run.get("variant") or ""):
            flags.append("trained outside medtx: imported predictions, no validation split")
        if run["collapsed"]:
            reason = (run["collapse_reason"] or "constant predictions").removeprefix("collapsed: ")
            flags.append(f"COLLAPSED: {reason}")
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
                "n_test_patients": size.get(run["run_id"], {}).get("n_test_units"),
                "n_test_samples": size.get(run["run_id"], {}).get("n_test_samples"),
                "card": f"[card]({CARD_PATH}{quote(run['run_id'], safe='')})",
                **judged.get(run["run_id"], {}),
                "group_key": run["model"] + (f" ({run['variant']})" if run.get("variant") else ""),
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
            # value [95% CI]; grouped rows: mean ± sd over seeds. The SafeDrug subsample sd is in the tooltip only.
            "valueFormatter": {"function": (
                f"params.value == null ? '' : d3.format('.3f')(params.value) + "
                f"(params.data['{_field(m)}_lo'] != null ? ' [' + d3.format('.3f')(params.data['{_field(m)}_lo']) + "
                f"', ' + d3.format('.3f')(params.data['{_field(m)}_hi']) + ']' : "
                f"(params.data['{_field(m)}_seed_sd'] != null ? ' ± ' + "
                f"d3.format('.3f')(params.data['{_field(m)}_seed_sd']) + ' (seeds)' : ''))"
            )},
            "tooltipValueGetter": {"function": (
                f"params.data['{_field(m)}_sd'] == null ? null : '10×80% subsample sd (SafeDrug convention; "
                f"narrower than the patient-bootstrap interval): ' + d3.format('.3f')(params.data['{_field(m)}_sd'])"
            )},
            "minWidth": 170,
            **({"sort": "desc"} if i == 0 else {}),
        }
        for i, m in enumerate(metric_names)
    ]
    return [
        {"field": "model", "cellRenderer": "markdown", "pinned": "left", "minWidth": 140},
        {"field": "seed", "type": "numericColumn", "maxWidth": 90},
        {"field": "card", "headerName": "model card", "cellRenderer": "markdown", "maxWidth": 110,
         "sortable": False, "filter": False},
        {"field": "verdict_text", "headerName": "vs reference", "minWidth": 220, "tooltipField": "verdict_text",
         "cellClass": "verdict-badge", "cellClassRules": ci.badge_rules()},
        *metric_columns,
        {"field": "calibration_slope", "headerName": "calibration slope [95% CI]", "minWidth": 170,
         "headerTooltip": "logistic calibration slope of the test predictions before recalibration: 1 = calibrated, "
                          "< 1 too extreme"},
        {"field": "largest_gap", "headerName": "largest subgroup gap [simultaneous CI]", "minWidth": 260,
         "tooltipField": "largest_gap"},
        {"field": "n_test_patients", "headerName": "n test patients", "type": "numericColumn"},
        {"field": "n_test_samples", "headerName": "n test samples", "type": "numericColumn"},
        {"field": "flags", "minWidth": 200, "tooltipField": "flags"},
        {"field": "threshold", "type": "numericColumn"},
        {"field": "n_params", "headerName": "params", "type": "numericColumn"},
        {"field": "train_seconds", "headerName": "train s", "type": "numericColumn"},
        {"field": "run_id", "minWidth": 200},
    ]
