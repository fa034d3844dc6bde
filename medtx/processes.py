"""Stopping what a command started: every descendant process (a temporary Prefect server and its uvicorn
child, a local Dask cluster's workers), however the command ends.

Why: those children are started by libraries that stop them from atexit hooks or context managers, which do
not run on SIGTERM (Python's default is to die at once) and can be skipped when a failure unwinds oddly; the
orphans were found still serving, re-parented to init, 20 minutes after a failed pipeline.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import psutil

log = logging.getLogger("medtx.processes")


def descendants() -> set[int]:
    """The pids of every process below this one now (taken before a command starts its own)."""
    return {c.pid for c in psutil.Process().children(recursive=True)}


def _started_since(before: set[int]) -> list[psutil.Process]:
    """Descendants that are not, and do not descend from, a process that was there `before` (a test
    harness's server, say, is not ours to stop)."""
    me, mine = psutil.Process().pid, []
    for child in psutil.Process().children(recursive=True):
        try:
            chain = {child.pid} | {p.pid for p in child.parents() if p.pid != me}
        except psutil.NoSuchProcess:
            continue
        if not chain & before:
            mine.append(child)
    return mine


def stop_descendants(before: set[int] | None = None, grace_s: float = 5.0) -> list[int]:
    """Terminate every descendant started since `before` (default: all of them), then kill those still
    alive after `grace_s`; returns the pids that had to be stopped."""
    children = _started_since(before or set())
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    if children:
        log.info("stopped %d child process(es): %s", len(children), [c.pid for c in children])
    return [c.pid for c in children]


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds like an exception: finally blocks and atexit hooks run


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM ends the process through normal unwinding (so run rows are closed and children stopped).
    Only the main thread may set a signal handler; elsewhere (a command run from a worker) this is a no-op."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_on_sigterm)
