"""Replay the callbacks each page fires when it loads: warms the caches as soon as a new snapshot appears.

The dashboard caches query results and built page parts per snapshot version (`dashboard.queries`), so
the first visitor after a publish would pay for filling them. A daemon thread watches the snapshot and,
on every new version, requests every page's default view through Flask's test client, exactly as a
browser would (each chained callback fed with the previous ones' outputs). `benchmarks/dashboard.py`
measures latency with the same replay. `create_app(..., warm=True)` (what `medtx dashboard` uses) starts
one `Warmer`, kept in `app.server.extensions["medtx_warmer"]`.
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from dash import Dash

from dashboard import queries

log = logging.getLogger("medtx.dashboard")

# Page -> the callbacks that fire when it loads, in dependency order, by one of their output ids.
PAGE_CALLBACKS: dict[str, list[str]] = {
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
POLL_S = 1.0  # how often the warmer stat()s the snapshot


def callback_key(app: Dash, output: str) -> str:
    """The callback_map key (single or multi-output) that contains `output`."""
    for key in app.callback_map:
        if key == output or f"..{output}.." in key or key.startswith(f"..{output}...") or f"...{output}.." in key:
            return key
    raise KeyError(output)


def _payload(app: Dash, key: str, values: dict[str, Any]) -> dict:
    spec = app.callback_map[key]

    def bind(items):
        return [{"id": i["id"], "property": i["property"], "value": values.get(f"{i['id']}.{i['property']}")}
                for i in items]

    outputs = key.strip(".").split("...") if key.startswith("..") else [key]
    out_specs = [{"id": o.rsplit(".", 1)[0], "property": o.rsplit(".", 1)[1]} for o in outputs]
    inputs = bind(spec["inputs"])
    return {
        "output": key,
        "outputs": out_specs if key.startswith("..") else out_specs[0],
        "inputs": inputs,
        "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs[:1]],
        "state": bind(spec.get("state", [])),
    }


def load_page(app: Dash, client, page: str, snapshot: Path, headers: dict[str, str] | None = None,
              search: str = "", view: str = "single") -> list[tuple[str, float, int]]:
    """Fire a page's callbacks in order (URL query `search`, e.g. "?run_id=...", and the patient page's
    attention `view`); returns (callback, seconds, response bytes) for each."""
    signature = queries.snapshot_signature(snapshot)
    values: dict[str, Any] = {"url.pathname": PATHS[page], "url.search": search, "snapshot-present.data": True,
                              "snapshot-version.data": "-".join(map(str, signature or ())),
                              "pt-view.value": view}
    timings = []
    for output in PAGE_CALLBACKS[page]:
        key = callback_key(app, output)
        started = time.perf_counter()
        response = client.post("/_dash-update-component", json=_payload(app, key, values), headers=headers or {})
        body = response.get_data()
        timings.append((output, time.perf_counter() - started, len(body)))
        if response.status_code == 204:  # everything no_update
            continue
        if response.status_code != 200:
            raise RuntimeError(f"{page}: callback {key} answered {response.status_code}: {body[:300]!r}")
        for component, props in json.loads(body)["response"].items():
            for prop, value in props.items():
                values[f"{component}.{prop}"] = value
    return timings


def warm(app: Dash, snapshot: Path, headers: dict[str, str] | None = None,
         stop: threading.Event | None = None) -> float:
    """Load every page once (filling the caches for this snapshot version); returns seconds taken.
    Stops early, between pages, once `stop` is set."""
    started = time.perf_counter()
    client = app.server.test_client()
    for page in PAGE_CALLBACKS:
        if stop is not None and stop.is_set():
            break
        load_page(app, client, page, snapshot, headers)
    return time.perf_counter() - started


class Warmer:
    """A daemon thread that warms every page whenever the snapshot's version changes (and at start).

    `version` is the last snapshot version whose pages are all warm. `stop()` ends the thread; it is also
    called at interpreter exit, so the process never exits while the thread is inside DuckDB (a thread
    killed there aborts the whole process).
    """

    def __init__(self, app: Dash, snapshot: Path, credentials: tuple[str, str] | None = None) -> None:
        self.app, self.snapshot = app, snapshot
        self.headers = None
        if credentials:
            token = base64.b64encode(":".join(credentials).encode()).decode()
            self.headers = {"Authorization": f"Basic {token}"}
        self.version: queries.Signature | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="medtx-dashboard-warmer", daemon=True)

    def start(self) -> Warmer:
        self._thread.start()
        atexit.register(self.stop)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _watch(self) -> None:
        while not self._stop.is_set():
            signature = queries.snapshot_signature(self.snapshot)
            if signature is not None and signature != self.version:
                try:
                    seconds = warm(self.app, self.snapshot, self.headers, self._stop)
                    log.info("warmed every page for snapshot version %s in %.1f s", signature, seconds)
                except Exception:  # a half-published or unreadable file: retry on the next change, keep serving
                    log.exception("warming the dashboard for snapshot version %s failed", signature)
                self.version = signature
            self._stop.wait(POLL_S)
