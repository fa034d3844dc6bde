"""`@writes_warehouse("medtx ingest mimic3")`: a command that writes the warehouse holds its writer file
(medtx.store.writer_lock) for its whole run, waiting politely (bounded, MEDTX_LOCK_WAIT_S, default 120 s) while
another writer holds it, with one line naming the holder; after the wait it exits 1 with that line. A damaged
writer file (a text pid, a folder in its place) is one line naming it, exit 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from medtx.settings import get_settings

_console = Console(stderr=True)


def _say(line: str) -> None:
    _console.print(f"[yellow]{escape(line)}[/yellow]", highlight=False, soft_wrap=True)


def writes_warehouse(command: str, *, recover: bool = False) -> Callable:
    """Hold the `--db` warehouse's writer file around the command; with `recover`, first mark runs whose
    owner is gone as interrupted (what `medtx train` does on start)."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)  # typer reads the wrapped signature (its options)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from medtx.store.db import open_warehouse, transaction
            from medtx.store.run_owners import mark_interrupted
            from medtx.store.writer_lock import HolderFileDamaged, WarehouseBusy, hold_writer

            db = get_settings(db=kwargs.get("db")).db
            try:
                with hold_writer(db, command, say=_say):
                    if recover and db.exists():
                        with open_warehouse(db) as con, transaction(con):
                            for gone in mark_interrupted(con):
                                _say(f"{gone.table} {gone.run_id}: {gone.reason}")
                    return fn(*args, **kwargs)
            except WarehouseBusy as exc:  # a damaged writer file is bad input: exit 2
                _console.print(f"[red]{escape(str(exc))}[/red]", highlight=False, soft_wrap=True)
                raise typer.Exit(2 if isinstance(exc, HolderFileDamaged) else 1) from None

        return wrapper

    return decorate
