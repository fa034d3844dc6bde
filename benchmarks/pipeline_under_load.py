"""The default pipeline on a machine saturated by CPU burners: it must complete (issue 44, "a busy machine fails
a run": the default pipeline once exited 1 with a Prefect API ReadTimeout at load 8 on 2 cores).

    python benchmarks/pipeline_under_load.py [--config config/default.yaml] [--burners 8] [--keep DIR]

Starts `--burners` busy-loop processes (`python -c 'while 1: pass'`, nice 0), runs `medtx pipeline` exactly as a
user does (a subprocess of the CLI, so the CLI's Prefect timeouts and retries apply) on a fresh warehouse, caches
and Prefect home in a temporary folder (never var/), samples the 1-minute load average every 5 s, and prints the
wall time, exit status, the console's final line, the step states, every run's status, and the Prefect timeouts
and retries the log holds. The burners are killed in a `finally`, whatever happens. Exit status: the pipeline's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.cli_pipeline import run_cli_pipeline  # noqa: E402


def start_burners(n: int) -> list[subprocess.Popen]:
    """n busy loops at nice 0 (what a busy neighbour looks like to the scheduler)."""
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"], start_new_session=True) for _ in range(n)]


def stop(burners: list[subprocess.Popen]) -> None:
    for proc in burners:  # each by its own pid, only the processes started here
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    for proc in burners:
        proc.wait()


class LoadSampler(threading.Thread):
    """The 1-minute load average every `every_s` seconds, until stopped."""

    def __init__(self, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.every_s, self.samples, self.halt = every_s, [], threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])


def _runs(db: Path, output: str) -> tuple[list[tuple], list[tuple]]:
    """(step state counts, every run's (task, dataset, model, seed, status, error)) of the pipeline run the
    console names last."""
    import re

    import duckdb

    found = re.findall(r"^pipeline run (\S+): ", output, re.M)
    if not found or not db.exists():
        return [], []
    with duckdb.connect(str(db), read_only=True) as con:
        states = con.execute("SELECT state, count(*) FROM ml.pipeline_steps WHERE pipeline_run_id = ? GROUP BY 1 "
                             "ORDER BY 1", [found[-1]]).fetchall()
        runs = con.execute("SELECT task, dataset, model, seed, status, left(coalesce(error, ''), 160) FROM ml.runs "
                           "WHERE pipeline_run_id = ? ORDER BY task, dataset, model", [found[-1]]).fetchall()
    return states, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.yaml")
    parser.add_argument("--burners", type=int, default=8)
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one, deleted)")
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="medtx-bench-load-"))
    print(f"config {args.config}, {os.cpu_count()} CPU cores, {args.burners} burners, work folder {work}, "
          f"load before {os.getloadavg()[0]:.2f}", flush=True)
    burners = start_burners(args.burners)
    sampler = LoadSampler()
    sampler.start()
    try:
        run = run_cli_pipeline(REPO, args.config, work, args.timeout_s)
    finally:
        stop(burners)
        sampler.halt.set()
    loads = sampler.samples or [float("nan")]
    states, runs = _runs(run.db, run.output)
    print(f"wall {run.wall:.1f} s, exit status {run.exit}")
    print(f"load average (1 min, every 5 s, {len(loads)} samples): min {min(loads):.2f}, "
          f"mean {sum(loads) / len(loads):.2f}, max {max(loads):.2f}")
    print(f"final line: {run.final}")
    print("steps: " + ", ".join(f"{n} {s}" for s, n in states))
    print(f"runs: {len(runs)}, " + ", ".join(f"{sum(r[4] == s for r in runs)} {s}"
                                             for s in sorted({r[4] for r in runs})))
    for task, dataset, model, seed, status, error in runs:
        print(f"  {task}/{dataset}/{model}/s{seed}: {status}{(' - ' + error) if error else ''}")
    for word in ("ReadTimeout", "Retrying", "retry", "TimeoutError", "429", "503"):
        print(f"log lines with {word!r}: {sum(word in line for line in run.logs.splitlines())}")
    if run.exit != 0:
        print(run.output[-4000:])
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return run.exit


if __name__ == "__main__":
    sys.exit(main())
