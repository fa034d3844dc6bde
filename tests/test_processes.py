"""medtx.runtime.processes: stopping every process a command started, with real processes.

The case that matters is a child that is starting a process of its own while the tree is being stopped (a Dask
worker starting a server, a pool replacing a worker): listing the tree once and then terminating it left such a
grandchild orphaned and running, re-parented to init, where no later listing finds it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from medtx.runtime.processes import descendants, stop_descendants
from tests.fixtures_processes import marked_pids

# Starts `sleep` processes as fast as it can, for as long as it lives.
SPAWNER = "import subprocess\nwhile True:\n    subprocess.Popen(['sleep', '120'])\n"


@pytest.mark.parametrize("attempt", range(3))
def test_a_child_starting_children_while_it_is_stopped_leaves_none_behind(attempt: int) -> None:
    before = descendants()
    marker = f"spawner-{os.getpid()}-{attempt}"
    spawner = subprocess.Popen([sys.executable, "-c", SPAWNER], env={**os.environ, "MEDTX_TEST_MARK": marker})
    try:
        deadline = time.monotonic() + 30
        while len(marked_pids(marker)) < 20 and time.monotonic() < deadline:  # it is busy starting grandchildren
            time.sleep(0.05)
        assert len(marked_pids(marker)) >= 20
        stopped = stop_descendants(before, grace_s=2)
        assert spawner.pid in stopped
        spawner.wait(timeout=10)
        time.sleep(0.2)
        assert marked_pids(marker) == []
    finally:
        for pid in marked_pids(marker):
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


def test_what_ran_before_is_left_alone_and_signals_are_restored() -> None:
    mine = subprocess.Popen(["sleep", "60"])
    try:
        before = descendants()
        handler = signal.getsignal(signal.SIGTERM)
        late = subprocess.Popen(["sleep", "60"])
        assert stop_descendants(before, grace_s=2) == [late.pid]
        late.wait(timeout=10)  # stop_descendants reaped it (so Popen sees no status of its own)
        assert not psutil.pid_exists(late.pid)
        assert mine.poll() is None and psutil.Process(mine.pid).status() != psutil.STATUS_STOPPED
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        mine.kill()
        mine.wait()


# Ignores SIGTERM as Python's multiprocessing resource tracker does, and says so once it does.
DEAF = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('deaf', flush=True)\ntime.sleep(120)\n"


def test_a_child_that_ignores_sigterm_is_killed_without_waiting_the_whole_grace() -> None:
    """The resource tracker of the training pool ignores SIGTERM: every `medtx pipeline` waited the whole 5 s
    grace for it at exit before killing it. It is now killed DEAF_WAIT_S after the others are gone."""
    from medtx.runtime.processes import DEAF_WAIT_S, ignores_sigterm

    before = descendants()
    deaf = subprocess.Popen([sys.executable, "-c", DEAF], stdout=subprocess.PIPE, text=True)
    polite = subprocess.Popen(["sleep", "120"])
    try:
        assert deaf.stdout.readline().strip() == "deaf"
        assert ignores_sigterm(deaf.pid) and not ignores_sigterm(polite.pid)
        started = time.monotonic()
        assert sorted(stop_descendants(before, grace_s=20)) == sorted([deaf.pid, polite.pid])
        seconds = time.monotonic() - started
        assert not psutil.pid_exists(deaf.pid) and not psutil.pid_exists(polite.pid)
        assert seconds < DEAF_WAIT_S + 5, seconds  # not the 20 s grace
    finally:
        for proc in (deaf, polite):
            proc.kill()
            proc.wait()
