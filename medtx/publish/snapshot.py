"""Publish an atomic, read-only snapshot of the warehouse for the dashboard.

DuckDB's cross-process locks block readers while a writer holds the live file (and block the writer while
a reader holds it), so the dashboard never opens the live warehouse. The pipeline copies it into a
temporary file next to the snapshot and renames it into place: `os.replace` is atomic on POSIX, so a
reader sees the old snapshot or the new one, never a half-written file; readers that already have the old
one open keep reading its (unlinked) inode.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from medtx.store.db import connect, quote_ident, transaction
from medtx.publish.marts import build_marts
from medtx.store.run_owners import mark_interrupted

log = logging.getLogger("medtx.publish.snapshot")


@dataclass(frozen=True)
class Snapshot:
    path: Path
    tables: int
    bytes: int
    seconds: float


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale(tmp: Path) -> None:
    # A crash mid-copy leaves `<snapshot>.tmp` (and maybe its WAL) behind; start clean.
    for stale in (tmp, tmp.with_name(tmp.name + ".wal")):
        stale.unlink(missing_ok=True)


def publish_snapshot(db: Path | str, snapshot: Path | str) -> Snapshot:
    """Copy the live warehouse `db` to `snapshot` atomically (ATTACH tmp, COPY FROM DATABASE, build the
    dashboard's `dash.*` marts in the copy, rename).

    Opens `db` read-write (the same configuration the pipeline's own tasks use, so it works inside the
    pipeline process), which means no other process may hold `db` at that moment.
    """
    started = time.perf_counter()
    db, snapshot = Path(db), Path(snapshot)
    if not db.exists():
        raise FileNotFoundError(f"warehouse {db} does not exist: nothing to publish")
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    tmp = snapshot.with_name(snapshot.name + ".tmp")
    _remove_stale(tmp)
    con = connect(db)
    try:
        with transaction(con):  # a run whose owner is gone is copied as `interrupted`, never `running`
            mark_interrupted(con)
        source = con.sql("SELECT current_database()").fetchall()[0][0]
        con.execute("ATTACH ? AS medtx_snapshot", [str(tmp)])  # a bound path: quotes in --db are fine
        try:
            con.execute(f"COPY FROM DATABASE {quote_ident(source)} TO medtx_snapshot")
            # Read models for the dashboard, in the snapshot only (see medtx.publish.marts).
            build_marts(con, "medtx_snapshot")
            tables = con.sql(
                "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'medtx_snapshot'"
            ).fetchall()[0][0]
        finally:
            con.execute("DETACH medtx_snapshot")  # checkpoints: everything is in the main file now
    except BaseException:
        _remove_stale(tmp)
        raise
    finally:
        con.close()
    _fsync(tmp)
    os.replace(tmp, snapshot)
    _fsync(snapshot.parent)  # make the rename itself durable
    size = snapshot.stat().st_size
    seconds = time.perf_counter() - started
    log.info("published snapshot %s (%d tables, %.1f MB) in %.1f s", snapshot, tables, size / 1e6, seconds)
    return Snapshot(snapshot, tables, size, seconds)


def open_snapshot(snapshot: Path | str) -> duckdb.DuckDBPyConnection:
    """Read-only connection to a published snapshot (what the dashboard uses)."""
    return connect(snapshot, read_only=True)
