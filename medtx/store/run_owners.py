"""Run owners and crash recovery: every `running` row of ml.pipeline_runs / ml.runs names the process that
owns it (pid, host, that process's start time) and a heartbeat the owner refreshes as it works.

Why: a kill -9 (or a power cut) cannot mark its own run as ended, so the *next* writer does it. On start,
`medtx pipeline` and `medtx train` (and publish, before it copies the warehouse) call `mark_interrupted`:
a running row whose owner is gone becomes `interrupted`, with when (finished_at) and why (error). An owner is
gone when, on this host, its pid is not alive (or is a different process that reused the pid); on another
host, which cannot be asked, when its heartbeat is older than `heartbeat_timeout_s()`.
Heartbeats go through the connection the owner already has open (DuckDB takes one writer at a time).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import duckdb
import psutil

from medtx.store.db import quote_ident, quote_table
from medtx.store.writer_lock import process_alive

log = logging.getLogger("medtx.runs")

HEARTBEAT_TIMEOUT_ENV = "MEDTX_HEARTBEAT_TIMEOUT_S"
DEFAULT_HEARTBEAT_TIMEOUT_S = 3600.0  # one epoch / one pipeline step of a big model can take tens of minutes

# table -> its id column (fixed names: never user input)
_TABLES = {"ml.pipeline_runs": "pipeline_run_id", "ml.runs": "run_id"}


@dataclass(frozen=True)
class Owner:
    pid: int
    host: str
    started: float


@dataclass(frozen=True)
class Interrupted:
    table: str
    run_id: str
    reason: str


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)  # TIMESTAMP columns hold naive UTC


def this_process() -> Owner:
    pid = os.getpid()
    return Owner(pid, socket.gethostname(), psutil.Process(pid).create_time())


def heartbeat_timeout_s() -> float:
    raw = os.environ.get(HEARTBEAT_TIMEOUT_ENV)
    try:
        value = float(raw) if raw is not None else DEFAULT_HEARTBEAT_TIMEOUT_S
    except ValueError as exc:
        raise ValueError(f"{HEARTBEAT_TIMEOUT_ENV}={raw!r}: expected a number of seconds > 0") from exc
    if value <= 0:
        raise ValueError(f"{HEARTBEAT_TIMEOUT_ENV}={raw!r}: expected a number of seconds > 0")
    return value


def owner_gone(pid: int | None, host: str | None, started: float | None, heartbeat: datetime | None,
               now: datetime, timeout_s: float) -> str | None:
    """Why the owner of a running row is gone, or None while it may still be alive."""
    if pid is None or host is None:
        return "no owner recorded (written by a medtx older than run owners)"
    if host == socket.gethostname():
        if process_alive(pid, started):
            return None
        return f"owner pid {pid} on {host} is no longer running"
    if heartbeat is not None and now - heartbeat <= timedelta(seconds=timeout_s):
        return None
    seen = heartbeat.isoformat(sep=" ", timespec="seconds") if heartbeat else "never"
    return f"owner pid {pid} on {host} sent no heartbeat for over {timeout_s:g} s (last: {seen})"


def mark_interrupted(con: duckdb.DuckDBPyConnection, timeout_s: float | None = None) -> list[Interrupted]:
    """Mark every `running` pipeline/model run whose owner is gone as `interrupted` (in the caller's
    transaction, if any). Returns what it marked."""
    timeout = heartbeat_timeout_s() if timeout_s is None else timeout_s
    now = utcnow()
    marked = []
    for table, key in _TABLES.items():
        rows = con.execute(
            f"SELECT {quote_ident(key)}, owner_pid, owner_host, owner_started, heartbeat_at FROM {quote_table(table)}"
            " WHERE status = 'running'"
        ).fetchall()
        for run_id, pid, host, started, beat in rows:
            why = owner_gone(pid, host, started, beat, now, timeout)
            if why is None:
                continue
            reason = f"interrupted: {why}; noticed at {now.isoformat(sep=' ', timespec='seconds')} UTC"
            con.execute(
                f"UPDATE {quote_table(table)} SET status = 'interrupted', finished_at = ?, error = ?"
                f" WHERE {quote_ident(key)} = ? AND status = 'running'",
                [now, reason, run_id],
            )
            log.warning("%s %s: %s", table, run_id, reason)
            marked.append(Interrupted(table, run_id, reason))
    return marked


def mark_own_interrupted(con: duckdb.DuckDBPyConnection, why: str, owner: Owner | None = None) -> list[Interrupted]:
    """Mark every `running` pipeline/model run owned by this process (`owner`) as `interrupted` because `why`
    (a stop signal): the owner is alive, so `mark_interrupted` would leave them."""
    me = owner or this_process()
    now = utcnow()
    reason = f"interrupted: {why}; at {now.isoformat(sep=' ', timespec='seconds')} UTC"
    marked = []
    for table, key in _TABLES.items():
        rows = con.execute(
            f"SELECT {quote_ident(key)}, owner_started FROM {quote_table(table)}"
            " WHERE status = 'running' AND owner_pid = ? AND owner_host = ?", [me.pid, me.host]).fetchall()
        for run_id, started in rows:
            if abs((started or 0) - me.started) >= 1.0:
                continue  # an earlier process with the same pid
            con.execute(f"UPDATE {quote_table(table)} SET status = 'interrupted', finished_at = ?, error = ?"
                        f" WHERE {quote_ident(key)} = ? AND status = 'running'", [now, reason, run_id])
            marked.append(Interrupted(table, run_id, reason))
    return marked


def claim(con: duckdb.DuckDBPyConnection, table: str, run_id: str, owner: Owner | None = None) -> None:
    """Record this process as the owner of a (just inserted) running row, with a first heartbeat."""
    key = _TABLES[table]
    me = owner or this_process()
    con.execute(
        f"UPDATE {quote_table(table)} SET owner_pid = ?, owner_host = ?, owner_started = ?, heartbeat_at = ?"
        f" WHERE {quote_ident(key)} = ?",
        [me.pid, me.host, me.started, utcnow(), run_id],
    )


def heartbeat(con: duckdb.DuckDBPyConnection, table: str, run_id: str) -> None:
    """The owner is still working on `run_id` (cheap: one UPDATE on a connection it already has)."""
    key = _TABLES[table]
    con.execute(f"UPDATE {quote_table(table)} SET heartbeat_at = ? WHERE {quote_ident(key)} = ? AND status = 'running'",
                [utcnow(), run_id])


def holds_run(con: duckdb.DuckDBPyConnection, table: str, run_id: str, owner: Owner | None = None) -> bool:
    """True when this process owns `run_id` (pid, host and process start time): only then may a failure
    handler write it."""
    key = _TABLES[table]
    me = owner or this_process()
    row = con.execute(
        f"SELECT owner_pid, owner_host, owner_started FROM {quote_table(table)} WHERE {quote_ident(key)} = ?", [run_id]
    ).fetchall()
    return bool(row) and row[0][0] == me.pid and row[0][1] == me.host and abs((row[0][2] or 0) - me.started) < 1.0
