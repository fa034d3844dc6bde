"""A finished run's whole analysis, in order: the intervals of its test metrics (medtx.evaluation.uncertainty),
the paired comparisons of its (task, dataset) against the reference baseline (medtx.evaluation.comparisons), then
its subgroups, calibration and operating points (medtx.evaluation.trust; binary and multi-label runs on admissions).
Called by the writer when it records a run (medtx.training.records.finish_run, medtx.pipeline.exchange)."""

from __future__ import annotations

import duckdb

from medtx.evaluation.comparisons import compare_runs
from medtx.evaluation.trust import analyse_trust
from medtx.evaluation.uncertainty import record_intervals, run_data_cache
from medtx.tasks import find_task


def analyse_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    """Intervals, then comparisons, then the trust figures of one stored run. The run's task name is resolved
    here, once; a name the registry no longer knows gets intervals but no comparisons."""
    name, dataset = con.execute("SELECT task, dataset FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()[0]
    with run_data_cache():  # each run's predictions read once (none of them changes here)
        record_intervals(con, run_id)
        if (task := find_task(name)) is not None:
            compare_runs(con, task, dataset, [run_id])
        analyse_trust(con, run_id)
