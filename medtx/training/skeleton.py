"""The in-process run skeleton (benchmarks and tests; the product trains through `medtx.worker`, see
docs/ARCHITECTURE.md "How a run trains"): start run -> load samples -> fit -> predict -> evaluate -> record.

- load and start: one short warehouse connection reads the task's samples and records the run as `running`
  (`records.start_run`: config, data fingerprint, the shared synthetic-dataset rule `runs.is_synthetic`); it is
  closed before any training starts. A load that fails (no samples, an empty split) is recorded as a failed run;
- fit, predict, evaluate: the runner's own `train(samples, folder, on_epoch) -> records.RunResults`, with no
  connection held (`on_epoch` writes each epoch through its own short connection); checkpoints go to the one
  checkpoint-folder rule `runs.run_folder` (`<models_dir>/<run_id>`);
- record: `records.record_results`, one transaction; a failure anywhere marks the run failed and re-raises.

No SQL is written here: every write goes through medtx.training.records.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import duckdb

from medtx.store.db import open_warehouse
from medtx.training import records
from medtx.training.runs import is_synthetic, settings_run_folder

S = TypeVar("S")
OnEpoch = Callable[[int, Mapping[str, float]], None]


@dataclass
class RunPlan(Generic[S]):
    """What one run is: its identity, how its samples are read and described, and how it is trained."""

    task: str
    model: str
    dataset: str
    seed: int
    load: Callable[[duckdb.DuckDBPyConnection], S]  # the samples, read through a short connection
    describe: Callable[[S], dict[str, Any]]  # the run's ml.runs config, given its samples
    fingerprint: Callable[[duckdb.DuckDBPyConnection], str]  # the data the run reads
    train: Callable[[S, Path, OnEpoch], records.RunResults]  # fit -> predict -> evaluate
    code_parts: tuple[str, ...] = ()
    run_id: str | None = None
    pipeline_run_id: str | None = None
    models_dir: Path | None = None
    device: str | None = None  # recorded while the run is running (the results' summary may refine it)
    outcome: dict[str, Any] = field(default_factory=dict)  # filled: the recorded results, for the log line


def execute_run(db: Path | str, plan: RunPlan[S]) -> str:
    """Run the plan through the skeleton; returns the run id (the results are left in `plan.outcome`)."""
    from medtx.store.fingerprint import code_version

    db = Path(db)
    run_id = plan.run_id or records.new_run_id(plan.task, plan.model, plan.dataset, plan.seed)
    with open_warehouse(db) as con:
        loaded: BaseException | None = None
        try:
            samples = plan.load(con)
            config = plan.describe(samples)
        except Exception as exc:  # recorded below as a failed run, then raised
            loaded, config = exc, {}
        records.start_run(con, run_id, task=plan.task, model=plan.model, dataset=plan.dataset, seed=plan.seed,
                          config=config, device=plan.device, data_fingerprint=plan.fingerprint(con),
                          code_version=code_version(*plan.code_parts), is_synthetic=is_synthetic(con, plan.dataset),
                          pipeline_run_id=plan.pipeline_run_id)
        if loaded is not None:
            records.fail_run(con, run_id, f"{type(loaded).__name__}: {loaded}")
            raise loaded

    def on_epoch(epoch: int, metrics: Mapping[str, float]) -> None:
        with open_warehouse(db) as con:
            records.write_epochs(con, run_id, epoch, metrics)

    try:
        results = plan.train(samples, settings_run_folder(db, run_id, plan.models_dir), on_epoch)
        with open_warehouse(db) as con:
            records.record_results(con, run_id, results)
    except BaseException as exc:
        with open_warehouse(db) as con:
            records.fail_run(con, run_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
        raise
    plan.outcome["results"] = results
    return run_id
