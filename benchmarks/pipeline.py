"""Time the whole pipeline: a cold run (empty warehouse, caches and Prefect results) and a cached rerun.

    nice .venv/bin/python benchmarks/pipeline.py [--config config/default.yaml] [--keep DIR]

Runs against a temporary warehouse and cache folders (never var/), with a temporary Prefect server unless
PREFECT_API_URL is set. Prints wall time per run, time per step kind, states, and the slowest steps.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _summary(db: Path, pipeline_run_id: str) -> tuple[list[tuple], list[tuple]]:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        by_kind = con.execute(
            "SELECT kind, count(*), count(*) FILTER (WHERE state = 'cached'), count(*) FILTER (WHERE state = 'failed'),"
            " round(sum(seconds), 1) FROM ml.pipeline_steps WHERE pipeline_run_id = ? GROUP BY kind"
            " ORDER BY min(finished_at)", [pipeline_run_id]).fetchall()
        slowest = con.execute(
            "SELECT step, state, round(seconds, 1) FROM ml.pipeline_steps WHERE pipeline_run_id = ?"
            " ORDER BY seconds DESC LIMIT 8", [pipeline_run_id]).fetchall()
    return by_kind, slowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.yaml")
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one, deleted)")
    args = parser.parse_args()

    work = args.keep or Path(tempfile.mkdtemp(prefix="medtx-bench-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    for name in ("cache_dir", "results_dir", "models_dir", "exchange_dir"):
        os.environ[f"MEDTX_{name.upper()}"] = str(work / name)
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect-home"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "medtx")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging

    from flows.pipeline import run_pipeline

    # one line per finished step (medtx.pipeline), with a timestamp, as the run goes
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("medtx.pipeline").setLevel(logging.INFO)

    db = work / "warehouse.duckdb"
    print(f"config {args.config}, {os.cpu_count()} CPU cores, work folder {work}")
    try:
        for label in ("cold", "cached"):
            started = time.perf_counter()
            state = run_pipeline(args.config, db, return_state=True)
            wall = time.perf_counter() - started
            by_kind, slowest = _summary(db, str(state.state_details.flow_run_id))
            print(f"\n{label} run: {wall:.1f} s wall, flow state {state.name}")
            print(f"  {'kind':<10}{'steps':>6}{'cached':>8}{'failed':>8}{'seconds':>10}")
            for kind, n, n_cached, n_failed, seconds in by_kind:
                print(f"  {kind:<10}{n:>6}{n_cached:>8}{n_failed:>8}{seconds:>10}")
            print("  slowest: " + ", ".join(f"{s} {sec}s ({st})" for s, st, sec in slowest))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
