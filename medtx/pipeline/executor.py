"""The pipeline's scheduler, without Prefect: walk a plan layer by layer, run each step through a `Backend`,
record every outcome.

What it does, in order, for one pipeline run (`execute`):
- opens the run's bookkeeping (ml.pipeline_runs / ml.pipeline_plan) and tells the observer the plan;
- per layer of the plan (medtx.pipeline.plan): a step whose upstream failed is `skipped`; the others are
  fingerprinted first (no step is writing then), training steps are ordered longest-expected first
  (medtx.pipeline.order) and run `train_width` at a time, every other step one at a time (they write the
  warehouse, which takes one writer);
- a training step reads a training package exported here and writes a result package; this process, the single
  writer, records the package (medtx.pipeline.exchange) when the step finishes;
- publishes the snapshot after the data stages and, during training, at most every PUBLISH_EVERY_S seconds, so
  the dashboard shows data as it lands; writes the run's end state.

The cache is the executor's, so every backend caches alike: a step whose input key (its parameters, the fingerprints
of the tables and files it reads, the source of the code it runs: medtx.pipeline.runs.input_key) matches its last
successful run, and whose output rows are unchanged since, is `cached` without being handed to the backend (a
training's package is not even exported); `refresh` names steps to recompute anyway.

How a step actually runs is the backend's business: `flows/pipeline.py` adapts Prefect (task runs on a thread
pool or Dask); `LocalBackend` below runs the library's step functions in a thread pool, which the tests use to
exercise the scheduler without Prefect.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import duckdb

from medtx.pipeline import order as training_order
from medtx.pipeline import progress, runs
from medtx.pipeline.exchange import dispatch_training, export_training_package, package_key, record_result_package
from medtx.pipeline.kinds import train as train_kind
from medtx.training.integrity import PackageDamaged
from medtx.pipeline.plan import Plan, Step
from medtx.publish.snapshot import publish_snapshot
from medtx.runtime.train_processes import active_pool
from medtx.settings import Settings
from medtx.store.db import MEMORY_LIMIT_ENV, open_warehouse

log = logging.getLogger("medtx.pipeline")

# Snapshots published while the pipeline runs, so the dashboard shows data as it lands: after each of these
# stages, and during training at most every PUBLISH_EVERY_S seconds, and never more often than keeps
# publishing under ~1/(1 + PUBLISH_COST_FACTOR) of the run's time (a large warehouse takes seconds to copy).
PUBLISH_AFTER = ("ingest", "codes", "samples")
PUBLISH_EVERY_S = 15.0
PUBLISH_COST_FACTOR = 10.0

State = Literal["completed", "cached", "failed"]
# Called with ("plan", [PlannedStep]), ("started", Step), ("finished", StepOutcome), ("published", Snapshot).
Observer = Callable[[str, Any], None]


class Handle(Protocol):
    """A submitted step, as the backend runs it."""

    def wait(self) -> None: ...
    def state(self) -> State: ...
    def result(self) -> dict | None: ...  # the step function's return value (completed or cached)
    def error(self) -> str: ...  # why it failed, one line


class Backend(Protocol):
    """Runs steps. `parameters` are the step function's keyword arguments (medtx.pipeline.steps; all plain,
    serialisable values). A backend never decides whether a step may be reused: the executor does."""

    def submit(self, step: Step, parameters: dict[str, Any]) -> Handle: ...
    def first_done(self, handles: Sequence[Handle]) -> int: ...  # index of the first of `handles` to finish


@dataclass
class Reused:
    """A step the executor reuses from an earlier run (never handed to the backend)."""

    value: dict

    def wait(self) -> None:
        pass

    def state(self) -> State:
        return "cached"

    def result(self) -> dict | None:
        return self.value

    def error(self) -> str:
        return ""


# torch._dynamo: torch imports it at a process's first optimizer (AdamW's add_param_group is wrapped in
# torch._disable_dynamo), about 1 s; imported by the pool's workers it overlaps the data stages instead.
TRAINING_MODULES = ("medtx.pipeline.steps", "medtx.worker", "medtx.training.runners.ehr", "medtx.training.runners.text",
                    "torch._dynamo")


@contextmanager
def duckdb_memory_limit(limit: str) -> Iterator[None]:
    """The config's `runner.duckdb_memory_limit` for every connection the run opens, in this process and in the
    processes it starts (they inherit the environment); MEDTX_DUCKDB_MEMORY_LIMIT, when set, wins; "auto" sets
    nothing (medtx.store.db sizes it)."""
    if MEMORY_LIMIT_ENV in os.environ or limit == "auto":
        yield
        return
    os.environ[MEMORY_LIMIT_ENV] = limit
    try:
        yield
    finally:
        os.environ.pop(MEMORY_LIMIT_ENV, None)


@contextmanager
def run_resources(memory_limit: str, pool_width: int) -> Iterator[None]:
    """What a pipeline run holds while it runs, whatever the backend: the DuckDB memory limit and, for several
    trainings at once in this process, a pool of training processes (medtx.runtime.train_processes: each
    training its own torch generator) whose workers start and import the trainers while the data stages run."""
    with duckdb_memory_limit(memory_limit), active_pool(pool_width, preload=TRAINING_MODULES):
        yield


def paths_of(settings: Settings) -> dict[str, str]:
    """The folders and files a step needs, as plain strings (they travel to workers)."""
    return {k: str(getattr(settings, k)) for k in ("db", "cache_dir", "data_dir", "models_dir", "exchange_dir")}


@dataclass
class Executor:
    """The state of one pipeline run while it walks the plan (settings, outcomes so far)."""

    settings: Settings
    run_id: str
    backend: Backend
    train_width: int = 1  # trainings at once
    torch_threads: int | None = None  # torch threads per training (None: the trainer's default)
    refresh: set[str] = field(default_factory=set)  # step names to recompute even when cached
    notify: Observer = lambda event, payload: None
    outcomes: dict[str, runs.StepOutcome] = field(default_factory=dict)
    published_at: float = 0.0
    publish_cost: float = 0.0

    @property
    def db(self) -> Path:
        return Path(self.settings.db)

    def run(self, layers: Sequence[Sequence[Step]]) -> dict[str, runs.StepOutcome]:
        """Walk the layers in order, publishing after the data stages (the last layer is left to the caller,
        which publishes once the run's end state is written)."""
        for i, layer in enumerate(layers):
            self.run_layer(list(layer))
            if layer and layer[0].kind.name in PUBLISH_AFTER and i < len(layers) - 1:
                self.publish_progress(force=True)
        return self.outcomes

    def failed(self) -> list[str]:
        return [name for name, o in self.outcomes.items() if o.state in ("failed", "skipped")]

    def record(self, outcome: runs.StepOutcome) -> None:
        self.outcomes[outcome.step.name] = outcome
        runs.record_step(self.db, self.run_id, outcome)
        level = logging.WARNING if outcome.state in ("failed", "skipped") else logging.INFO
        log.log(level, "%-55s %s%s", outcome.step.name, outcome.state, f": {outcome.error}" if outcome.error else "")
        self._notify("finished", outcome)

    def _notify(self, event: str, payload: Any) -> None:
        try:
            self.notify(event, payload)
        except Exception:  # a broken display must not break the run
            log.exception("progress observer failed on %s", event)

    def publish_progress(self, force: bool) -> None:
        """Publish the snapshot mid-run (forced after a stage, throttled otherwise). Best effort: the final
        publish is the one that counts, so a failure here (e.g. a Dask worker holding the file) is logged."""
        wait_s = max(PUBLISH_EVERY_S, PUBLISH_COST_FACTOR * self.publish_cost)
        if not force and time.monotonic() - self.published_at < wait_s:
            return
        try:
            snapshot = publish_snapshot(self.db, self.settings.snapshot)
        except (duckdb.Error, OSError) as exc:
            log.warning("progress publish skipped: %s", exc)
            return
        self.published_at, self.publish_cost = time.monotonic(), snapshot.seconds
        self._notify("published", snapshot)

    def blocked_by(self, step: Step) -> list[str]:
        return [n for n in step.needs if n in self.outcomes and self.outcomes[n].state in ("failed", "skipped")]

    def submit(self, step: Step, prints: dict[str, str], key: str) -> Handle:
        progress.mark_started(self.db, self.run_id, step.name)
        self._notify("started", step)
        scope = None if step.name in self.refresh else runs.cached_scope(self.db, step, key)
        if scope is not None:
            return Reused(runs.cached_result(step, scope))
        if step.kind.name != "train":
            args = dict(name=step.name, spec=step.spec(), paths=paths_of(self.settings), fingerprints=prints)
            return self.backend.submit(step, args)
        exchange = Path(self.settings.exchange_dir)
        key = package_key(step.reads, step.scope, prints)
        package = export_training_package(self.db, step.reads, step.scope, exchange, key,
                                          samples=train_kind.samples_read(step))
        # recorded before any worker sees the package: what it must train on, and the one result awaited
        digest = dispatch_training(self.db, self.dispatch_id(step), step, package, key, prints, self.run_id)
        args = dict(name=step.name, spec=step.spec(), package=str(package), result_dir=str(self.result_dir(step)),
                    fingerprints=prints, pipeline_run_id=self.run_id, device=step.device,
                    torch_threads=self.torch_threads, package_digest=digest)
        return self.backend.submit(step, args)

    def first_done(self, handles: Sequence[Handle]) -> int:
        """The index of the first of `handles` to finish: a reused step at once, else the backend's answer."""
        reused = [i for i, h in enumerate(handles) if isinstance(h, Reused)]
        if reused:
            return reused[0]
        return self.backend.first_done(handles)

    def dispatch_id(self, step: Step) -> str:
        return f"{self.run_id}/{step.name}"

    def result_dir(self, step: Step) -> Path:
        return Path(self.settings.exchange_dir) / "results" / self.run_id / step.name

    def record_results(self, step: Step, result: dict | None) -> None:
        """The single writer records a training's result package (idempotent; a cache hit's run is already
        in the warehouse, its package may be gone)."""
        folder = Path(result["result"]) if result and result.get("result") else self.result_dir(step)
        if (folder / "manifest.json").exists():
            record_result_package(self.db, folder, self.settings.models_dir, dispatch_id=self.dispatch_id(step))

    def refused_results(self, step: Step, result: dict | None) -> str | None:
        """record_results, or why its result package was refused (the exchange folder is untrusted input:
        medtx.training.integrity): that step fails, the run goes on, the package stays for a person."""
        try:
            self.record_results(step, result)
        except PackageDamaged as exc:
            return f"result package refused: {exc}"
        return None

    def failed_run(self, step: Step) -> str | None:
        """Why the run this step's dispatch recorded is `failed` (None: none is)."""
        with open_warehouse(self.db, read_only=True) as con:
            rows = con.execute(
                "SELECT r.run_id, r.error FROM ml.dispatches d, unnest(d.run_ids) AS u(run_id) "
                "JOIN ml.runs r ON r.run_id = u.run_id WHERE d.dispatch_id = ? AND r.status = 'failed' "
                "ORDER BY r.run_id", [self.dispatch_id(step)]).fetchall()
        return f"run {rows[0][0]} failed once recorded: {rows[0][1]}" if rows else None

    def collect(self, step: Step, key: str, handle: Handle, started: float, ended: float | None = None) -> None:
        """Record a finished step (`ended`: when it was seen finished; default now)."""
        handle.wait()
        state = handle.state()
        seconds = round((ended or time.perf_counter()) - started, 3)
        if state != "failed":
            result = handle.result()
            # A run the writer marked failed once recorded (its test intervals or comparisons could not be
            # computed) fails its step: the console, the exit status and the next run's cache see the run's state.
            refused = (self.refused_results(step, result) or self.failed_run(step)) if step.kind.name == "train" else None
            if refused:
                self.record(runs.StepOutcome(step, "failed", key, error=refused, seconds=seconds))
                return
            scope = runs.output_scope(step, result)
            fp = runs.output_fingerprint(self.db, step, scope)
            self.record(runs.StepOutcome(step, state, key, scope, fp, seconds=seconds, result=result))
        else:
            refused = self.refused_results(step, None) if step.kind.name == "train" else None  # its failed run
            error = handle.error() + (f"; {refused}" if refused else "")
            self.record(runs.StepOutcome(step, "failed", key, error=error, seconds=seconds))

    def run_layer(self, layer: list[Step]) -> None:
        """Fingerprint every runnable step of the layer first (no task is writing then), then run them,
        `train_width` at a time for training and one at a time otherwise."""
        ready = []
        for step in layer:
            blocked = self.blocked_by(step)
            if blocked:
                self.record(runs.StepOutcome(step, "skipped", error=f"upstream failed: {', '.join(blocked)}"))
                continue
            prints = runs.input_fingerprints(self.db, step)
            ready.append((step, prints, runs.input_key(step, prints)))
        training = bool(layer) and layer[0].kind.name == "train"
        if training:
            ready = self.longest_first(ready)
        width = self.train_width if training else 1
        pending: list[tuple[Step, str, Handle, float]] = []
        for step, prints, key in ready:
            if len(pending) >= width:
                done = pending.pop(self.first_done([h for _, _, h, _ in pending]))
                ended = time.perf_counter()
                if training:
                    # The freed slot gets its next training before this process records the finished one
                    # (importing a result package, its intervals and comparisons take seconds a training can
                    # use). Trainings never write the warehouse, so recording meanwhile is safe; the other
                    # stages write it, so each is recorded before the next one starts.
                    pending.append((step, key, self.submit(step, prints, key), time.perf_counter()))
                    self.collect(*done, ended=ended)
                    self.publish_progress(force=False)
                    continue
                self.collect(*done, ended=ended)
            pending.append((step, key, self.submit(step, prints, key), time.perf_counter()))
        while pending:
            done = pending.pop(self.first_done([h for _, _, h, _ in pending]))
            self.collect(*done, ended=time.perf_counter())

    def longest_first(self, ready: list[tuple[Step, dict, str]]) -> list[tuple[Step, dict, str]]:
        """Training steps in submission order: reference baselines, then longest expected first
        (medtx.pipeline.order)."""
        from medtx.models.registry import reference_models

        by_name = {step.name: (step, prints, key) for step, prints, key in ready}
        with open_warehouse(self.db, read_only=True) as con:
            history = training_order.completed_durations(con, list(by_name))
            units = training_order.train_units(con)
        families = {s.name: training_order.model_family(s.task, s.params["model"]) for s, _, _ in ready}
        baselines = reference_models()
        references = {s.name for s, _, _ in ready if s.params["model"] in baselines}
        order = training_order.longest_first([s for s, _, _ in ready], families, history, units, references)
        return [by_name[s.name] for s in order]


def start(settings: Settings, run_id: str, config: dict, selected: Sequence[Step], notify: Observer) -> None:
    """Open the run's bookkeeping: earlier runs this warehouse still shows as running are marked interrupted,
    and every selected step is written to the plan (progress and ETA know the queued steps)."""
    for gone in runs.start_pipeline_run(settings.db, run_id, config):
        log.warning("%s %s marked interrupted (%s)", gone.table, gone.run_id, gone.reason)
    notify("plan", progress.write_plan(settings.db, run_id, [(s.name, s.kind.name) for s in selected]))


def layers_of(selected: Sequence[Step]) -> list[list[Step]]:
    return [list(layer) for layer in Plan(tuple(selected)).layers()]


# --- a backend without Prefect -------------------------------------------------------------------------------


@dataclass
class _FutureHandle:
    future: Future

    def wait(self) -> None:
        wait([self.future])

    def state(self) -> State:
        return "failed" if self.future.exception() is not None else "completed"

    def result(self) -> dict | None:
        return self.future.result()

    def error(self) -> str:
        exc = self.future.exception()
        return f"{type(exc).__name__}: {exc}"


class LocalBackend:
    """Runs each step's library function (medtx.pipeline.steps) in a thread pool, no Prefect (the executor's
    cache applies as under Prefect). Training steps may run `width` at once; the other steps one at a time."""

    def __init__(self, width: int = 1):
        self.pool = ThreadPoolExecutor(max_workers=max(1, width))

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, step: Step, parameters: dict[str, Any]) -> Handle:
        from medtx.pipeline import steps

        return _FutureHandle(self.pool.submit(steps.call_step, step.kind.name, parameters))

    def first_done(self, handles: Sequence[Handle]) -> int:
        futures = [h.future for h in handles]  # type: ignore[attr-defined]
        done, _ = wait(futures, return_when=FIRST_COMPLETED)
        return next(i for i, f in enumerate(futures) if f in done)
