"""How much of the machine a training may use: CPU cores actually available, torch threads, concurrency.

The rule (documented in README "Threads"): a process may use the cores in its CPU affinity mask, capped by
its cgroup CPU quota (containers, CI runners, `docker --cpus`). Trainings that run at once split those cores
evenly: each gets `max(1, cores // concurrent_trainings)` torch intra-op threads, so `medtx train` alone uses
the whole machine while N concurrent trainings never ask for more threads than there are cores (oversubscribed
OpenMP threads spin-wait on each other: the issue measured 10x slower epochs at load ~5).
`train_concurrency: auto` = one training per GPU with `devices: [auto]` on a GPU machine, otherwise
`cores // threads_per_training` with one thread per training by default (small models scale better across
processes/threads of work than across intra-op threads on 2-8 cores).

Trainings started separately (a `medtx train` beside a pipeline, two users' runs, a benchmark) count too: every
`trainer.fit` holds a slot in a machine-wide registry for as long as it trains (`training_slot`: a file under an
exclusive `flock` in `$MEDTX_TRAININGS_DIR`, default `<tmp>/medtx-trainings`; the kernel drops the lock when the
process dies, however it dies, so a killed training never counts). At every epoch a training without an explicit
`num_threads` caps its torch threads at `cores // running_trainings()` (never above what its caller set), so a
second training started beside it shares the cores instead of oversubscribing them (issue #18).
"""

from __future__ import annotations

import fcntl
import math
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """CPUs allowed by the cgroup quota (v2 `cpu.max`, else v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`);
    None when unlimited or unreadable."""
    try:
        text = (root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
        if text:
            return None
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus(root: Path = CGROUP_ROOT) -> int:
    """Cores this process may really use: its affinity mask, capped by the cgroup quota (rounded up), >= 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


def threads_per_training(concurrent: int, cpus: int | None = None) -> int:
    """Torch intra-op threads for each of `concurrent` trainings sharing `cpus` cores."""
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, concurrent))


def auto_train_concurrency(cpus: int | None = None, threads: int = 1, gpus: int = 0) -> int:
    """`runner.train_concurrency: auto`: one training per GPU when GPUs are used, else cores // threads."""
    if gpus > 0:
        return gpus
    cpus = available_cpus() if cpus is None else cpus
    return max(1, cpus // max(1, threads))


# ----------------------------------------------------------------------------------------------- machine-wide count

TRAININGS_DIR_ENV = "MEDTX_TRAININGS_DIR"


def trainings_dir() -> Path:
    """Where running trainings register (one folder per machine: `$MEDTX_TRAININGS_DIR` or <tmp>/medtx-trainings)."""
    return Path(os.environ.get(TRAININGS_DIR_ENV) or Path(tempfile.gettempdir()) / "medtx-trainings")


@contextmanager
def training_slot(folder: Path | None = None) -> Iterator[bool]:
    """Hold a slot in the machine's registry of running trainings while the block runs (yields whether it could).

    The slot is a `<pid>-<random>.lock` file under an exclusive flock, renamed into place only once locked, so
    every `.lock` file without a lock is a leftover of a dead process (removed by `running_trainings`). A
    registry that cannot be written (read-only tmp) only means this training is not counted by others.
    """
    folder = folder or trainings_dir()
    name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    handle = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if folder.stat().st_uid == os.getuid():
            folder.chmod(0o1777)  # one registry for every user of the machine, like /tmp itself
        handle = open(folder / f"{name}.tmp", "w")  # noqa: SIM115 -- held open for the whole training
        fcntl.flock(handle, fcntl.LOCK_EX)
        os.rename(folder / f"{name}.tmp", folder / f"{name}.lock")
    except OSError:
        if handle is not None:  # opened but not locked or renamed: leave no file behind
            handle.close()
            (folder / f"{name}.tmp").unlink(missing_ok=True)
        yield False
        return
    try:
        yield True
    finally:
        (folder / f"{name}.lock").unlink(missing_ok=True)
        handle.close()


def running_trainings(folder: Path | None = None) -> int:
    """Trainings holding a slot on this machine now (this one included when it holds one); >= 1."""
    folder = folder or trainings_dir()
    count = 0
    try:
        paths = list(folder.glob("*.lock"))
    except OSError:
        return 1
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # ended meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            count += 1  # held: a live training
        except OSError:
            pass
        else:
            path.unlink(missing_ok=True)  # nobody holds it: its process died without cleaning up
        finally:
            os.close(fd)
    return max(1, count)


def fair_threads(ceiling: int, cpus: int | None = None, folder: Path | None = None) -> int:
    """Torch threads for one of the trainings running now: `cores // running_trainings()`, at most `ceiling`."""
    return max(1, min(ceiling, threads_per_training(running_trainings(folder), cpus)))
