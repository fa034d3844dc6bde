"""Finding every process a test started, however deep: each carries MEDTX_TEST_MARK=<marker> in its environment
(children inherit it), so re-parented orphans are found too."""

from __future__ import annotations

import psutil


def marked_pids(marker: str) -> list[int]:
    """Every live process of this machine whose environment carries `marker` (zombies have none to read)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MEDTX_TEST_MARK") == marker:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
