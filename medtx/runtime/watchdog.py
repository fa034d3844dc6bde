"""A watchdog for a long command: when the command's process dies without cleaning up (kill -9, the OOM killer),
stop every process it had started and close its runs as `interrupted`, then republish the snapshot.

`medtx pipeline` starts one (`start_watchdog`) before anything else: `python -m medtx.runtime.watchdog PID
STARTED DB SNAPSHOT`, in a session of its own (a Ctrl-C to the terminal's process group does not reach it; the
command handles that itself). Every 0.5 s it lists the command's descendants; when the command is gone it
SIGTERMs the last list it saw (SIGKILL after 3 s; a pid reused since is recognised by its start time and left
alone), and, when a run of this warehouse still names the dead process as its owner, publishes the snapshot —
publishing marks runs whose owner is gone as interrupted first (medtx.store.run_owners) — so the dashboard and
`medtx status` stop showing them as running. Without it, a kill -9 left the Prefect server and the training pool
running (4 processes, 1.4 GB, 26 minutes later) and the dashboard said "running, ETA 7s".
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from medtx.runtime.processes import end_processes

POLL_S = 0.5
GRACE_S = 3.0
WATCHDOG_COMMAND = "medtx pipeline watchdog"  # how it names itself in the writer file


def start_watchdog(db: Path | str, snapshot: Path | str) -> subprocess.Popen:
    """Start the watchdog of this process (in its own session; it exits soon after this process does)."""
    me = psutil.Process()
    return subprocess.Popen(
        [sys.executable, "-m", "medtx.runtime.watchdog", str(me.pid), repr(me.create_time()), str(db), str(snapshot)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True,
    )


def _alive(pid: int, started: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - started) < 1.0 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _tree(pid: int) -> dict[int, float]:
    """pid -> create time of every descendant of `pid` now."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for child in children:
        if child.pid == os.getpid():
            continue  # the watchdog is a child of the command too
        try:
            out[child.pid] = child.create_time()
        except psutil.Error:
            continue
    return out


def _stop(seen: dict[int, float]) -> list[int]:
    """SIGTERM, then SIGKILL after GRACE_S, every process of `seen` that is still the same process."""
    procs = []
    for pid, created in seen.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 1.0:
                procs.append(p)
        except psutil.Error:
            continue
    end_processes(procs, GRACE_S)
    return [p.pid for p in procs]


def _owns_a_running_run(db: Path, pid: int) -> bool:
    import duckdb

    from medtx.store.db import quote_table

    if not db.exists():
        return False
    try:
        with duckdb.connect(str(db), read_only=True) as con:
            return any(con.execute(f"SELECT count(*) FROM {quote_table(table)} WHERE status = 'running' AND owner_pid = ?",
                                   [pid]).fetchone()[0] for table in ("ml.pipeline_runs", "ml.runs"))
    except duckdb.Error:
        return True  # cannot tell (the file is busy): publishing checks again


def close_runs(db: Path, snapshot: Path, pid: int) -> None:
    """Runs still owned by the dead `pid` become interrupted (publish marks them), and the snapshot shows it."""
    if not _owns_a_running_run(db, pid):
        return
    from medtx.publish.snapshot import publish_snapshot
    from medtx.store.writer_lock import hold_writer

    from medtx.store.writer_lock import WarehouseBusy

    try:
        with hold_writer(db, WATCHDOG_COMMAND, wait_s=30):  # the dead holder's file is taken over
            publish_snapshot(db, snapshot)
    except WarehouseBusy:
        pass  # a new writer started first: its start marks the dead runs interrupted (and it publishes)


def watch(pid: int, started: float, db: Path, snapshot: Path) -> None:
    seen: dict[int, float] = {}
    while _alive(pid, started):
        seen = _tree(pid) or seen
        time.sleep(POLL_S)
    _stop(seen)
    close_runs(db, snapshot, pid)


def main(argv: list[str]) -> int:
    pid, started, db, snapshot = int(argv[0]), float(argv[1]), Path(argv[2]), Path(argv[3])
    os.nice(5)  # never compete with the run it watches
    try:
        watch(pid, started, db, snapshot)
    except Exception as exc:  # noqa: BLE001 - a watchdog reports and ends; the next start recovers the rest
        print(f"medtx watchdog: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
