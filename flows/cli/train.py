"""`medtx train --task drug_rec --model transformer`: train/evaluate one model on one task and seed.

The same path as a pipeline's training step, in this process (`medtx.pipeline.steps.train_here`): the
step's training package is exported to the exchange folder, the model trains from it (`medtx.worker.train_run`),
and the result package is recorded in the warehouse in one transaction (ml.runs, ml.epochs, ml.metrics,
ml.predictions, ml.attention, checkpoints). The command prints the run id and its test metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flows.cli import app
from flows.cli.locking import writes_warehouse
from medtx.store.db import open_warehouse
from medtx.metrics.intervals import WITHHELD
from medtx.pipeline.kinds.train import train_step
from medtx.pipeline.steps import train_here
from medtx.settings import get_settings
from medtx.tasks import Task, find_task, get_task, names_of_family
from medtx.tasks.verdict import LeakageError

_console = Console(stderr=True)


def parse_overrides(pairs: list[str]) -> dict:
    """`key=value` strings -> dict; values parsed as JSON when they are (numbers, true/false, lists)."""
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--set expects key=value, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


COUNTS = ("n_patients", "n_samples")


def _metrics_table(db: Path, run_id: str) -> Table:
    with open_warehouse(db, read_only=True) as con:
        rows = con.execute(
            "SELECT metric, averaging, value, ci_low, ci_high, ci_method FROM ml.metrics WHERE run_id = ? "
            "AND split = 'test' "
            "ORDER BY metric, averaging", [run_id]).fetchall()
        threshold, source, collapsed, n_units, unit = con.execute(
            "SELECT threshold, threshold_source, collapsed, n_test_units, test_unit FROM ml.runs WHERE run_id = ?",
            [run_id]).fetchall()[0]
        verdicts = con.execute(
            "SELECT c.metric, c.averaging, c.diff, c.ci_low, c.ci_high, c.verdict, r.model FROM ml.comparisons c "
            "JOIN ml.runs r ON r.run_id = c.reference_run_id WHERE c.run_id = ? ORDER BY c.metric", [run_id]).fetchall()
    table = Table(title=f"{run_id} — test value [95% bootstrap interval over {n_units} test {unit or 'units'}]; "
                        f"threshold {threshold} ({source})" + ("  [red]COLLAPSED[/red]" if collapsed else ""))
    for column in ("metric", "averaging", "value"):
        table.add_column(column)
    for metric, averaging, value, lo, hi, method in rows:
        if metric in COUNTS and value is not None and lo is None:  # how many test patients / samples: a count
            table.add_row(metric, averaging, f"{value:,.0f}")
            continue
        shown = "—" if value is None else f"{value:.4f}" + (
            f" [{lo:.4f}, {hi:.4f}]" if lo is not None
            else " (no interval: biased bootstrap)" if (method or "").endswith(WITHHELD) else "")
        table.add_row(metric, averaging, shown)
    for metric, averaging, diff, lo, hi, verdict, reference in verdicts:  # paired, against the reference baseline
        shown = verdict if diff is None or lo is None else f"{verdict}: {diff:+.4f} [{lo:+.4f}, {hi:+.4f}]"
        table.add_row(f"vs {reference}", f"{metric} ({averaging})", shown)
    return table


def _use_available_cores(requested: int | None) -> None:
    """Alone, a training gets every core the process may use (affinity and cgroup quota, medtx.runtime.resources)."""
    import torch

    from medtx.runtime.resources import threads_per_training

    torch.set_num_threads(int(requested) if requested else threads_per_training(1))


def _check_model(task: Task, model: str) -> None:
    """A model the registry does not offer for the task is an error naming those it does (before any run)."""
    from medtx.models.registry import models_for
    from medtx.pipeline.order import model_family

    if not model_family(task, model):
        raise ValueError(f"model {model!r} does not serve task {task.name!r}; "
                         f"models for it: {', '.join(models_for(task))}")


def _check_overrides(task: Task, model: str, values: dict) -> None:
    """`--set` values go through the same checks as a pipeline config's overrides (unknown keys, types, bounds):
    the first problem is bad input, one line naming the key, exit 2 — before any run is recorded."""
    from medtx.pipeline.checks import override_problems, shown

    for key, value, why in override_problems(task, model, values):
        _console.print(f"[red]train refused:[/red] --set {escape(key)}={escape(shown(value))}: {escape(why)}",
                       soft_wrap=True, highlight=False)
        raise typer.Exit(2)


def default_dataset(db: Path, requested: str | None) -> str:
    """The dataset a command means: the one named, else the only one in the warehouse (see medtx.store.datasets)."""
    from medtx.store.datasets import choose_dataset, warehouse_datasets

    with open_warehouse(db, read_only=True) as con:
        return choose_dataset(warehouse_datasets(con), requested, db=str(db))


@app.command("train")
@writes_warehouse("medtx train", recover=True)
def train(
    task: str = typer.Option(..., "--task", help=f"{', '.join(names_of_family('ehr'))} (EHR) or "
                             f"{', '.join(names_of_family('text'))} (text)."),
    model: str = typer.Option(..., "--model", help="A model that serves the task (the registry's: "
                              "docs/ARCHITECTURE.md, 'Tasks and models'); any other is refused with the list."),
    dataset: str = typer.Option(None, "--dataset", help="EHR dataset (default: the only one in the warehouse)."),
    epochs: int = typer.Option(None, "--epochs", help="Maximum epochs (early stopping may end sooner)."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N."),
    seed: int = typer.Option(0, "--seed", help="Training seed (the split seed is fixed by the samples)."),
    overrides: list[str] = typer.Option(None, "--set", help="Model/trainer field override key=value (repeatable), "
                                        "e.g. --set d_model=32 --set lr=0.0005."),
    db: Path = typer.Option(None, "--db", help="Warehouse file (default: settings `db`)."),
) -> None:
    """Train and evaluate one model; results go to ml.runs / ml.epochs / ml.metrics / ml.predictions / ml.attention."""
    settings = get_settings(db=db)
    values = parse_overrides(overrides or [])
    _use_available_cores(values.get("num_threads"))
    if epochs is not None:
        values["epochs"] = epochs
    try:
        if find_task(task) is None and settings.db.is_file():  # an ACES task a pipeline built (samples.aces_tasks)
            from medtx.aces.task import declare_recorded

            with open_warehouse(settings.db, read_only=True) as con:
                declare_recorded(con)
        spec = get_task(task)  # the --task name, resolved once
        _check_model(spec, model)
        _check_overrides(spec, model, values)
        # a task on a fixed corpus (MTSamples, the FAQ) names it; any other reads a warehouse dataset
        fixed = spec.samples.dataset
        dataset = (dataset or fixed) if fixed is not None else default_dataset(settings.db, dataset)
        step = train_step(spec, dataset, model, overrides=values, seed=seed, device=device)
        run_id = train_here(settings.db, step, settings.exchange_dir, settings.models_dir, device=device)[0]
    except LeakageError as exc:  # the leakage gate blocks the task (medtx.tasks.leakage): bad input, one line
        _console.print(f"[red]train refused:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from exc
    except (ValueError, LookupError, FileNotFoundError) as exc:
        _console.print(f"[red]train failed:[/red] {escape(str(exc))}")
        raise typer.Exit(1) from exc
    with open_warehouse(settings.db, read_only=True) as con:  # what was stored, not what the call returned
        stored = con.execute("SELECT status, error FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()
    if not stored or stored[0][0] != "completed":
        status, error = stored[0] if stored else ("missing", None)
        first = (error or "").strip().splitlines()[:1]
        _console.print(f"[red]train failed:[/red] run {run_id} is stored as {status}"
                       f"{': ' + escape(first[0]) if first else ''}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    _console.print(_metrics_table(settings.db, run_id))
    typer.echo(run_id)
