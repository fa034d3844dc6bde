"""One writer at a time, politely: a small holder file next to the warehouse (`W.writer.json`).

Why a side file: DuckDB's own file lock is held only while a connection is open, and medtx's writers open
short connections (a pipeline step, one training epoch), so between them a second writer could slip in and
the two runs would interleave. The holder file is held for a whole command (`medtx pipeline`, `ingest`,
`build-samples`, `train`), names who holds it, and lets a second writer wait with a message or refuse at once.

The file is created with O_EXCL (atomic on every local filesystem), removed on exit, and ignored (replaced)
when it names a process on this host that is no longer alive - so a kill -9 never leaves the warehouse locked.
A process that already holds the file may acquire it again (its own Prefect tasks, a nested command).

The file sits next to the warehouse's *real* path (symlinks resolved), so a `--db` reached through a symlink
meets the same holder. Reading it is tolerant of fields it does not know (a newer medtx may add some) and
strict about the ones it needs: a pid that is not a number, or a folder in the file's place, is
`HolderFileDamaged` (one line naming the file), never mistaken for a stale file and replaced.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import psutil

log = logging.getLogger("medtx.lock")

DEFAULT_LOCK_WAIT_S = 120.0
LOCK_WAIT_ENV = "MEDTX_LOCK_WAIT_S"


class WarehouseBusy(RuntimeError):
    """Another live process holds the warehouse for writing (the message names it)."""


class HolderFileDamaged(WarehouseBusy):
    """The writer file exists but is not one medtx wrote (a text pid, a folder in its place): nobody can tell
    whether a writer is live, so nothing proceeds; the message names the file and what is wrong (exit 2)."""


class WarehouseHardLinked(HolderFileDamaged):
    """The warehouse file has other hard links: a writer reaching it under another name would look for its writer
    file beside that name and miss this one, so nothing writes it until one name is left (bad input, exit 2)."""


@dataclass(frozen=True)
class Holder:
    command: str
    pid: int
    host: str
    since: str  # ISO-8601 UTC
    started: float | None = None  # the process's create time: a reused pid is not the holder

    def describe(self, db: Path) -> str:
        return f"warehouse {db} is being written by `{self.command}` pid {self.pid} on {self.host} since {self.since}"


def lock_wait_s(default: float = DEFAULT_LOCK_WAIT_S) -> float:
    """The bounded wait for a busy warehouse: MEDTX_LOCK_WAIT_S, else `default` (120 s)."""
    raw = os.environ.get(LOCK_WAIT_ENV)
    if raw is None:
        return default
    allowed = f"{LOCK_WAIT_ENV}={raw!r}: not a wait; allowed: a finite number of seconds >= 0 (default {default:g})"
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(allowed) from None
    if not math.isfinite(value) or value < 0:  # nan compared as never due: a wait without end
        raise ValueError(allowed)
    return value


def holder_path(db: Path | str) -> Path:
    """`W.writer.json` beside the warehouse's real file: every symlinked path to it names one holder file."""
    db = Path(os.path.realpath(Path(db).expanduser()))
    return db.with_name(db.name + ".writer.json")


def process_alive(pid: int, started: float | None = None) -> bool:
    """True when `pid` runs on this host (and, given its create time, is the same process, not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _me(command: str) -> Holder:
    pid = os.getpid()
    return Holder(command, pid, socket.gethostname(),
                  datetime.now(timezone.utc).isoformat(timespec="seconds"), psutil.Process(pid).create_time())


def _damaged(path: Path, what: str) -> HolderFileDamaged:
    return HolderFileDamaged(f"{path}: {what}: the warehouse's writer file is damaged; remove it if no medtx "
                             "command is writing this warehouse")


def parse_holder(path: Path, text: str) -> Holder | None:
    """The holder a writer file names. Empty or cut JSON (a holder killed between create and write) -> None;
    unknown keys are ignored; JSON that is not a holder (a text pid, a missing field) -> HolderFileDamaged."""
    try:
        data = json.loads(text)
    except ValueError:
        return None  # half-written by a holder killed between create and write: nobody holds it
    if not isinstance(data, dict):
        raise _damaged(path, f"holds {type(data).__name__} JSON, not an object")
    checks = {"command": str, "host": str, "since": str}
    for key, kind in checks.items():
        if not isinstance(data.get(key), kind):
            raise _damaged(path, f"field {key!r} is {data.get(key)!r}, expected text")
    pid = data.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise _damaged(path, f"field 'pid' is {pid!r}, expected a process id (a positive whole number)")
    started = data.get("started")
    if started is not None and (isinstance(started, bool) or not isinstance(started, (int, float))):
        raise _damaged(path, f"field 'started' is {started!r}, expected a process start time (seconds)")
    return Holder(data["command"], pid, data["host"], data["since"], None if started is None else float(started))


def read_holder(db: Path | str) -> Holder | None:
    """The live holder of `db`, or None (no file, a half-written file, or a dead holder). A file that is not a
    holder (see parse_holder), or a folder in its place: HolderFileDamaged."""
    path = holder_path(db)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise _damaged(path, "is a folder, not a file") from None
    except UnicodeDecodeError:
        raise _damaged(path, "is not UTF-8 text") from None
    holder = parse_holder(path, text)
    if holder is None:
        return None
    if holder.host == socket.gethostname() and not process_alive(holder.pid, holder.started):
        return None
    return holder


def _try_create(path: Path, me: Holder) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        json.dump(me.__dict__, handle)
    return True


@contextmanager
def _directory_mutex(folder: Path) -> Iterator[None]:
    """flock on the warehouse's folder: the check-then-take of the holder file is one step for every
    process on this host (the kernel drops the flock if we die, so it cannot go stale)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _acquire_once(db: Path, me: Holder) -> Holder | None:
    """Take the holder file; return None on success, else the live holder."""
    path = holder_path(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _directory_mutex(path.parent):
        if _try_create(path, me):
            return None
        holder = read_holder(db)
        if holder is not None:
            return holder
        # Stale (its process is gone) or half-written by a killed process: take it over.
        log.warning("replacing the stale writer file %s (its process is gone)", path)
        path.unlink(missing_ok=True)
        if _try_create(path, me):
            return None
        return read_holder(db) or Holder("unknown", -1, "unknown", "unknown")


@contextmanager
def hold_writer(
    db: Path | str, command: str, *, wait_s: float | None = None, say: Callable[[str], None] | None = None
) -> Iterator[Holder]:
    """Hold `db` for writing for the body. Another live holder: wait up to `wait_s` seconds (default
    `lock_wait_s()`; 0 = refuse at once), telling `say` (default: the log) who holds it; then WarehouseBusy."""
    db = Path(db)
    try:
        links = os.stat(db).st_nlink if os.path.isfile(db) else 1
    except OSError:
        links = 1
    if links > 1:  # a symlink resolves to the one writer file (holder_path); a hard link cannot be told apart
        raise WarehouseHardLinked(f"{db}: the warehouse file has {links} hard links, and a writer reaching it under "
                                  "another name would not meet this one's lock; keep one name (a symlink is fine) "
                                  "and remove the other links")
    wait = lock_wait_s() if wait_s is None else wait_s
    me = _me(command)
    current = read_holder(db)
    if current is not None and current.pid == me.pid and current.host == me.host:
        yield current  # re-entrant: this process already holds it (e.g. the pipeline's own tasks)
        return
    deadline = time.monotonic() + wait
    told = False
    while (holder := _acquire_once(db, me)) is not None:
        if wait <= 0 or time.monotonic() >= deadline:
            raise WarehouseBusy(holder.describe(db) + ("; refusing to start a second writer" if wait <= 0
                                                      else f"; gave up after waiting {wait:g} s"))
        if not told:
            (say or log.warning)(f"{holder.describe(db)}; waiting up to {wait:g} s")
            told = True
        time.sleep(0.5)
    try:
        yield me
    finally:
        release(db, me)


def release(db: Path | str, me: Holder) -> None:
    """Remove the holder file if (and only if) it is still ours."""
    path = holder_path(db)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and data.get("pid") == me.pid and data.get("host") == me.host:
        path.unlink(missing_ok=True)
