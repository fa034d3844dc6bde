"""Trainings that run at once on one machine run in their own processes.

Why: torch's default random generator (weight init, dropout), its intra-op thread count and autocast state are
per process. Two trainings in two threads of one process draw from one generator in an order the scheduler
picks, so a seed no longer fixes the result (tests/test_train_processes.py shows it with seeded draws). A process pool (spawn: fork is unsafe with torch's threads) gives each training its own
generator; its workers are reused across trainings, so torch is imported once per worker, not per training.
Log records of the workers go to the parent's log files (appended).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def _init_worker(log_files: list[str], level: int, preload: tuple[str, ...] = ()) -> None:
    import importlib
    import signal

    # Ctrl-C reaches the whole process group: the parent stops its workers itself (terminate, then kill), so a
    # worker does not print a KeyboardInterrupt traceback per training on the way out.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    root = logging.getLogger()
    root.setLevel(level)
    for path in log_files:
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s"))
        root.addHandler(handler)
    logging.getLogger("medtx").setLevel(level)
    for name in preload:  # what every training needs (torch, the trainer), imported once per worker
        importlib.import_module(name)
    _library_logs_to_files()


def _library_logs_to_files() -> None:
    """transformers writes its warnings (e.g. the load report of a checkpoint whose MLM head is dropped) to the
    terminal through a handler of its own: in a training process they go to the log files, like every record."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()


def release_memory() -> None:
    """Give the memory a finished training freed back to the operating system. A pool process outlives its
    trainings, and what one freed stays in its allocators: glibc's heap and pyarrow's pool keep freed blocks for
    reuse, so an idle process still held its largest training's working set (next_visit transformer at synth_46520:
    1,390 MiB RSS after it returned, 505 MiB after this; issue #35)."""
    import ctypes
    import gc

    gc.collect()
    try:
        import pyarrow

        pyarrow.default_memory_pool().release_unused()
    except ImportError:
        pass
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _then_release(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a pool process, then `release_memory` (also when it raised)."""
    try:
        return fn(*args, **kwargs)
    finally:
        release_memory()


def _log_files() -> list[str]:
    return [h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]


class TrainingProcesses:
    """A pool of `width` spawned training processes. A worker that dies (killed, out of memory) fails the
    training it ran with a clear error, and the pool is replaced so the other trainings go on."""

    def __init__(self, width: int, preload: tuple[str, ...] = ()) -> None:
        self.width = width
        self._initargs = (_log_files(), logging.getLogger("medtx").getEffectiveLevel(), preload)
        self._lock = threading.Lock()
        self._pool = self._start()

    def _start(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.width, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=self._initargs)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            pool = self._pool
        try:
            return pool.submit(_then_release, fn, *args, **kwargs).result()
        except BrokenProcessPool as exc:
            with self._lock:
                if self._pool is pool:
                    self._pool = self._start()
            raise RuntimeError(f"the training process died ({exc}); killed or out of memory?") from None

    def warm(self) -> None:
        """Start every worker now, without waiting (each imports the pool's `preload` modules as it starts):
        spawning a worker and importing torch take seconds, which then overlap the stages before training
        instead of delaying the first one."""
        with self._lock:
            for _ in range(self.width):  # the executor spawns a worker per submit while none is idle
                self._pool.submit(int)

    def shutdown(self) -> None:
        with self._lock:
            self._pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def training_processes(width: int, preload: tuple[str, ...] = ()) -> Iterator[TrainingProcesses | None]:
    """A pool of `width` training processes while the block runs (None when one training runs at a time:
    it runs in the caller's process); shut down, waiting for running trainings, when the block ends. With
    `preload`, the workers start at once and import those modules (`warm`)."""
    if width <= 1:
        yield None
        return
    pool = TrainingProcesses(width, preload)
    if preload:
        pool.warm()
    try:
        yield pool
    finally:
        pool.shutdown()


# The pool of the run in progress in this process (medtx.pipeline.executor.run_resources), reached by the threads
# that run its steps (a Prefect thread runner's, LocalBackend's); None outside a run and in other processes.
_ACTIVE: TrainingProcesses | None = None


@contextmanager
def active_pool(width: int, preload: tuple[str, ...] = ()) -> Iterator[TrainingProcesses | None]:
    """`training_processes(width, preload)`, made the pool `call_in_active` uses while the block runs."""
    global _ACTIVE
    with training_processes(width, preload) as pool:
        _ACTIVE = pool
        try:
            yield pool
        finally:
            _ACTIVE = None


def call_in_active(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a process of the active pool, or here when none is active."""
    return call_in(_ACTIVE, fn, *args, **kwargs)


def call_in(pool: TrainingProcesses | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a pool process (its result or its exception), or here when there is no pool."""
    if pool is None:
        return fn(*args, **kwargs)
    return pool.call(fn, *args, **kwargs)
