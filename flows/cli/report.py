"""`medtx report --run R [--out F] [--format html|json]`: the run's model card (medtx.evaluation.card) as one
self-contained HTML page and the same content as Markdown beside it (F with suffix .md); `--format json` writes
the card's JSON twin instead (every figure and every conclusion with its reason; docs/MODEL_CARD.md).

Reads the live warehouse read-only; while a pipeline holds it, the published snapshot (and says so). Default
output: `<reports>/<run id>.html` under the warehouse's folder (`reports/` beside it).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import typer
from rich.console import Console

from flows.cli import app
from medtx.evaluation.card import build_card
from medtx.settings import get_settings
from medtx.store.db import open_warehouse

_err = Console(stderr=True)


FORMATS = ("html", "json")


def _render(source: Path, run_id: str, fmt: str) -> tuple[str, str | None]:
    """(the page, the Markdown beside it or None) in `fmt`."""
    with open_warehouse(source, read_only=True) as con:
        card = build_card(con, run_id)
    return (card.html(), card.markdown()) if fmt == "html" else (card.json(), None)


@app.command("report")
def report(
    run: str = typer.Option(..., "--run", help="Run id (`medtx status` / the dashboard's run page list them)."),
    out: Path = typer.Option(None, "--out", help="HTML file to write (default: reports/<run id>.html beside the "
                             "warehouse); the Markdown goes beside it with suffix .md."),
    db: Path = typer.Option(None, "--db", help="Warehouse file (default: settings `db`)."),
    fmt: str = typer.Option("html", "--format", help="html (the page and its Markdown) or json (the card's JSON "
                            "twin: every figure and conclusion, for registries and review scripts)."),
) -> None:
    """Write the run's model card: lineage, the task's clock, split sizes, headline metrics with intervals and
    verdicts, subgroups with a forest plot, calibration, operating points, collapse and leakage flags,
    limitations. One HTML page that renders offline, and Markdown."""
    if fmt not in FORMATS:
        _err.print(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}", highlight=False)
        raise typer.Exit(2)
    settings = get_settings(db=db)
    source = settings.db
    if not source.exists():
        _err.print(f"no warehouse at {source}: run `medtx pipeline --db {source}` first", highlight=False)
        raise typer.Exit(2)
    try:
        try:
            page, markdown = _render(source, run, fmt)
        except duckdb.IOException:  # a pipeline is writing: read what it last published
            if not settings.snapshot.exists():
                _err.print(f"{source} is locked by a running writer and nothing is published yet", highlight=False)
                raise typer.Exit(1) from None
            _err.print(f"{source} is being written; reading the published snapshot {settings.snapshot}",
                       highlight=False)
            page, markdown = _render(settings.snapshot, run, fmt)
    except ValueError as exc:  # an unknown run id
        _err.print(f"--run: {exc}", highlight=False)
        raise typer.Exit(2) from None
    out = out or source.parent / "reports" / f"{run}.{fmt}"
    if fmt == "json" and out.suffix.lower() != ".json":
        _err.print(f"--out {out}: --format json writes JSON; name a .json file", highlight=False)
        raise typer.Exit(2)
    if fmt == "html" and out.suffix.lower() not in (".html", ".htm"):
        _err.print(f"--out {out}: the card is HTML; name a .html file (the Markdown goes beside it as .md)",
                   highlight=False)
        raise typer.Exit(2)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    if markdown is None:
        typer.echo(f"model card (JSON): {out}")
        return
    out.with_suffix(".md").write_text(markdown, encoding="utf-8")
    typer.echo(f"model card: {out} (and {out.with_suffix('.md').name})")
