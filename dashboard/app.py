"""The Dash app factory: navigation, routing, and the snapshot watcher every page listens to.

Pages live in `dashboard/pages/`; each exposes PATH, NAME, `layout(snapshot, params)` and
`register(app, snapshot)`. Routing is one callback on the URL (no global page registry), so several apps
can live in one process (tests, benchmarks).
"""

from __future__ import annotations

import logging
from pathlib import Path

import dash
import dash_bootstrap_components as dbc
from dash import Dash, Input, Output, State, dcc, html

from dashboard import components, queries
from dashboard.pages import leaderboard, notes, overview, patient, run_detail
from dashboard.validate import query_params
from medtx.settings import snapshot_path

log = logging.getLogger("medtx.dashboard")

PAGES = (overview, leaderboard, run_detail, patient, notes)
ASSETS = Path(__file__).resolve().parent / "assets"
# How often the browser asks whether a new snapshot was published.
SNAPSHOT_POLL_MS = 2000


def resolve_snapshot(db: Path) -> Path:
    """`--db` may name the live warehouse (use its published snapshot) or a snapshot file itself."""
    db = Path(db)
    return db if db.name.endswith(".snapshot.duckdb") else snapshot_path(db)


class _Dash(Dash):
    """Dash without the server's Python build in `_dash-config` (what a visitor needs not know)."""

    def _config(self):
        config = super()._config()
        config.pop("python_version", None)
        return config


def _one_line_error(exc: Exception):
    """A callback or request that fails: the browser gets one line (400 for a bad request, never a
    traceback or a server path); the full text goes to the server log."""
    from werkzeug.exceptions import HTTPException

    from dashboard.validate import InvalidParameter, public_error

    if isinstance(exc, HTTPException):
        return exc
    log.error("request failed: %s", exc, exc_info=exc)
    if isinstance(exc, InvalidParameter):
        return public_error(exc), 400
    # not the exception's class or text: they name internals (KeyError, JSONDecodeError, a module path)
    return "bad request: the dashboard could not use this request (the server log has the details)", 400


# The largest request body the dashboard reads: its callbacks send a few selector values (kilobytes). Bigger
# bodies (10 x 20 MB requests took the server from 477 to 1,005 MB, kept) are answered 413 unread.
MAX_REQUEST_BYTES = 1_000_000


def _plain_requests_only():
    """A compressed request body is refused (415) before anything could inflate it (a 9.8 MB gzip bomb took
    6 GB): browsers never compress what they send to Dash."""
    from flask import request

    encoding = (request.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity":
        return "compressed request bodies are not accepted", 415
    return None


def _declare_aces_tasks(snapshot: Path) -> None:
    """The ACES tasks the snapshot's warehouse built are tasks here too (medtx.aces.task.declare_recorded): the
    pipeline declared them from its config, which this process never read."""
    if not snapshot.is_file():
        return
    from medtx.publish.snapshot import open_snapshot
    from medtx.aces.task import declare_recorded

    con = open_snapshot(snapshot)
    try:
        declare_recorded(con)
    finally:
        con.close()


def create_app(snapshot: Path | str, *, credentials: tuple[str, str] | None = None, warm: bool = False) -> Dash:
    """A Dash app reading only `snapshot`; with `credentials` (user, password) every request needs basic auth.

    With `warm`, a background thread fills the caches for every page as soon as a snapshot version
    appears (`dashboard.warm`), so the first visitor after a publish does not wait.
    """
    snapshot = Path(snapshot)
    _declare_aces_tasks(snapshot)
    app = _Dash(
        __name__,
        title="medtx",
        assets_folder=str(ASSETS),
        serve_locally=True,  # no CDN: the machine may be offline and patient data stays local
        suppress_callback_exceptions=True,  # page components appear only after routing
        update_title=None,
    )
    app.layout = _shell()
    app.server.register_error_handler(Exception, _one_line_error)
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    app.server.before_request(_plain_requests_only)
    _register_shell(app, snapshot)
    for page in PAGES:
        page.register(app, snapshot)
    if credentials:
        from dashboard.security import install_basic_auth

        install_basic_auth(app.server, *credentials)
    if warm:
        from dashboard.warm import Warmer

        app.server.extensions["medtx_warmer"] = Warmer(app, snapshot, credentials).start()
    log.info("dashboard reads snapshot %s", snapshot)
    return app


def _shell() -> html.Div:
    nav = dbc.Navbar(
        dbc.Container(
            [
                dbc.NavbarBrand("medtx", href="/", className="fw-bold"),
                dbc.Nav(
                    [dbc.NavLink(p.NAME, href=p.PATH, active="exact", id=f"nav-{p.PATH.strip('/') or 'overview'}")
                     for p in PAGES],
                    navbar=True,
                ),
                html.Span(id="snapshot-badge", className="ms-auto small text-light"),
            ],
            fluid=True,
        ),
        color="dark",
        dark=True,
        className="mb-3",
    )
    return html.Div(
        [
            dcc.Location(id="url", refresh="callback-nav"),
            dcc.Store(id="snapshot-version"),
            dcc.Store(id="snapshot-present"),
            dcc.Interval(id="snapshot-poll", interval=SNAPSHOT_POLL_MS),
            nav,
            dbc.Container(html.Div(id="page"), fluid=True, className="pb-4"),
        ]
    )


def _register_shell(app: Dash, snapshot: Path) -> None:
    by_path = {p.PATH: p for p in PAGES}

    @app.callback(
        Output("snapshot-version", "data"),
        Output("snapshot-present", "data"),
        Output("snapshot-badge", "children"),
        Input("snapshot-poll", "n_intervals"),
        State("snapshot-version", "data"),
        State("snapshot-present", "data"),
    )
    def watch_snapshot(_n: int | None, known: str | None, was_present: bool | None):
        """Cheap stat() of the snapshot; downstream callbacks fire only when it changed."""
        signature = queries.snapshot_signature(snapshot)
        version = "-".join(map(str, signature)) if signature else "none"
        present = signature is not None
        badge = f"snapshot {snapshot.name}" if present else "no snapshot yet"
        return (
            version if version != known else dash.no_update,
            present if present != was_present else dash.no_update,
            badge,
        )

    @app.callback(
        Output("page", "children"),
        Input("url", "pathname"),
        Input("url", "search"),
        Input("snapshot-present", "data"),
    )
    def route(pathname: str | None, search: str | None, _present: bool | None):
        page = by_path.get(pathname or "/")
        if page is None:
            return components.empty(f"No page at {str(pathname)[:60]!r}. Use the navigation bar.")
        if not queries.has_snapshot(snapshot):
            return components.no_snapshot(snapshot)
        return page.layout(snapshot, query_params(search))
