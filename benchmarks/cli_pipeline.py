"""`medtx pipeline` run exactly as a user runs it, for the benchmarks that time or load a whole pipeline
(analysis_share.py, pipeline_under_load.py): the CLI in a subprocess, with one checkout's code, on a fresh
warehouse whose caches, models, exchange folder and Prefect home all live in one work folder (never var/)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PipelineRun:
    exit: int
    wall: float  # seconds
    output: str  # the console's stdout and stderr
    logs: str  # the pipeline's log files, concatenated
    db: Path

    @property
    def final(self) -> str:
        """The console's closing line (`pipeline run ID: State (...)`)."""
        lines = [line for line in self.output.splitlines() if line.startswith("pipeline run ")]
        return lines[-1] if lines else "(no final line)"


def run_cli_pipeline(checkout: Path, config: Path, work: Path, timeout_s: float) -> PipelineRun:
    """Run `medtx pipeline --config CONFIG --db WORK/warehouse.duckdb` with `checkout`'s code (first on
    PYTHONPATH, the working directory) and MEDTX_HOME / PREFECT_HOME in `work`; inherited PREFECT_ settings are
    dropped. Raises subprocess.TimeoutExpired past `timeout_s`."""
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
        "PYTHONPATH": str(checkout), "MEDTX_HOME": str(work), "PREFECT_HOME": str(work / "prefect-home")}
    db = work / "warehouse.duckdb"
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", "pipeline", "--config",
                           str(config.resolve()), "--db", str(db)], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    wall = time.perf_counter() - started
    logs = "".join(p.read_text(errors="replace") for p in sorted(work.rglob("pipeline-*.log")))
    return PipelineRun(done.returncode, wall, done.stdout + done.stderr, logs, db)
