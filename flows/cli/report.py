"""`medtx report --run R [--out F] [--format html|json]`: the run's model card (medtx.evaluation.card) as one
self-contained HTML page and the same content as Markdown beside it (F with suffix .md); `--format json` writes
the card's JSON twin instead (every figure and every conclusion with its reason; docs/MODEL_CARD.md).

Reads the live warehouse read-only, without waiting; while a pipeline holds it, the published snapshot (and says
so). Any other DuckDB error is reported as itself, one line, exit 2. Default output: `<reports>/<run id>.html`
under the warehouse's folder (`reports/` beside it). Both files pass medtx.store.outputs first: never the
warehouse or anything of it (symlinks and hard links followed), an existing file only with `--overwrite`.
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
from medtx.store.outputs import OutputRefused, check_outputs, warehouse_paths, write_output
from medtx.store.writer_lock import WarehouseBusy

_err = Console(stderr=True, soft_wrap=True)  # one line, whatever the terminal width


FORMATS = ("html", "json")


def _render(source: Path, run_id: str, fmt: str) -> tuple[str, str | None]:
    """(the page, the Markdown beside it or None) in `fmt`. No wait: a live writer holds the file for a whole
    pipeline, and the published snapshot answers at once."""
    with open_warehouse(source, read_only=True, wait_s=0) as con:
        card = build_card(con, run_id)
    return (card.html(), card.markdown()) if fmt == "html" else (card.json(), None)


def _refuse(line: str) -> None:
    _err.print(line, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.command("report")
def report(
    run: str = typer.Option(..., "--run", help="Run id (`medtx status` / the dashboard's run page list them)."),
    out: Path = typer.Option(None, "--out", help="File to write (default: reports/<run id>.html or .json beside "
                             "the warehouse); an HTML card's Markdown goes beside it with suffix .md."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing card (and its .md twin)."),
    db: Path = typer.Option(None, "--db", help="Warehouse file (default: settings `db`)."),
    fmt: str = typer.Option("html", "--format", help="html (the page and its Markdown) or json (the card's JSON "
                            "twin: every figure and conclusion, for registries and review scripts)."),
) -> None:
    """Write the run's model card: lineage, the task's clock, split sizes, headline metrics with intervals and
    verdicts, subgroups with a forest plot, calibration, operating points, collapse and leakage flags,
    limitations. One HTML page that renders offline, and Markdown; or its JSON twin."""
    if fmt not in FORMATS:
        _refuse(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")
    settings = get_settings(db=db)
    source = settings.db
    if not source.exists():
        _refuse(f"no warehouse at {source}: run `medtx pipeline --db {source}` first")
    out = out or source.parent / "reports" / f"{run}.{fmt}"
    if fmt == "json" and out.suffix.lower() != ".json":
        _refuse(f"--out {out}: --format json writes JSON; name a .json file")
    if fmt == "html" and out.suffix.lower() not in (".html", ".htm"):
        _refuse(f"--out {out}: the card is HTML; name a .html file (the Markdown goes beside it as .md)")
    wanted = [out, out.with_suffix(".md")] if fmt == "html" else [out]
    try:  # every file checked before anything is read or written (medtx.store.outputs)
        paths = check_outputs(wanted, warehouse_paths(settings), overwrite=overwrite)
    except OutputRefused as exc:
        _refuse(str(exc))
    try:
        try:
            page, markdown = _render(source, run, fmt)
        except WarehouseBusy:  # a pipeline is writing: read what it last published
            if not settings.snapshot.exists():
                _err.print(f"{source} is locked by a running writer and nothing is published yet", highlight=False)
                raise typer.Exit(1) from None
            _err.print(f"{source} is being written; reading the published snapshot {settings.snapshot}",
                       highlight=False)
            page, markdown = _render(settings.snapshot, run, fmt)
    except ValueError as exc:  # an unknown run id
        _refuse(f"--run: {exc}")
    except duckdb.Error as exc:  # not a lock: the file itself (not a DuckDB file, damaged, unreadable)
        _refuse(f"{source}: cannot be read ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})")
    write_output(paths[0], page)
    if markdown is None:
        typer.echo(f"model card (JSON): {paths[0]}")
        return
    write_output(paths[1], markdown)
    typer.echo(f"model card: {paths[0]} (and {paths[1].name})")
