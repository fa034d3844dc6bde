"""p50/p95 callback latency of every dashboard page (target p95 < 300 ms).

    python benchmarks/dashboard.py --db var/warehouse.duckdb [--repeats 20]

Replays, through Flask's test client, the exact callback requests the browser sends when a page loads
(each chained callback fed with the previous ones' outputs), so the figures include Dash's JSON encoding
and the figure building, not just SQL. Two passes per page: cold (query cache cleared before every
repetition, i.e. the first visit after a publish) and warm (cache filled). Prints a Markdown table.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

# This file is named like the package it measures: drop its own folder from the path so that
# `import dashboard` finds the app, not this script.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from dashboard import create_app, queries, resolve_snapshot  # noqa: E402

# Page -> the callbacks that fire when it loads, in dependency order, by one of their output ids.
PAGES: dict[str, list[str]] = {
    "overview": ["page.children", "overview-dataset.options", "overview-pipeline.children", "overview-body.children"],
    "leaderboard": ["page.children", "lb-task.options", "lb-dataset.options", "lb-averaging.options",
                    "leaderboard-grid.rowData"],
    "run_detail": ["page.children", "run-select.options", "run-body.children"],
    "patient": ["page.children", "pt-run.options", "pt-patient.options", "pt-visit.options", "pt-body.children",
                "pt-layer.options", "pt-attention.children"],
    "notes": ["page.children", "note-run.options", "note-id.options", "note-body.children",
              "note-top-tokens.children"],
}
PATHS = {"overview": "/", "leaderboard": "/leaderboard", "run_detail": "/run", "patient": "/patient", "notes": "/notes"}


def _callback_key(app, output: str) -> str:
    """The callback_map key (single or multi-output) that contains `output`."""
    for key in app.callback_map:
        if key == output or f"..{output}.." in key or key.startswith(f"..{output}...") or f"...{output}.." in key:
            return key
    raise KeyError(output)


def _payload(app, key: str, values: dict[str, Any]) -> dict:
    spec = app.callback_map[key]
    def bind(items):
        return [{"id": i["id"], "property": i["property"], "value": values.get(f"{i['id']}.{i['property']}")}
                for i in items]
    outputs = [o for o in key.strip(".").split("...")] if key.startswith("..") else [key]
    out_specs = [{"id": o.rsplit(".", 1)[0], "property": o.rsplit(".", 1)[1]} for o in outputs]
    inputs = bind(spec["inputs"])
    return {
        "output": key,
        "outputs": out_specs if key.startswith("..") else out_specs[0],
        "inputs": inputs,
        "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs[:1]],
        "state": bind(spec.get("state", [])),
    }


def load_page(app, client, page: str, snapshot: Path) -> list[tuple[str, float]]:
    """Fire a page's callbacks in order; returns (callback, seconds) for each."""
    values: dict[str, Any] = {"url.pathname": PATHS[page], "url.search": "", "snapshot-present.data": True,
                              "snapshot-version.data": "-".join(map(str, queries.snapshot_signature(snapshot))),
                              "pt-view.value": "single"}
    timings = []
    for output in PAGES[page]:
        key = _callback_key(app, output)
        started = time.perf_counter()
        response = client.post("/_dash-update-component", json=_payload(app, key, values))
        timings.append((output, time.perf_counter() - started))
        if response.status_code == 204:  # everything no_update
            continue
        if response.status_code != 200:
            raise RuntimeError(f"{page}: callback {key} answered {response.status_code}: {response.get_data(as_text=True)[:300]}")
        for component, props in json.loads(response.get_data())["response"].items():
            for prop, value in props.items():
                values[f"{component}.{prop}"] = value
    return timings


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] if len(samples) > 1 else samples[0]


def main(
    db: Annotated[Path, typer.Option(help="Live warehouse (its snapshot is read) or a snapshot file.")],
    repeats: Annotated[int, typer.Option(help="Page loads per page and pass.")] = 20,
) -> None:
    snapshot = resolve_snapshot(db)
    app = create_app(snapshot)
    client = app.server.test_client()
    size = snapshot.stat().st_size / 1e6
    runs = queries.runs_index(snapshot).height
    print(f"snapshot {snapshot} ({size:.0f} MB, {runs} runs, datasets {', '.join(queries.datasets(snapshot))})\n")
    print("| page | pass | callbacks | p50 callback ms | p95 callback ms | max callback ms | p50 page load ms | slowest callback |")
    print("|---|---|---|---|---|---|---|---|")
    for page in PAGES:
        for label, cold in (("cold", True), ("warm", False)):
            per_callback: list[float] = []
            per_page: list[float] = []
            slowest: dict[str, float] = {}
            load_page(app, client, page, snapshot)  # import/JIT warm-up, not measured
            for _ in range(repeats):
                if cold:
                    queries.clear_cache()
                timings = load_page(app, client, page, snapshot)
                per_callback += [t for _, t in timings]
                per_page.append(sum(t for _, t in timings))
                for name, t in timings:
                    slowest[name] = max(slowest.get(name, 0.0), t)
            worst = max(slowest, key=slowest.get)
            print(f"| {page} | {label} | {len(PAGES[page])} | {1000 * percentile(per_callback, 50):.0f} | "
                  f"{1000 * percentile(per_callback, 95):.0f} | {1000 * max(per_callback):.0f} | "
                  f"{1000 * statistics.median(per_page):.0f} | {worst} |")


if __name__ == "__main__":
    typer.run(main)
