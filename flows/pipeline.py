"""The end-to-end pipeline as a Prefect flow: ingest -> map codes -> samples -> train/evaluate -> publish.

The plan (medtx/pipeline/plan.py) lists every step a config implies; the scheduler that walks it layer by layer
is medtx/pipeline/executor.py. This module only adapts it to Prefect: every step is one run of one generic
Prefect task (`step_task`, submitted by `_PrefectBackend`), the flow holds the writer lock, opens and closes the
run's bookkeeping and publishes the final snapshot, and the deployments serve it on a schedule. So one model's
failure is recorded and the rest continue.

Caching is the executor's (medtx.pipeline.executor): a step whose input key (its parameters and the fingerprints
of the tables, files and code it reads) matches its last successful run, and whose output the warehouse still
holds unchanged (ml.pipeline_steps keeps its fingerprint), is reused without a task run; Prefect caches nothing.

DuckDB takes one writer at a time, across processes too, so steps run one after another by default; only
training can overlap (`runner.train_concurrency`, e.g. one per GPU), and the flow never holds a connection
while tasks run (tasks open and close their own). With a Dask runner, tasks execute on the Dask workers,
which must see the warehouse path (same machine, or a shared filesystem).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from medtx.pipeline import runs
from medtx.pipeline import executor, steps
from medtx.pipeline.config import PipelineConfig, RunnerConfig, load_config, resolve_devices
from medtx.pipeline.plan import Plan, Step, build_plan
from medtx.publish.snapshot import publish_snapshot
from medtx.settings import PROJECT_ROOT, Settings, get_settings
from medtx.store.writer_lock import hold_writer

log = logging.getLogger("medtx.pipeline")

DEFAULT_CONFIG = PROJECT_ROOT / "config" / "default.yaml"


class PipelineFailed(RuntimeError):
    """Raised at the very end, after publishing, when any step failed."""


# Who watches this process's flow runs (the CLI's progress display): called with ("plan", [PlannedStep]),
# ("started", Step), ("finished", StepOutcome), ("published", Snapshot). Not a flow parameter: a display is
# not serialisable and a served deployment has none.
_OBSERVERS: list[Callable[[str, Any], None]] = []
@contextmanager
def observed(observer: Callable[[str, Any], None]) -> Iterator[None]:
    """Call `observer` with the progress events of the flow runs in this process while inside the block."""
    _OBSERVERS.append(observer)
    try:
        yield
    finally:
        _OBSERVERS.remove(observer)


# The CLI's handler for SIGINT/SIGTERM (flows/cli/pipeline.py: stop the children, close the runs, exit at once).
# Prefect swaps in its own SIGTERM handler for a flow run (it raises into the flow, which then reports to a
# server the signal has usually killed too, with retries); the flow puts this one back.
_STOP_HANDLER: Callable[[int, Any], None] | None = None


@contextmanager
def stopping_with(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """SIGTERM during this process's flow runs calls `handler` (as SIGINT already does), not Prefect's."""
    global _STOP_HANDLER
    _STOP_HANDLER = handler
    try:
        yield
    finally:
        _STOP_HANDLER = None


def _restore_stop_handler() -> None:
    import signal
    import threading

    if _STOP_HANDLER is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _STOP_HANDLER)


def _notify(event: str, payload: Any) -> None:
    for observer in list(_OBSERVERS):
        try:
            observer(event, payload)
        except Exception:  # a broken display must not break the run
            log.exception("progress observer failed on %s", event)


def retry_on_lock(task, task_run, state) -> bool:
    """Retry when another process holds the warehouse file (DuckDB's IOException) or on transient OS/network
    errors; never on bad input, a missing file or a model that fails (those fail the same way again)."""
    exc = state.data if isinstance(state.data, BaseException) else None
    return isinstance(exc, duckdb.IOException) or (isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError))


@task(name="step", task_run_name="{name}", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5,
      retry_condition_fn=retry_on_lock)
def step_task(kind: str, name: str, parameters: dict) -> dict:
    """Every pipeline step, one Prefect task run each (`name` titles it): the library's step function
    (medtx.pipeline.steps.call_step). Whether a step may be reused is the executor's decision, made before this
    runs, so Prefect caches nothing. A training reads its package and writes a result package, never the
    warehouse; under the thread runner with several trainings at once it runs in a process of the run's pool
    (medtx.pipeline.executor.run_resources)."""
    return steps.call_step(kind, parameters)


@task(name="publish", task_run_name="publish", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5, retry_condition_fn=retry_on_lock)
def publish_task(db: Path, snapshot: Path) -> dict:
    return publish_snapshot(db, snapshot).__dict__


def make_task_runner(runner: RunnerConfig, train_width: int = 1):
    """Thread pool (default; wide enough for `train_width` trainings at once) or prefect-dask's
    DaskTaskRunner (a cluster address, or a local cluster)."""
    if runner.kind == "thread":
        return ThreadPoolTaskRunner(max_workers=max(runner.max_workers, train_width))
    from prefect_dask import DaskTaskRunner

    if runner.address:
        return DaskTaskRunner(address=runner.address)
    return DaskTaskRunner(
        cluster_kwargs={"n_workers": runner.n_workers, "threads_per_worker": runner.threads_per_worker}
    )


def plan_for(cfg: PipelineConfig, settings: Settings) -> Plan:
    return build_plan(cfg, Path(settings.cache_dir) / "synth", Path(settings.data_dir))


def _training_slots(cfg: PipelineConfig) -> tuple[int, int | None]:
    """(trainings at once, torch threads each) for this machine: GPUs of `devices`, then cores (medtx.runtime.resources)."""
    gpus = sum(d.startswith("cuda") for d in resolve_devices(cfg.devices))
    return cfg.runner.resolved(gpus=gpus)


@dataclass
class _PrefectHandle:
    """A Prefect task run as the executor sees it (medtx.pipeline.executor.Handle)."""

    future: PrefectFuture

    def wait(self) -> None:
        self.future.wait()

    def state(self) -> str:
        return "completed" if self.future.state.is_completed() else "failed"

    def result(self) -> dict | None:
        return self.future.result()

    def error(self) -> str:
        exc = self.future.result(raise_on_failure=False)
        return f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(self.future.state.message)


@dataclass
class _PrefectBackend:
    """Each step as a Prefect task run: training on the configured runner (threads or Dask), every other step on
    `local`, a one-thread runner in this process (they write the warehouse)."""

    runner: Any
    local: Any

    def submit(self, step: Step, parameters: dict[str, Any]) -> _PrefectHandle:
        on = self.runner if step.kind.name == "train" else self.local
        args = dict(kind=step.kind.name, name=step.name, parameters=parameters)  # names at the Prefect boundary
        return _PrefectHandle(on.submit(step_task, parameters=args))

    def first_done(self, handles: Sequence[_PrefectHandle]) -> int:
        done = next(as_completed([h.future for h in handles]))
        return next(i for i, h in enumerate(handles) if h.future is done)


def _publish_artifacts(db: Path, run_id: str, outcomes: dict[str, runs.StepOutcome]) -> None:
    run_ids = [rid for o in outcomes.values() if o.result for rid in o.result.get("run_ids", [])]
    create_table_artifact(
        key="pipeline-metrics", table=runs.metrics_rows(db, run_ids) or [{"note": "no model runs"}],
        description=("Test metrics of this pipeline run's models: value and 95% interval (bootstrap with replacement "
                     "over test patients); safedrug_sd: the SafeDrug convention (sd over 10 subsamples of 80% of "
                     "test patients, about half as wide), for comparing with papers"),
    )
    create_table_artifact(key="pipeline-steps", table=runs.step_table(db, run_id),
                          description="Every step of this run: completed, cached (reused), failed or skipped")
    if any(o.step.kind.name == "ingest" for o in outcomes.values()):
        create_markdown_artifact(key="pipeline-data-quality", markdown=runs.data_quality_markdown(db),
                                 description="Rows loaded/rejected per table, drug-code mapping coverage")


@flow(name="medtx-pipeline", log_prints=True)
def pipeline(
    config: str = str(DEFAULT_CONFIG),
    db: str | None = None,
    steps_only: list[str] | None = None,
    refresh: list[str] | None = None,
) -> dict[str, str]:
    """Run every step of `config` (or only `steps_only`), publish the snapshot, and fail if any step failed.

    `refresh` names steps to recompute even when cached (`medtx run-task NAME --refresh`).
    """
    _restore_stop_handler()
    cfg = load_config(config, sources=True)
    settings = get_settings(db=db)
    plan = plan_for(cfg, settings)
    selected = [plan[name] for name in steps_only] if steps_only else list(plan.steps)
    run_id = str(flow_run.id or f"local-{time.time_ns()}")
    # One pipeline per warehouse: a second one refuses here, before it writes anything (re-entrant for the
    # CLI, which took the same holder file before starting Prefect).
    with hold_writer(settings.db, "medtx pipeline", wait_s=0):
        try:
            # inside the try: a failure after the run's row exists (writing the plan) still closes the row
            executor.start(settings, run_id, cfg.model_dump(mode="json") | {"config_file": str(config)}, selected,
                           _notify)
            # The runner comes from the config at run time, so CLI runs and served deployments both honour it.
            width, threads = _training_slots(cfg)
            log.info("training: %d at once, %s torch thread(s) each", width, threads or "default")
            pool = width if cfg.runner.kind == "thread" else 1  # Dask workers train in their own processes
            with (executor.run_resources(cfg.runner.duckdb_memory_limit, pool),
                  make_task_runner(cfg.runner, width) as runner, ThreadPoolTaskRunner(max_workers=1) as local):
                run = executor.Executor(settings, run_id, _PrefectBackend(runner, local),
                                        train_width=width, torch_threads=threads, refresh=set(refresh or []),
                                        notify=_notify)
                run.run(executor.layers_of(selected))
            # The run's status is written before publishing so the dashboard's snapshot shows how it ended;
            # a failed publish below overwrites it with `failed` in the live warehouse.
            failed = run.failed()
            runs.finish_pipeline_run(run.db, run_id, failed)
            publish_task(run.db, settings.snapshot)
            _publish_artifacts(run.db, run_id, run.outcomes)
        except BaseException as exc:
            # Only this run's own row, and only while this process holds it (finish_pipeline_run checks).
            runs.finish_pipeline_run(settings.db, run_id, [f"pipeline: {type(exc).__name__}: {exc}"])
            raise
    if failed:
        raise PipelineFailed(f"{len(failed)} step(s) failed or were skipped: {', '.join(failed)}")
    return {name: o.state for name, o in run.outcomes.items()}


def run_pipeline(
    config: Path | str = DEFAULT_CONFIG,
    db: Path | str | None = None,
    steps_only: list[str] | None = None,
    refresh: list[str] | None = None,
    return_state: bool = False,
):
    """Run the flow in this process (with a temporary Prefect server unless PREFECT_API_URL is set)."""
    with one_prefect_api():
        return pipeline(
            config=str(config), db=str(db) if db else None, steps_only=steps_only, refresh=refresh,
            return_state=return_state,
        )


@contextmanager
def one_prefect_api() -> Iterator[None]:
    """Every process of a run reports to one Prefect API: PREFECT_API_URL when one is set, else Prefect's
    temporary server, started here and named in the settings and the environment the run's Dask workers get.

    Why: a worker process does not inherit the temporary server (it is in no setting), so each worker started
    a temporary server of its own on its first task. Its task runs then went there instead of to the flow's
    server, and a pipeline stopped while a worker was starting one left that server running, orphaned."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED, temporary_settings

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the one Prefect's own clients start and stop at exit
    server.start()
    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before


def deployments(config: Path | str = DEFAULT_CONFIG, db: Path | str | None = None) -> list:
    """Two deployments of the pipeline: `scheduled` (cron from the config) and `on-demand` (no schedule)."""
    from prefect.schedules import Cron

    cfg = load_config(config)
    params = {"config": str(Path(config).resolve()), "db": str(db) if db else None}
    scheduled = pipeline.to_deployment(
        name="scheduled", parameters=params, schedules=[Cron(cfg.schedule.cron, timezone=cfg.schedule.timezone)],
        description=f"medtx pipeline on {cfg.name}, cron {cfg.schedule.cron} ({cfg.schedule.timezone})",
    )
    on_demand = pipeline.to_deployment(name="on-demand", parameters=params,
                                    description=f"medtx pipeline on {cfg.name}, run on request")
    return [scheduled, on_demand]


def serve_pipeline(config: Path | str = DEFAULT_CONFIG, db: Path | str | None = None) -> None:
    """Serve both deployments from this process until interrupted; schedules stay active after a stop."""
    from prefect import serve

    serve(*deployments(config, db), pause_on_shutdown=False)
