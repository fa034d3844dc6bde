"""`medtx export meds`, `medtx export predictions` and `medtx ingest meds`: MEDS 0.4 datasets out of and into
the warehouse, and a run's test predictions in the meds-evaluation schema. An export refused for its input
(a protected or foreign --out, an unknown dataset, run or task) prints one line and exits 2; so does an import
refused for its input (a format error, a shrink, an implausible row under `fail`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flows.cli import app
from flows.cli.ingest import (
    _ALLOW_SHRINK, _MAX_SHRINK, _PLAUSIBILITY, Plausibility, ingest_app, plausibility_summary,
)
from flows.cli.locking import writes_warehouse
from medtx.ingest import ShrinkGuard
from medtx.store.db import open_warehouse
from medtx.meds import ExportError, MedsFormatError, export_meds, ingest_meds
from medtx.meds.export import DEFAULT_SHARD_ROWS, protected_paths
from medtx.meds.predictions import export_predictions
from medtx.meds.mapping import MappingError
from medtx.meds.tables import BY_NAME
from medtx.settings import get_settings
from medtx.store.outputs import warehouse_paths

export_app = typer.Typer(help="Write warehouse datasets in other formats.", no_args_is_help=True)
app.add_typer(export_app, name="export")
import_app = typer.Typer(help="Bring results made outside medtx into the warehouse.", no_args_is_help=True)
app.add_typer(import_app, name="import")

_console = Console(stderr=True)
_DB = typer.Option(None, "--db", help="Warehouse file (default: settings `db`).")
_USER_ERRORS = (ExportError, MedsFormatError, MappingError, ValueError, FileNotFoundError)


@export_app.command("meds")
def export(
    dataset: str = typer.Option(..., "--dataset", help="Warehouse dataset to export (e.g. mimic3_demo)."),
    out: Path = typer.Option(..., "--out", help="Folder to write the MEDS dataset into (new or empty; never "
                             "the warehouse's folder, the models folder or a folder holding anything else)."),
    labels: list[str] = typer.Option(None, "--labels", help="Write this task's labels (repeatable): "
                                     "any binary EHR task of the registry (`medtx build-samples --help`)."),
    shard_rows: int = typer.Option(DEFAULT_SHARD_ROWS, "--shard-rows", min=1, help="Events per data shard."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace --out when it is a previous medtx MEDS "
                                   "export (anything else is refused)."),
    db: Path = _DB,
) -> None:
    """Export one dataset as MEDS 0.4: data/<split>/ shards, codes, splits, dataset.json (+ labels/<task>/)."""
    settings = get_settings(db=db)
    try:
        with open_warehouse(settings.db) as con:
            r = export_meds(con, dataset, out, shard_rows=shard_rows, labels=labels or [], overwrite=overwrite,
                            protected=protected_paths(settings))
    except _USER_ERRORS as exc:
        _fail("export", exc, code=2)
    table = Table(title=f"MEDS export of {dataset} -> {r.out}")
    for col in ("subjects", "events", "shards", "codes", "labels"):
        table.add_column(col, justify="right")
    table.add_row(f"{r.subjects:,}", f"{r.events:,}", str(len(r.shards)), f"{r.codes:,}",
                  ", ".join(f"{k}: {v:,}" for k, v in r.labels.items()) or "-")
    Console().print(table)


@export_app.command("predictions")
def predictions(
    run: str = typer.Option(..., "--run", help="Run id (ml.runs; `medtx status` / the dashboard list them)."),
    out: Path = typer.Option(..., "--out", help="Parquet file to write (meds-evaluation's prediction schema)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file."),
    db: Path = _DB,
) -> None:
    """Write a run's test predictions for meds-evaluation / MEDS-DEV: subject_id, prediction_time,
    boolean_value, predicted_boolean_value, predicted_boolean_probability."""
    settings = get_settings(db=db)
    try:
        with open_warehouse(settings.db, read_only=True) as con:
            r = export_predictions(con, run, out, overwrite=overwrite, protected=warehouse_paths(settings))
    except _USER_ERRORS as exc:
        _fail("export", exc, code=2)
    Console().print(f"{r.rows:,} test predictions ({r.positives:,} positive) of run {r.run_id} "
                    f"({r.task}, {r.model}, {r.dataset}) -> {r.out}")


@import_app.command("predictions")
@writes_warehouse("medtx import predictions")
def import_predictions_command(
    file: Path = typer.Argument(..., help="Parquet file in meds-evaluation's PredictionSchema (subject_id, "
                                "prediction_time, boolean_value, predicted_boolean_value, "
                                "predicted_boolean_probability), one row per held-out label."),
    task: str = typer.Option(..., "--task", help="Binary EHR task the predictions are for (`medtx export meds --labels` names them)."),
    model: str = typer.Option(..., "--model", help="Name of the outside model on the leaderboard (e.g. "
                              "meds_tab_xgboost; not one of medtx's own model names)."),
    dataset: str = typer.Option(None, "--dataset", help="Warehouse dataset the labels come from (default: the "
                                "only one in the warehouse)."),
    db: Path = _DB,
) -> None:
    """Record a model trained outside medtx (MEDS-Tab, ...) from its test predictions: every row must be a
    held-out label of the task on the dataset; it gets intervals, the paired verdict against the reference
    baseline, subgroups, calibration and a card, marked "trained outside medtx"."""
    from flows.cli.train import default_dataset
    from medtx.meds.import_predictions import import_predictions
    from medtx.tasks import get_task
    from medtx.tasks.verdict import LeakageError

    settings = get_settings(db=db)
    try:
        spec = get_task(task)
        dataset = default_dataset(settings.db, dataset)
        with open_warehouse(settings.db) as con:
            r = import_predictions(con, file, spec, dataset, model)
    except (*_USER_ERRORS, LeakageError, LookupError) as exc:
        _fail("import", exc, code=2)
    from medtx.publish.snapshot import publish_snapshot

    publish_snapshot(settings.db, settings.snapshot)  # the leaderboard and dashboard read the published copy
    Console().print(f"{r.rows:,} held-out predictions ({r.positives:,} positive, {r.n_patients:,} patients) of "
                    f"{r.model} (trained outside medtx) recorded as run {r.run_id} ({r.task}, {r.dataset}) and "
                    f"published: `medtx leaderboard --task {r.task} --dataset {r.dataset}`, "
                    f"`medtx report --run {r.run_id}` for its card", highlight=False, soft_wrap=True)
    typer.echo(r.run_id)


@ingest_app.command("meds")
@writes_warehouse("medtx ingest meds")
def ingest(
    source: Path = typer.Option(..., "--source", help="MEDS dataset folder (data/, metadata/)."),
    dataset: str = typer.Option(None, "--dataset", help="Dataset name [a-z0-9_]+ (default: the folder name)."),
    codes: str = typer.Option(None, "--codes", help="Code mapping: `medtx`, `mimic4` or a YAML file "
                              "(default: from metadata/dataset.json's etl_name)."),
    db: Path = _DB,
    allow_shrink: bool = _ALLOW_SHRINK,
    max_shrink: float = _MAX_SHRINK,
    plausibility: Plausibility = _PLAUSIBILITY,
    cast_types: bool = typer.Option(False, "--cast-types", help="Accept column types meds' DataSchema only "
                                    "casts (a tz-aware or nanosecond time, a float64 numeric_value) and cast them "
                                    "as its align() does; refused otherwise."),
) -> None:
    """Load a MEDS dataset into raw.* so every task builder and model runs on it (as one unit, under the
    writer lock and the row-count guard, like `ingest mimic3`)."""
    settings = get_settings(db=db)
    plausibility = plausibility.value
    try:
        guard = ShrinkGuard(allow_shrink, max_shrink)
        r = ingest_meds(settings.db, source, dataset, codes, guard=guard, plausibility=plausibility,
                        cast_types=cast_types)
    except _USER_ERRORS as exc:
        _fail("ingest", exc, code=2)
    table = Table(title=f"MEDS {source} -> dataset {r.dataset} (codes: {r.mapping}) in {settings.db}")
    table.add_column("table")
    table.add_column("rows loaded", justify="right")
    for name, n in r.rows.items():
        table.add_row(name, f"{n:,}")
    table.add_row("events mapped / not mapped", f"{r.events_mapped:,} / {r.events - r.events_mapped:,}")
    for prefix, target, n in _medication_routes(settings.db, r.dataset):
        route = "name" if target == BY_NAME else "NDC" if "NDC" in prefix else "text"
        table.add_row(f"medications by {route}: {prefix}", f"{n:,}")
    Console().print(table)
    if any(target == BY_NAME for _, target, _ in _medication_routes(settings.db, r.dataset)):
        _console.print(f"medications coded by name are mapped to ATC-3 through the bundled drug names by `medtx "
                       f"map-codes --dataset {r.dataset}` (its coverage table: route name_no_ndc)", highlight=False)
    if r.events > r.events_mapped:
        _console.print("[yellow]codes no rule maps are counted by prefix in raw.meds_codes")
    plausibility_summary({r.dataset}, settings.db)


def _medication_routes(db: Path, dataset: str) -> list[tuple[str, str, int]]:
    """(prefix, target table, rows) of the dataset's medication rules, from the import's accounting."""
    with open_warehouse(db, read_only=True) as con:
        return con.execute("SELECT prefix, target_table, n_rows FROM raw.meds_codes WHERE dataset = ? AND "
                           "target_table IN ('prescriptions', ?) ORDER BY prefix", [dataset, BY_NAME]).fetchall()


def _fail(what: str, exc: Exception, code: int = 1) -> None:
    _console.print(f"[red]{what} failed:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)
