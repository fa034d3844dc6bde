"""The end-to-end Prefect pipeline: ingest -> map codes -> samples -> train/evaluate -> publish.

The plan (medtx/pipeline_plan.py) lists every step a config implies; this flow walks it layer by layer and
runs each step as its own cached task run, so one model's failure is recorded and the rest continue.

Caching: each task's key is INPUTS + TASK_SOURCE over its parameters, which include explicit fingerprints
(source file hashes, the rows of the upstream tables it reads, the source of the medtx packages it calls).
Because steps write the warehouse, a cache hit is only allowed when the warehouse still holds that step's
output (ml.pipeline_steps keeps its fingerprint); otherwise the task runs with `refresh_cache=True`.

DuckDB takes one writer at a time, across processes too, so steps run one after another by default; only
training can overlap (`runner.train_concurrency`, e.g. one per GPU), and the flow never holds a connection
while tasks run (tasks open and close their own). With a Dask runner, tasks execute on the Dask workers,
which must see the warehouse path (same machine, or a shared filesystem).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import duckdb
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import INPUTS, NO_CACHE, TASK_SOURCE
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from medtx import pipeline_runs as runs
from medtx import pipeline_steps as steps
from medtx.pipeline_config import PipelineConfig, RunnerConfig, load_config
from medtx.pipeline_plan import Plan, Step, build_plan
from medtx.publish import publish_snapshot
from medtx.settings import PROJECT_ROOT, Settings, get_settings
from medtx.writer_lock import hold_writer

log = logging.getLogger("medtx.pipeline")

DEFAULT_CONFIG = PROJECT_ROOT / "config" / "default.yaml"


class PipelineFailed(RuntimeError):
    """Raised at the very end, after publishing, when any step failed."""


def retry_on_lock(task, task_run, state) -> bool:
    """Retry when another process holds the warehouse file (DuckDB's IOException) or on transient OS/network
    errors; never on bad input, a missing file or a model that fails (those fail the same way again)."""
    exc = state.data if isinstance(state.data, BaseException) else None
    return isinstance(exc, duckdb.IOException) or (isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError))


# pipeline_run_id, device and thread count change between runs without changing the result: not in the key.
_CACHED = dict(
    cache_policy=INPUTS + TASK_SOURCE - "pipeline_run_id" - "device" - "torch_threads",
    persist_result=True,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=retry_on_lock,
)


@task(name="synth", task_run_name="{name}", **_CACHED)
def synth_task(name: str, spec: dict, paths: dict, fingerprints: dict) -> dict:
    return steps.run_synth(spec, paths)


@task(name="ingest", task_run_name="{name}", **_CACHED)
def ingest_task(name: str, spec: dict, paths: dict, fingerprints: dict) -> dict:
    return steps.run_ingest(spec, paths)


@task(name="reference", task_run_name="{name}", **_CACHED)
def reference_task(name: str, spec: dict, paths: dict, fingerprints: dict) -> dict:
    return steps.run_reference(spec, paths)


@task(name="codes", task_run_name="{name}", **_CACHED)
def codes_task(name: str, spec: dict, paths: dict, fingerprints: dict) -> dict:
    return steps.run_codes(spec, paths)


@task(name="samples", task_run_name="{name}", **_CACHED)
def samples_task(name: str, spec: dict, paths: dict, fingerprints: dict) -> dict:
    return steps.run_samples(spec, paths)


@task(name="train", task_run_name="{name}", **_CACHED)
def train_task(name: str, spec: dict, paths: dict, fingerprints: dict, pipeline_run_id: str, device: str,
               torch_threads: int | None) -> dict:
    return steps.run_train(spec, paths, pipeline_run_id=pipeline_run_id, device=device, torch_threads=torch_threads)


@task(name="publish", task_run_name="publish", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5, retry_condition_fn=retry_on_lock)
def publish_task(db: Path, snapshot: Path) -> dict:
    return publish_snapshot(db, snapshot).__dict__


TASKS = {
    "synth": synth_task,
    "ingest": ingest_task,
    "reference": reference_task,
    "codes": codes_task,
    "samples": samples_task,
    "train": train_task,
}


def make_task_runner(runner: RunnerConfig):
    """Thread pool (default) or prefect-dask's DaskTaskRunner (a cluster address, or a local cluster)."""
    if runner.kind == "thread":
        return ThreadPoolTaskRunner(max_workers=runner.max_workers)
    from prefect_dask import DaskTaskRunner

    if runner.address:
        return DaskTaskRunner(address=runner.address)
    return DaskTaskRunner(
        cluster_kwargs={"n_workers": runner.n_workers, "threads_per_worker": runner.threads_per_worker}
    )


def _paths(settings: Settings) -> dict[str, str]:
    return {k: str(getattr(settings, k)) for k in ("db", "cache_dir", "data_dir", "models_dir")}


def plan_for(cfg: PipelineConfig, settings: Settings) -> Plan:
    return build_plan(cfg, Path(settings.cache_dir) / "synth", Path(settings.data_dir))


class _Run:
    """The state of one flow run while it walks the plan (settings, outcomes so far)."""

    def __init__(self, settings: Settings, cfg: PipelineConfig, pipeline_run_id: str, refresh: set[str], runner):
        self.settings, self.cfg, self.id, self.refresh, self.runner = settings, cfg, pipeline_run_id, refresh, runner
        self.db = Path(settings.db)
        self.paths = _paths(settings)
        self.outcomes: dict[str, runs.StepOutcome] = {}

    def record(self, outcome: runs.StepOutcome) -> None:
        self.outcomes[outcome.step.name] = outcome
        runs.record_step(self.db, self.id, outcome)
        level = logging.WARNING if outcome.state in ("failed", "skipped") else logging.INFO
        log.log(level, "%-55s %s%s", outcome.step.name, outcome.state, f": {outcome.error}" if outcome.error else "")

    def blocked_by(self, step: Step) -> list[str]:
        return [n for n in step.needs if n in self.outcomes and self.outcomes[n].state in ("failed", "skipped")]

    def submit(self, step: Step, prints: dict[str, str], key: str) -> PrefectFuture:
        refresh = step.name in self.refresh or not runs.cache_still_valid(self.db, step, key)
        options = dict(refresh_cache=refresh, result_storage=Path(self.settings.results_dir))
        args: dict[str, Any] = dict(name=step.name, spec=step.spec(), paths=self.paths, fingerprints=prints)
        if step.kind == "train":
            args |= dict(pipeline_run_id=self.id, device=step.device, torch_threads=self.cfg.runner.torch_threads)
        return self.runner.submit(TASKS[step.kind].with_options(**options), parameters=args)

    def collect(self, step: Step, key: str, future: PrefectFuture, started: float) -> None:
        future.wait()
        state = future.state
        seconds = round(time.perf_counter() - started, 3)
        if state.is_completed():
            result = future.result()
            scope = runs.output_scope(step, result)
            fp = runs.output_fingerprint(self.db, step, scope)
            kind = "cached" if state.name == "Cached" else "completed"
            self.record(runs.StepOutcome(step, kind, key, scope, fp, seconds=seconds, result=result))
        else:
            exc = future.result(raise_on_failure=False)
            error = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else str(state.message)
            self.record(runs.StepOutcome(step, "failed", key, error=error, seconds=seconds))

    def run_layer(self, layer: list[Step]) -> None:
        """Fingerprint every runnable step of the layer first (no task is writing then), then run them,
        `train_concurrency` at a time for training and one at a time otherwise."""
        ready = []
        for step in layer:
            blocked = self.blocked_by(step)
            if blocked:
                self.record(runs.StepOutcome(step, "skipped", error=f"upstream failed: {', '.join(blocked)}"))
                continue
            prints = runs.input_fingerprints(self.db, step)
            ready.append((step, prints, runs.input_key(step, prints)))
        width = self.cfg.runner.train_concurrency if layer and layer[0].kind == "train" else 1
        pending: list[tuple[Step, str, PrefectFuture, float]] = []
        for step, prints, key in ready:
            pending.append((step, key, self.submit(step, prints, key), time.perf_counter()))
            if len(pending) >= width:
                self.collect(*pending.pop(0))
        while pending:
            self.collect(*pending.pop(0))


def _publish_artifacts(run: _Run) -> None:
    run_ids = [rid for o in run.outcomes.values() if o.result for rid in o.result.get("run_ids", [])]
    create_table_artifact(
        key="pipeline-metrics", table=runs.metrics_rows(run.db, run_ids) or [{"note": "no model runs"}],
        description="Test metrics (mean ± sd over bootstrap resamples) of this pipeline run's models",
    )
    create_table_artifact(key="pipeline-steps", table=runs.step_table(run.db, run.id),
                          description="Every step of this run: completed, cached (reused), failed or skipped")
    if any(o.step.kind == "ingest" for o in run.outcomes.values()):
        create_markdown_artifact(key="pipeline-data-quality", markdown=runs.data_quality_markdown(run.db),
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
    cfg = load_config(config, sources=True)
    settings = get_settings(db=db)
    plan = plan_for(cfg, settings)
    selected = [plan[name] for name in steps_only] if steps_only else list(plan.steps)
    run_id = str(flow_run.id or f"local-{time.time_ns()}")
    # One pipeline per warehouse: a second one refuses here, before it writes anything (re-entrant for the
    # CLI, which took the same holder file before starting Prefect).
    with hold_writer(settings.db, "medtx pipeline", wait_s=0):
        for gone in runs.start_pipeline_run(settings.db, run_id, cfg.model_dump(mode="json") | {"config_file": str(config)}):
            log.warning("%s %s marked interrupted (%s)", gone.table, gone.run_id, gone.reason)
        try:
            # The runner comes from the config at run time, so CLI runs and served deployments both honour it.
            with make_task_runner(cfg.runner) as runner:
                run = _Run(settings, cfg, run_id, set(refresh or []), runner)
                for layer in Plan(tuple(selected)).layers():
                    run.run_layer(layer)
            # The run's status is written before publishing so the dashboard's snapshot shows how it ended;
            # a failed publish below overwrites it with `failed` in the live warehouse.
            failed = [name for name, o in run.outcomes.items() if o.state in ("failed", "skipped")]
            runs.finish_pipeline_run(run.db, run.id, failed)
            publish_task(run.db, settings.snapshot)
            _publish_artifacts(run)
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
    return pipeline(
        config=str(config), db=str(db) if db else None, steps_only=steps_only, refresh=refresh,
        return_state=return_state,
    )


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
