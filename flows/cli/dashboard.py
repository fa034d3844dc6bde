"""`medtx dashboard`: serve the Dash app over the published snapshot of a warehouse."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from flows.cli import app

log = logging.getLogger("medtx.dashboard")


@app.command()
def dashboard(
    db: Annotated[Path | None, typer.Option(help="Live warehouse (its published snapshot is read) or a *.snapshot.duckdb file.")] = None,
    host: Annotated[str, typer.Option(help="Address to bind; anything but loopback needs MEDTX_DASHBOARD_PASSWORD.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8050,
    threads: Annotated[int, typer.Option(help="Worker threads of the waitress server.")] = 8,
) -> None:
    """Serve the dashboard (read-only; keeps serving while flows write and picks up each new publish)."""
    from waitress import serve

    from dashboard import create_app, resolve_snapshot
    from dashboard.security import InsecureBindError, credentials_from_env, require_password_for
    from medtx.settings import get_settings

    credentials = credentials_from_env()
    try:
        require_password_for(host, credentials[1] if credentials else None)
    except InsecureBindError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    snapshot = resolve_snapshot(get_settings(db=db).db)
    if not snapshot.exists():
        log.warning("no snapshot at %s yet: the dashboard shows an empty state until a flow publishes", snapshot)
    web = create_app(snapshot, credentials=credentials, warm=True)
    log.info("dashboard on http://%s:%d/ (snapshot %s%s)", host, port, snapshot,
             ", basic auth on" if credentials else "")
    serve(web.server, host=host, port=port, threads=threads)
