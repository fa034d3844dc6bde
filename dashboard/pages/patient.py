"""Patient explorer: a patient's visits, truth vs recommendation, DDI pairs, and attention over codes."""

from __future__ import annotations

import re
from pathlib import Path

import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboard import components as ui
from dashboard import queries, validate
from medtx.tasks import tasks_of_family

PATH = "/patient"
NAME = "Patient explorer"
MEAN_HEAD = -1  # head selector value for "mean over heads"
VIEWS = ("single", "heads", "model")  # the attention view selector's values
MAX_MODEL_VIEW = 48  # layer x head panels drawn in the model view before it gets unreadable
SHOWN_PREDICTIONS = 25
MAX_PATIENT_OPTIONS = 200  # the rest are found by typing an id (searched on the server)


def layout(snapshot: Path, params: dict[str, str]) -> html.Div:
    initial, problems = validate.url_params(params, {
        "run_id": validate.run_id,
        "subject_id": lambda v: validate.integer_id("subject_id", v),
        "hadm_id": lambda v: validate.integer_id("hadm_id", v),
    })
    return html.Div(
        [
            html.H3("Patient explorer"),
            *map(ui.invalid, problems),
            dbc.Row(
                [
                    dbc.Col([dbc.Label("Run"), dcc.Dropdown(id="pt-run", clearable=False,
                                                            value=initial.get("run_id"))], md=5),
                    dbc.Col([dbc.Label("Patient"), dcc.Dropdown(id="pt-patient", clearable=False,
                                                                placeholder="type a subject id to search",
                                                                value=initial.get("subject_id"))], md=3),
                    dbc.Col([dbc.Label("Visit"), dcc.Dropdown(id="pt-visit", clearable=False,
                                                              value=initial.get("hadm_id"))], md=4),
                ],
                className="mb-3 g-2",
            ),
            ui.loading(None, id="pt-body"),
            ui.card(
                "Attention over codes",
                [
                    dbc.Row(
                        [
                            dbc.Col([dbc.Label("Module"), dcc.Dropdown(id="pt-module", clearable=False)], md=3),
                            dbc.Col([dbc.Label("Layer"), dcc.Dropdown(id="pt-layer", clearable=False)], md=2),
                            dbc.Col([dbc.Label("Head"), dcc.Dropdown(id="pt-head", clearable=False)], md=2),
                            dbc.Col(
                                [dbc.Label("View"), dbc.RadioItems(
                                    id="pt-view", inline=True, value="single",
                                    options=[{"label": "selected head", "value": "single"},
                                             {"label": "head view (all heads)", "value": "heads"},
                                             {"label": "model view (layers × heads)", "value": "model"}])],
                                md=5,
                            ),
                        ],
                        className="mb-2 g-2",
                    ),
                    ui.loading(None, id="pt-attention"),
                ],
            ),
        ]
    )


def register(app: Dash, snapshot: Path) -> None:
    @app.callback(
        Output("pt-run", "options"), Output("pt-run", "value"),
        Input("snapshot-version", "data"), State("pt-run", "value"),
    )
    def run_options(_version: str | None, current: str | None):
        runs = queries.explorer_runs(snapshot, tasks_of_family("ehr"))
        if not runs.height:
            return [], None
        ids = runs["run_id"].to_list()
        labels = [f"{r['task']} · {r['model']} · {r['dataset']} · seed {r['seed']}"
                  + (" · attention" if r["has_attention"] else "") for r in runs.iter_rows(named=True)]
        return ui.options(ids, labels), current if current in ids else ids[0]

    @app.callback(
        Output("pt-patient", "options"), Output("pt-patient", "value"),
        Input("pt-run", "value"), State("pt-patient", "value"),
    )
    def patient_options(run_id: str | None, current: int | None):
        if not run_id:
            return [], None
        patients = queries.run_patients(snapshot, validate.run_id(run_id))
        if not patients.height:
            return [], None
        value = current if current in set(patients["subject_id"].to_list()) else patients["subject_id"][0]
        return patient_choices(patients, value), value

    @app.callback(
        Output("pt-patient", "options", allow_duplicate=True),
        Input("pt-patient", "search_value"), State("pt-run", "value"), State("pt-patient", "value"),
        prevent_initial_call=True,
    )
    def search_patients(search: str | None, run_id: str | None, current: int | None):
        """Typed digits search all of the run's patients on the server (the list holds the first few only)."""
        if not search or not run_id:
            return no_update
        patients = queries.run_patients(snapshot, validate.run_id(run_id))
        return patient_choices(patients, current, search.strip()) if patients.height else no_update

    @app.callback(
        Output("pt-visit", "options"), Output("pt-visit", "value"),
        Input("pt-run", "value"), Input("pt-patient", "value"), State("pt-visit", "value"),
    )
    def visit_options(run_id: str | None, subject_id: int | None, current: int | None):
        if not run_id or subject_id is None:
            return [], None
        visits = queries.patient_visits(snapshot, validate.run_id(run_id), validate.integer_id("subject_id", subject_id))
        if not visits.height:
            return [], None
        ids = visits["hadm_id"].to_list()
        labels = [f"{r['hadm_id']} · {r['admittime']:%Y-%m-%d}" if r["admittime"] else str(r["hadm_id"])
                  for r in visits.iter_rows(named=True)]
        # the latest visit whose attention was stored (a run stores it for a few test samples), else the latest
        shown = [h for h, a in zip(ids, visits["has_attention"].to_list()) if a]
        return ui.options(ids, labels), current if current in ids else (shown or ids)[-1]

    @app.callback(
        Output("pt-body", "children"),
        Output("pt-module", "options"), Output("pt-module", "value"),
        Input("pt-run", "value"), Input("pt-patient", "value"), Input("pt-visit", "value"),
        State("pt-module", "value"),
    )
    def body(run_id: str | None, subject_id: int | None, hadm_id: int | None, module: str | None):
        if not run_id:
            return ui.empty("No EHR run with stored predictions yet: run `medtx pipeline` or `medtx train --task drug_rec --model transformer`."), [], None
        if subject_id is None or hadm_id is None:
            return ui.empty("This run stored no per-visit test predictions."), [], None
        try:
            run_id = validate.run_id(run_id)
            subject_id = validate.integer_id("subject_id", subject_id)
            hadm_id = validate.integer_id("hadm_id", hadm_id)
        except validate.InvalidParameter as exc:
            return ui.invalid(str(exc)), [], None
        modules = queries.attention_modules(snapshot, run_id, str(hadm_id))
        names = modules["module"].to_list() if modules.height else []
        content = visit_body(snapshot, run_id, subject_id, hadm_id)
        return content, ui.options(names), module if module in names else (names[0] if names else None)

    @app.callback(
        Output("pt-layer", "options"), Output("pt-layer", "value"),
        Output("pt-head", "options"), Output("pt-head", "value"),
        Input("pt-module", "value"), Input("pt-run", "value"), Input("pt-visit", "value"),
        State("pt-layer", "value"), State("pt-head", "value"),
    )
    def layer_head_options(module: str | None, run_id: str | None, hadm_id: int | None, layer, head):
        if not module or not run_id or hadm_id is None:
            return [], None, [], None
        df = queries.attention(snapshot, validate.run_id(run_id), str(validate.integer_id("hadm_id", hadm_id)),
                               validate.name("module", module))
        layers = sorted(df["layer"].unique().to_list()) if df.height else []
        heads = sorted(df["head"].unique().to_list()) if df.height else []
        head_opts = [{"label": "mean of heads", "value": MEAN_HEAD}] + ui.options(heads, [f"head {h}" for h in heads])
        return (
            ui.options(layers, [f"layer {x}" for x in layers]), layer if layer in layers else (layers[-1] if layers else None),
            head_opts, head if head in [*heads, MEAN_HEAD] else MEAN_HEAD,
        )

    @app.callback(
        Output("pt-attention", "children"),
        Input("pt-module", "value"), Input("pt-layer", "value"), Input("pt-head", "value"), Input("pt-view", "value"),
        Input("pt-run", "value"), Input("pt-visit", "value"),
    )
    def attention(module, layer, head, view, run_id, hadm_id):
        if not module or layer is None or not run_id or hadm_id is None:
            return ui.empty("No attention stored for this visit (only neural models store it, for a few test visits).")
        # every value is checked before it is looked up or cached: a client's 20 MB `module` is refused, not kept
        sample = str(validate.integer_id("hadm_id", hadm_id))
        return attention_view(snapshot, validate.run_id(run_id), sample, validate.name("module", module),
                              validate.small_int("layer", layer, 0), validate.small_int("head", head, MEAN_HEAD),
                              validate.choice("view", view, VIEWS))


def patient_choices(patients: pl.DataFrame, current: int | None, search: str = "") -> list[dict]:
    """Dropdown options: patients whose id starts with `search`, at most MAX_PATIENT_OPTIONS of them (a
    readmission run has ~8k test patients: ~0.5 MB of options per page load), plus the current one."""
    shown = patients.filter(pl.col("subject_id").cast(pl.String).str.starts_with(search)).head(MAX_PATIENT_OPTIONS)
    if current is not None and current not in set(shown["subject_id"].to_list()):
        shown = pl.concat([patients.filter(pl.col("subject_id") == current), shown])
    labels = [f"{r['subject_id']} · {r['visits']} visit(s)" + (" · attention" if r["has_attention"] else "")
              for r in shown.iter_rows(named=True)]
    return ui.options(shown["subject_id"].to_list(), labels)


@queries.cached_view
def attention_view(snapshot: Path, run_id: str, sample_id: str, module: str, layer: int, head: int, view: str):
    df = queries.attention(snapshot, run_id, sample_id, module)
    names = _token_names(snapshot, _tokens(df))
    if view == "model":
        return ui.graph(model_view(df, names), id="attention-model-view", height=_model_view_height(df))
    if view == "heads":
        return ui.graph(head_view(df, layer, names), id="attention-head-view", height=380)
    return ui.graph(single_heatmap(df, layer, head, names), id="attention-heatmap", height=460)


@queries.cached_view
def visit_body(snapshot: Path, run_id: str, subject_id: int, hadm_id: int) -> html.Div:
    run = queries.run(snapshot, run_id) or {"run_id": run_id}
    dataset = run.get("dataset") or ""
    preds = queries.visit_predictions(snapshot, run["run_id"], str(hadm_id))
    names = queries.label_descriptions(snapshot, preds["label"].to_list() if preds.height else [])
    recommended = preds.filter(pl.col("predicted"))["label"].to_list() if preds.height else []
    return html.Div(
        [
            dbc.Row(
                [
                    dbc.Col(ui.card("True drug / label set vs the model's recommendation",
                                    _truth_vs_prediction(preds, names)), lg=7),
                    dbc.Col(ui.card("Drug–drug interactions among the recommendation",
                                    _ddi(snapshot, recommended, names)), lg=5),
                ]
            ),
            ui.card(f"Visit history of patient {subject_id}", _history(snapshot, dataset, subject_id, hadm_id)),
        ]
    )


def _truth_vs_prediction(preds: pl.DataFrame, names: dict[str, str]) -> object:
    if not preds.height:
        return ui.empty("No predictions stored for this visit.")
    true_set = sorted(preds.filter(pl.col("y_true"))["label"].to_list())
    shown = preds.filter(pl.col("y_true") | pl.col("predicted")).head(SHOWN_PREDICTIONS)
    if not shown.height:
        shown = preds.head(10)
    bar = {
        "type": "bar", "orientation": "h", "x": shown["prob"].to_list(), "y": shown["label"].to_list(),
        "marker": {"color": ["#198754" if t and p else "#0d6efd" if p else "#adb5bd" for t, p in
                             zip(shown["y_true"].to_list(), shown["predicted"].to_list(), strict=True)]},
        "hovertext": [names.get(x, "") for x in shown["label"].to_list()],
    }
    bars = {"data": [bar], "layout": {"yaxis": {"autorange": "reversed", "type": "category"},
                                      "xaxis": {"range": [0, 1], "title": {"text": "probability"}}}}
    legend = html.Div("green = recommended and true · blue = recommended only · grey = true but missed",
                      className="small text-muted")
    badges = [dbc.Badge(f"{c} {names.get(c, '')}".strip(), color="success" if c in
                        preds.filter(pl.col("predicted"))["label"].to_list() else "secondary", className="me-1 mb-1")
              for c in true_set]
    return html.Div([html.Div([html.Strong(f"True set ({len(true_set)}): "), *badges], id="true-set",
                              className="scroll-box small-box"),
                     ui.graph(bars, id="prediction-graph", height=max(260, 22 * shown.height + 80)), legend])


def _ddi(snapshot: Path, recommended: list[str], names: dict[str, str]) -> object:
    pairs = queries.ddi_pairs(snapshot, recommended)
    if not pairs.height:
        return ui.empty(f"No known interacting pair among the {len(recommended)} recommended drugs.")
    rows = [html.Tr([html.Td(f"{a} {names.get(a, '')}"), html.Td(f"{b} {names.get(b, '')}")])
            for a, b in pairs.iter_rows()]
    table = dbc.Table([html.Thead(html.Tr([html.Th("drug"), html.Th("interacts with")])), html.Tbody(rows)],
                      size="sm", striped=True, className="small mb-0")
    summary = html.Div(f"{pairs.height} interacting pair(s) among {len(recommended)} recommended drugs",
                       className="small fw-semibold mb-1")
    return html.Div([summary, html.Div(table, className="scroll-box")], id="ddi-table")


def _history(snapshot: Path, dataset: str, subject_id: int, hadm_id: int) -> object:
    history = queries.patient_history(snapshot, dataset, subject_id)
    if not history.height:
        return ui.empty("No admissions of this patient in the snapshot.")
    rows = [
        html.Tr(
            [html.Td(f"{visit['admittime']:%Y-%m-%d}" if visit["admittime"] else "—"), html.Td(str(visit["hadm_id"])),
             html.Td(visit["admission_type"] or ""), html.Td("; ".join(visit["diagnoses"]), className="small"),
             html.Td("; ".join(visit["drugs"]), className="small")],
            className="table-primary" if visit["hadm_id"] == hadm_id else None,
        )
        for visit in history.iter_rows(named=True)
    ]
    header = html.Thead(html.Tr([html.Th(h) for h in ("admitted", "hadm_id", "type", "ICD-9 diagnoses", "ATC-3 drugs")]))
    return html.Div(dbc.Table([header, html.Tbody(rows)], size="sm", bordered=True, className="mb-0"),
                    id="history-table", className="scroll-box")


def _token_names(snapshot: Path, tokens: list[str]) -> dict[str, str]:
    """Descriptions for attention tokens; models may prefix codes with their visit ('v3:4280')."""
    bare = {t: t.split(":", 1)[1] if re.match(r"^v\d+:", t) else t for t in tokens}
    names = queries.label_descriptions(snapshot, sorted(set(bare.values())))
    return {t: names[b] for t, b in bare.items() if b in names}


def _tokens(df: pl.DataFrame) -> list[str]:
    if not df.height:
        return []
    return pl.concat([df["query_token"], df["key_token"]]).drop_nulls().unique().to_list()


def _matrix(df: pl.DataFrame, layer: int, head: int) -> tuple[list[list[float]], list[str], list[str]]:
    """Q x K weights of one head (or the mean of heads) in one layer, with token labels by position."""
    part = df.filter(pl.col("layer") == layer)
    if head != MEAN_HEAD:
        part = part.filter(pl.col("head") == head)
    cells = part.group_by("query_pos", "key_pos").agg(pl.col("weight").mean())
    queries_ = part.group_by("query_pos").agg(pl.col("query_token").first()).sort("query_pos")
    keys = part.group_by("key_pos").agg(pl.col("key_token").first()).sort("key_pos")
    q_index = {p: i for i, p in enumerate(queries_["query_pos"].to_list())}
    k_index = {p: i for i, p in enumerate(keys["key_pos"].to_list())}
    matrix = [[0.0] * len(k_index) for _ in q_index]
    for q, k, w in cells.iter_rows():
        matrix[q_index[q]][k_index[k]] = w
    return matrix, [t or "?" for t in queries_["query_token"].to_list()], [t or "?" for t in keys["key_token"].to_list()]


def _heatmap_trace(matrix, q_tokens, k_tokens, names, *, showscale: bool) -> dict:
    # Positions on the axes (not token text): the same code can appear twice and must stay two cells.
    hover = [[f"{q_tokens[i]} {names.get(q_tokens[i], '')} → {k_tokens[j]} {names.get(k_tokens[j], '')}"
              for j in range(len(k_tokens))] for i in range(len(q_tokens))]
    return {"type": "heatmap", "z": matrix, "x": list(range(len(k_tokens))), "y": list(range(len(q_tokens))),
            "text": hover, "hovertemplate": "%{text}<br>weight %{z:.3f}<extra></extra>", "colorscale": ui.BLUES,
            "zmin": 0, "showscale": showscale}


def single_heatmap(df: pl.DataFrame, layer: int, head: int, names: dict[str, str]) -> dict:
    matrix, q_tokens, k_tokens = _matrix(df, layer, head)
    which = "mean of heads" if head == MEAN_HEAD else f"head {head}"
    return {
        "data": [_heatmap_trace(matrix, q_tokens, k_tokens, names, showscale=True)],
        "layout": {
            "title": {"text": f"layer {layer}, {which}"},
            "xaxis": {"tickvals": list(range(len(k_tokens))), "ticktext": k_tokens, "tickangle": -60,
                      "title": {"text": "attended code (key)"}},
            "yaxis": {"tickvals": list(range(len(q_tokens))), "ticktext": q_tokens, "autorange": "reversed",
                      "title": {"text": "query"}},
        },
    }


def _thumbnails(fig: dict) -> dict:
    """Small-multiple heatmaps: no tick labels, queries top-down like the single view."""
    for key, axis in fig["layout"].items():
        if key.startswith(("xaxis", "yaxis")):
            axis.update(showticklabels=False, **({"autorange": "reversed"} if key.startswith("yaxis") else {}))
    return fig


def head_view(df: pl.DataFrame, layer: int, names: dict[str, str]) -> dict:
    """BertViz head view: every head of one layer side by side."""
    heads = sorted(df.filter(pl.col("layer") == layer)["head"].unique().to_list())
    panels = [(f"head {h}", [_heatmap_trace(*_matrix(df, layer, h), names, showscale=False)]) for h in heads]
    fig = ui.facets(panels, cols=max(1, len(heads)), gap=(0.02, 0.0),
                    layout={"title": {"text": f"layer {layer}: all heads"}, "showlegend": False})
    return _thumbnails(fig)


def model_view(df: pl.DataFrame, names: dict[str, str]) -> dict:
    """BertViz model view: a thumbnail per (layer, head)."""
    layers = sorted(df["layer"].unique().to_list())
    heads = sorted(df["head"].unique().to_list())
    if len(layers) * len(heads) > MAX_MODEL_VIEW:
        layers = layers[-max(1, MAX_MODEL_VIEW // max(1, len(heads))):]
    panels = [(f"L{layer} H{head}", [_heatmap_trace(*_matrix(df, layer, head), names, showscale=False)])
              for layer in layers for head in heads]
    return _thumbnails(ui.facets(panels, cols=len(heads), gap=(0.01, 0.04), layout={"showlegend": False}))


def _model_view_height(df: pl.DataFrame) -> int:
    return 40 + 130 * min(len(df["layer"].unique()), MAX_MODEL_VIEW)
