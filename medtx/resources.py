"""How much of the machine a training may use: CPU cores actually available, torch threads, concurrency.

The rule (documented in README "Threads"): a process may use the cores in its CPU affinity mask, capped by
its cgroup CPU quota (containers, CI runners, `docker --cpus`). Trainings that run at once split those cores
evenly: each gets `max(1, cores // concurrent_trainings)` torch intra-op threads, so `medtx train` alone uses
the whole machine while N concurrent trainings never ask for more threads than there are cores (oversubscribed
OpenMP threads spin-wait on each other: the issue measured 10x slower epochs at load ~5).
`train_concurrency: auto` = one training per GPU with `devices: [auto]` on a GPU machine, otherwise
`cores // threads_per_training` with one thread per training by default (small models scale better across
processes/threads of work than across intra-op threads on 2-8 cores).
"""

from __future__ import annotations

import math
import os
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
