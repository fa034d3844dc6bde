"""Note explorer: one clinical note with its true and predicted class and the model's token attention."""

from __future__ import annotations

from pathlib import Path

import dash_bootstrap_components as dbc
import polars as pl
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components as ui
from dashboard import queries, validate
from medtx.tasks import all_tasks, find_task

PATH = "/notes"
NAME = "Note explorer"
MAX_TEXT_CHARS = 6000  # the plain text shown when no attention was stored
TOP_CLASSES = 5
_SPECIAL = {"[CLS]", "[SEP]", "[PAD]", "<pad>", "<cls>", "<sep>", "<s>", "</s>"}


def layout(snapshot: Path, params: dict[str, str]) -> html.Div:
    initial, problems = validate.url_params(params, {"run_id": validate.run_id, "note_id": validate.sample_id})
    return html.Div(
        [
            html.H3("Note explorer"),
            *map(ui.invalid, problems),
            dbc.Row(
                [
                    dbc.Col([dbc.Label("Run"), dcc.Dropdown(id="note-run", clearable=False,
                                                            value=initial.get("run_id"))], md=5),
                    dbc.Col([dbc.Label("Note"), dcc.Dropdown(id="note-id", clearable=False,
                                                             value=initial.get("note_id"))], md=5),
                    dbc.Col([dbc.Label("Layer"), dcc.Dropdown(id="note-layer", clearable=True,
                                                              placeholder="last")], md=2),
                ],
                className="mb-3 g-2",
            ),
            ui.loading(None, id="note-body"),
            ui.loading(None, id="note-top-tokens"),
        ]
    )


def register(app: Dash, snapshot: Path) -> None:
    @app.callback(
        Output("note-run", "options"), Output("note-run", "value"),
        Input("snapshot-version", "data"), State("note-run", "value"),
    )
    def run_options(_version: str | None, current: str | None):
        runs = queries.explorer_runs(snapshot, [t for t in all_tasks() if t.classifies_text])
        if not runs.height:
            return [], None
        ids = runs["run_id"].to_list()
        labels = [f"{r['task']} · {r['model']} · seed {r['seed']}" + (" · attention" if r["has_attention"] else "")
                  for r in runs.iter_rows(named=True)]
        return ui.options(ids, labels), current if current in ids else ids[0]

    @app.callback(
        Output("note-id", "options"), Output("note-id", "value"),
        Output("note-layer", "options"),
        Input("note-run", "value"), State("note-id", "value"),
    )
    def note_options(run_id: str | None, current: str | None):
        if not run_id:
            return [], None, []
        run_id = validate.run_id(run_id)
        notes = queries.run_notes(snapshot, run_id)
        layers = queries.note_layers(snapshot, run_id)
        layer_opts = ui.options(layers, [f"layer {x}" for x in layers])
        if not notes.height:
            return [], None, layer_opts
        ids = notes["sample_id"].to_list()
        labels = [f"{r['sample_id']} · true {r['true_label']} · pred {r['pred_label']}"
                  + (" · attention" if r["has_attention"] else "") for r in notes.iter_rows(named=True)]
        return ui.options(ids, labels), current if current in ids else ids[0], layer_opts

    @app.callback(
        Output("note-body", "children"),
        Input("note-run", "value"), Input("note-id", "value"), Input("note-layer", "value"),
    )
    def body(run_id: str | None, note_id: str | None, layer: int | None):
        if not run_id:
            return ui.empty("No text-classification run with stored predictions yet (`medtx train --task specialty`).")
        if not note_id:
            return ui.empty("This run stored no per-note predictions.")
        try:
            run_id, note_id = validate.run_id(run_id), validate.sample_id(note_id)
        except validate.InvalidParameter as exc:
            return ui.invalid(str(exc))
        return note_body(snapshot, run_id, note_id, layer)

    @app.callback(Output("note-top-tokens", "children"), Input("note-run", "value"))
    def top_tokens(run_id: str | None):
        if not run_id:
            return None
        return top_tokens_view(snapshot, validate.run_id(run_id))


@queries.cached_view
def top_tokens_view(snapshot: Path, run_id: str):
    """Bar charts of the tokens [CLS] attends to most, one panel per predicted class."""
    df = queries.top_tokens_per_class(snapshot, run_id)
    if not df.height:
        return ui.card("Top-attended tokens per predicted class",
                       ui.empty("This model stored no attention (only transformer text models do)."))
    bar = {"type": "bar", "orientation": "h", "marker": {"color": ui.COLORS[0]},
           "hovertemplate": "%{y}: %{x:.4f} (%{customdata} notes)<extra></extra>"}
    panels = [(name[:30], [{**bar, "x": part["weight"].to_list(), "y": part["token"].to_list(),
                            "customdata": part["n"].to_list()}])
              for (name,), part in df.group_by("class", maintain_order=True)]
    fig = ui.facets(panels, cols=4, gap=(0.12, 0.1), layout={"showlegend": False})
    for key in [k for k in fig["layout"] if k.startswith("yaxis")]:
        fig["layout"][key].update(autorange="reversed", type="category")
    rows = (len(panels) + 3) // 4
    return ui.card("Top-attended tokens per predicted class ([CLS] → token, last layer, mean over heads)",
                   ui.graph(fig, id="top-tokens-graph", height=60 + 230 * rows))


@queries.cached_view
def note_body(snapshot: Path, run_id: str, note_id: str, layer: int | None) -> html.Div:
    run = queries.run(snapshot, run_id) or {}
    task = find_task(run.get("task") or "")  # a snapshot may hold runs of a task this version does not know
    if task is not None and queries.admission_notes(task) and note_id.isdigit():
        note = queries.discharge_note_text(snapshot, task, run.get("dataset") or "", int(note_id))
    else:
        note = queries.note_text(snapshot, note_id)
    preds = queries.visit_predictions(snapshot, run_id, note_id)
    truth = preds.filter(pl.col("y_true"))["label"].to_list() if preds.height else []
    predicted = preds.filter(pl.col("predicted"))["label"].to_list() if preds.height else []
    correct = bool(truth) and set(truth) == set(predicted)
    header = html.Div(
        [
            html.Span("true: ", className="text-muted"), dbc.Badge(", ".join(truth) or "?", color="secondary",
                                                                   className="me-3", id="note-true"),
            html.Span("predicted: ", className="text-muted"),
            dbc.Badge(", ".join(predicted) or "?", color="success" if correct else "danger", id="note-pred"),
        ],
        className="mb-2",
    )
    probs = preds.head(TOP_CLASSES)
    prob_fig = {
        "data": [{"type": "bar", "orientation": "h", "x": probs["prob"].to_list(), "y": probs["label"].to_list(),
                  "marker": {"color": ui.COLORS[0]}}],
        "layout": {"yaxis": {"autorange": "reversed", "type": "category"},
                   "xaxis": {"range": [0, 1], "title": {"text": "probability"}}},
    } if probs.height else None
    attention = queries.note_token_attention(snapshot, run_id, note_id, layer)
    text_view = highlighted_tokens(attention) if attention.height else _plain_text(note)
    title = f"Note {note_id}" + (f" — {note['description']}" if note and note.get("description") else "")
    return dbc.Row(
        [
            dbc.Col(ui.card(title, [header, text_view]), lg=8),
            dbc.Col(ui.card(f"Top {TOP_CLASSES} classes",
                            ui.graph(prob_fig, id="note-probs", height=260) if prob_fig else
                            ui.empty("No probabilities stored.")), lg=4),
        ]
    )


def _plain_text(note: dict | None) -> object:
    if not note or not note.get("transcription"):
        return ui.empty("The note text is not in the snapshot.")
    text = note["transcription"]
    suffix = " …" if len(text) > MAX_TEXT_CHARS else ""
    return html.Div([ui.empty("No attention stored for this note; showing the text."),
                     html.P(text[:MAX_TEXT_CHARS] + suffix, className="note-text")])


def highlighted_tokens(attention: pl.DataFrame) -> html.Div:
    """The model's tokens with a background whose strength is the [CLS] attention they received."""
    weights = [w for t, w in attention.select("token", "weight").iter_rows() if t not in _SPECIAL]
    top = max(weights, default=0) or 1.0
    spans = []
    for token, weight in attention.select("token", "weight").iter_rows():
        if token is None or token in _SPECIAL:
            continue
        # WordPiece continuations ("##ing") join the previous piece without a space.
        text = token[2:] if token.startswith("##") else " " + token
        alpha = round(min(1.0, weight / top), 3)
        spans.append(html.Span(text, title=f"{weight:.4f}", className="tok",
                               style={"backgroundColor": f"rgba(220, 53, 69, {alpha})"}))
    return html.Div(
        [html.Div("Token shading = attention from [CLS] (darker = more).", className="small text-muted mb-1"),
         html.P(spans, className="note-text", id="note-highlight")]
    )
