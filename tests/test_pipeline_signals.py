"""Issue 34 items 8, 9, 11: stopping a real `medtx pipeline` the way a terminal and an operator do.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group (the command, its temporary Prefect
server, its training processes); `kill` of a service sends SIGTERM, here also to the whole group; kill -9 of the
main pid leaves its children to the watchdog. In every case, within 15 s: the command is gone, every process it
started is gone, its pipeline run is recorded `interrupted` in the warehouse and in the published snapshot (what
the dashboard reads) and `medtx status` says so, and the writer lock is free (a rerun starts at once).

Every process carries MEDTX_TEST_MARK in its environment (tests.fixtures_processes), so orphans re-parented to
init are found too. The pipeline trains a GRU and a Transformer for 200 epochs on a 300-patient synthetic
cohort: the signal lands during training.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import psutil
import pytest

from tests.fixtures_prefect import migrated_prefect_home
from tests.fixtures_processes import marked_pids

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
CONFIG = """
datasets: [{source: "synth:300"}]
tasks:
  drug_rec:
    models:
      - {model: logreg}
      - {model: gru, overrides: {epochs: 200, patience: 200}}
      - {model: transformer, overrides: {epochs: 200, patience: 200}}
seeds: [42]
"""


def _env(marker: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MEDTX_"))}
    return {**env, "PYTHONPATH": str(REPO), "MEDTX_TEST_MARK": marker, "MEDTX_HOME": str(tmp / "home")}


class Pipeline:
    """A real `medtx pipeline` in a process group of its own (as a terminal's foreground job), its output read
    by a thread."""

    def __init__(self, tmp: Path, marker: str) -> None:
        config = tmp / "c.yaml"
        config.write_text(CONFIG)
        self.db = tmp / "home" / "w.duckdb"
        migrated_prefect_home(tmp / "home" / "prefect-home")  # where MEDTX_HOME puts it
        self.marker = marker
        self.proc = subprocess.Popen([PY, "-c", "from flows.cli import main; main()", "pipeline", "--config",
                                      str(config), "--db", str(self.db)], env=_env(marker, tmp), cwd=tmp,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, "".join(self.lines)[-3000:]
            assert time.monotonic() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.2)

    def children(self) -> list[int]:
        return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]


def _gone(pids: list[int], marker: str, timeout: float) -> list[int]:
    """Wait up to `timeout` for the processes (and every process carrying `marker`) to end; the survivors."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in set(pids) | set(marked_pids(marker))
                 if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _runs(path: Path) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT status, error FROM ml.pipeline_runs").fetchall()


def _assert_recorded_interrupted(pipe: Pipeline, why: str) -> None:
    runs = _runs(pipe.db)
    assert [s for s, _ in runs] == ["interrupted"], runs
    assert why in runs[0][1], runs
    snapshot = pipe.db.with_name("w.snapshot.duckdb")
    assert [s for s, _ in _runs(snapshot)] == ["interrupted"]  # what the dashboard shows
    status = subprocess.run([PY, "-c", "from flows.cli import main; main()", "status", "--db", str(pipe.db)],
                            capture_output=True, text=True, env=_env("status", pipe.db.parent.parent), cwd=REPO,
                            timeout=120, check=False)
    cells = [c.strip() for c in status.stdout.replace("┃", "│").split("│")]
    assert status.returncode == 0 and "interrupted" in cells and "running" not in cells, status.stdout
    assert not pipe.db.with_name("w.duckdb.writer.json").exists()  # the lock is free


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_process_group_ends_the_pipeline_within_15_s(tmp_path: Path, signum: int) -> None:
    marker = f"signal-{os.getpid()}-{signum}"
    pipe = Pipeline(tmp_path, marker)
    pipe.wait_for("samples.drug_rec")  # training starts next
    time.sleep(4)
    started = pipe.children() + marked_pids(marker)
    assert len(started) >= 3, started  # the Prefect server, training processes, the watchdog
    sent = time.monotonic()
    os.killpg(pipe.proc.pid, signum)  # as a terminal's Ctrl-C (or `kill -TERM -PGID`) does
    pipe.proc.wait(timeout=60)
    seconds = time.monotonic() - sent
    pipe.reader.join(timeout=30)
    out = "".join(pipe.lines)
    name = signal.Signals(signum).name
    assert pipe.proc.returncode == 128 + signum, out[-3000:]
    assert seconds < 15, (seconds, out[-3000:])
    last = [line for line in pipe.lines if line.strip()][-1]
    assert last.startswith(f"medtx pipeline: stopped by {name}: recorded as interrupted: ml.pipeline_runs "), out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert _gone(started, marker, timeout=5) == []
    _assert_recorded_interrupted(pipe, f"interrupted: {name} received")
    print(f"{name} to the group: exit {pipe.proc.returncode} after {seconds:.1f} s; {len(started)} processes gone")


@pytest.mark.slow
def test_kill_minus_9_of_the_main_pid_leaves_no_process_and_closes_its_run(tmp_path: Path) -> None:
    marker = f"kill9-{os.getpid()}"
    pipe = Pipeline(tmp_path, marker)
    pipe.wait_for("samples.drug_rec")
    time.sleep(4)
    started = pipe.children() + marked_pids(marker)
    assert len(started) >= 3, started
    sent = time.monotonic()
    os.kill(pipe.proc.pid, signal.SIGKILL)  # the main pid only: its children are orphaned
    pipe.proc.wait(timeout=30)
    assert _gone(started, marker, timeout=15) == [], [psutil.Process(p).cmdline() for p in started
                                                       if psutil.pid_exists(p)]
    seconds = time.monotonic() - sent
    _assert_recorded_interrupted(pipe, "is no longer running")
    print(f"kill -9 of the main pid: every child gone and the run closed {seconds:.1f} s later")
