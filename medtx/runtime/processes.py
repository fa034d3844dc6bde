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
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import psutil

log = logging.getLogger("medtx.runtime.processes")


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


def _freeze(before: set[int]) -> list[psutil.Process]:
    """SIGSTOP every descendant started since `before`, again and again until a pass finds none new. A stopped
    process cannot start another, so a child that was starting one while the first pass listed the tree (a Dask
    worker starting a server, say) is caught with its child instead of leaving it orphaned, out of sight."""
    frozen: dict[int, psutil.Process | None] = {}
    for _ in range(100):  # bounded: only this process's own threads can still start more
        new = [p for p in _started_since(before) if p.pid not in frozen]
        if not new:
            break
        for child in new:
            try:
                child.suspend()
            except psutil.NoSuchProcess:  # gone already: nothing to stop
                frozen[child.pid] = None
            else:
                frozen[child.pid] = child
    return [child for child in frozen.values() if child is not None]


# How long a process that ignores SIGTERM is waited for once the others are gone (see end_processes).
DEAF_WAIT_S = 1.0


def ignores_sigterm(pid: int) -> bool:
    """Whether the process has SIGTERM set to ignored (Linux: the SigIgn mask of /proc/PID/status); False where
    that cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def end_processes(children: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM (and SIGCONT, so a stopped process sees it), then SIGKILL what is still alive after `grace_s`.
    A process that is gone, or not ours to signal, is passed over. Used here and by medtx.runtime.watchdog.

    A process that ignores SIGTERM (Python's multiprocessing resource tracker does, by design) is not waited
    for the whole grace, which it would always use up: it ends by itself only once every process holding its
    pipe is gone, so it is given DEAF_WAIT_S after the others (to clean up after a killed owner), then SIGKILL."""
    deaf = [child for child in children if ignores_sigterm(child.pid)]
    for child in children:
        try:
            child.terminate()
            child.resume()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs([child for child in children if child not in deaf], timeout=grace_s)
    _, still = psutil.wait_procs(deaf, timeout=min(grace_s, DEAF_WAIT_S))
    alive += still
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def stop_descendants(before: set[int] | None = None, grace_s: float = 5.0) -> list[int]:
    """Stop every descendant started since `before` (default: all of them): freeze the tree, SIGTERM each
    process, SIGKILL those still alive after `grace_s`; repeated while this process's own threads start more
    (a Dask nanny restarting its worker). Returns the pids that had to be stopped.

    SIGTERM and SIGINT are ignored meanwhile: a second signal must not leave the tree frozen."""
    stopped: list[int] = []
    with _signals_ignored():
        for _ in range(5):
            children = _freeze(before or set())
            if not children:
                break
            end_processes(children, grace_s)
            stopped += [c.pid for c in children]
    if stopped:
        log.info("stopped %d child process(es): %s", len(stopped), stopped)
    return stopped


@contextmanager
def _signals_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds like an exception: finally blocks and atexit hooks run


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM ends the process through normal unwinding (so run rows are closed and children stopped).
    Only the main thread may set a signal handler; elsewhere (a command run from a worker) this is a no-op."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_on_sigterm)
