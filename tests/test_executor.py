"""The pipeline's scheduler (medtx.pipeline.executor) without Prefect.

A real plan over the bundled MIMIC-III demo runs through `LocalBackend` (the library's step functions in a thread
pool) in a subprocess where importing Prefect raises: every stage fills its tables; a second source that lacks the
required tables fails its ingest, which is recorded as failed while the demo's steps complete, and every step
downstream of it is skipped, not run. A second test
drives the scheduling rules alone (concurrency window, longest-first order, skip on failed upstream) with a
backend that records what it was asked to run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest

from medtx.pipeline import executor
from medtx.pipeline.config import load_config
from medtx.pipeline.plan import Step, build_plan
from medtx.settings import get_settings
from medtx.store.db import open_warehouse

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "data" / "mimic3_demo"

CONFIG = """
    datasets:
      - source: {demo}
      - source: {broken}                 # PATIENTS only: its ingest fails, everything after it is skipped
    seeds: [42]
    tasks:
      drug_rec:
        models:
          - {{model: most_frequent}}
          - {{model: logreg}}
          - {{model: gru, overrides: {{epochs: 1, d_model: 16, hidden: 16}}}}
    runner: {{torch_threads: 1}}
"""


def _config(folder: Path) -> Path:
    broken = folder / "broken_cohort"
    broken.mkdir()
    shutil.copy(DEMO / "PATIENTS.csv.gz", broken)
    path = folder / "pipeline.yaml"
    path.write_text(textwrap.dedent(CONFIG.format(demo=DEMO, broken=broken)))
    return path

# Runs in a fresh interpreter where `import prefect` fails: the scheduler and every step are Prefect-free.
SCRIPT = """
import sys

class NoPrefect:
    def find_spec(self, name, path=None, target=None):
        if name == "prefect" or name.startswith(("prefect.", "prefect_")):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, NoPrefect())

from pathlib import Path
from medtx.pipeline import executor, runs
from medtx.pipeline.config import load_config
from medtx.pipeline.plan import build_plan
from medtx.settings import get_settings

config, db = sys.argv[1], sys.argv[2]
settings = get_settings(db=db)
cfg = load_config(config, sources=True)
plan = build_plan(cfg, Path(settings.cache_dir) / "synth", Path(settings.data_dir))
selected = list(plan.steps)
events = []
executor.start(settings, "local-test", {}, selected, lambda e, p: events.append(e))
# the run's resources as under Prefect: a pool of two training processes, the DuckDB memory limit
with executor.run_resources("1GiB", 2), executor.LocalBackend(width=2) as backend:
    run = executor.Executor(settings, "local-test", backend, train_width=2, torch_threads=1,
                            notify=lambda e, p: events.append(e))
    run.run(executor.layers_of(selected))
    from medtx.runtime import train_processes
    print("POOL", train_processes._ACTIVE is not None and train_processes._ACTIVE.width)
runs.finish_pipeline_run(run.db, "local-test", run.failed())
for name, outcome in run.outcomes.items():
    print("OUTCOME", name, outcome.state)
print("EVENTS", ",".join(sorted(set(events))))
print("PREFECT", any(m == "prefect" or m.startswith("prefect.") for m in sys.modules))
"""


def test_executor_runs_a_real_plan_without_prefect(tmp_path: Path) -> None:
    config = _config(tmp_path)
    db = tmp_path / "warehouse.duckdb"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(config), str(db)], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = dict(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("OUTCOME"))
    assert outcomes.pop("ingest.broken_cohort") == "failed"
    skipped = {k for k, v in outcomes.items() if v == "skipped"}
    assert skipped and all("broken_cohort" in k for k in skipped)  # codes, samples and trainings of that source
    assert {"codes.broken_cohort", "samples.drug_rec.broken_cohort",
            "train.drug_rec.broken_cohort.gru.s42"} <= skipped
    demo = {k: v for k, v in outcomes.items() if k not in skipped}
    assert set(demo.values()) == {"completed"}, demo
    assert {k.split(".")[0] for k in demo} >= {"ingest", "reference", "codes", "samples", "train"}
    assert "PREFECT False" in done.stdout
    assert "POOL 2" in done.stdout  # the trainings ran in the run's two training processes
    assert "EVENTS finished,plan,published,started" in done.stdout
    with duckdb.connect(str(db), read_only=True) as con:
        for table in ("raw.admissions", "core.prescriptions_atc3", "samples.drug_rec", "ml.metrics", "ml.predictions"):
            assert con.sql(f"SELECT count(*) FROM {table}").fetchall()[0][0] > 0, table
        runs = con.sql("SELECT model, dataset, status FROM ml.runs ORDER BY model").fetchall()
        assert runs == [("gru", "mimic3_demo", "completed"), ("logreg", "mimic3_demo", "completed"),
                        ("most_frequent", "mimic3_demo", "completed")], runs
        state, failed = con.sql("SELECT status, error FROM ml.pipeline_runs").fetchall()[0]
        assert state == "failed" and "ingest.broken_cohort" in str(failed)
        states = dict(con.sql("SELECT step, state FROM ml.pipeline_steps").fetchall())
        assert states["ingest.broken_cohort"] == "failed" and states["samples.drug_rec.broken_cohort"] == "skipped"
    assert Path(db).with_name("warehouse.snapshot.duckdb").exists()  # published after the data stages


@dataclass
class _Done:
    """A step that has already finished, as a backend hands it back."""

    ok: bool
    order: int

    def wait(self) -> None:
        pass

    def state(self) -> str:
        return "completed" if self.ok else "failed"

    def result(self) -> dict | None:
        return {}

    def error(self) -> str:
        return "RuntimeError: planned failure"


class _Recorder:
    """Runs nothing: records the steps it is handed, and how many were in flight at each submission."""

    def __init__(self, fail: set[str]):
        self.fail, self.submitted, self.in_flight, self.live = fail, [], [], 0
        self.lock = threading.Lock()

    def submit(self, step: Step, parameters: dict[str, Any]) -> _Done:
        self.live += 1
        self.submitted.append(step.name)
        self.in_flight.append((step.kind.name, self.live))
        return _Done(step.name not in self.fail, len(self.submitted))

    def first_done(self, handles: Sequence[_Done]) -> int:
        self.live -= 1
        return min(range(len(handles)), key=lambda i: handles[i].order)


def _planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Settings, a migrated empty warehouse and the plan of CONFIG; training packages stubbed (they are the
    exchange module's business, tested there: here a folder name is enough)."""
    config = _config(tmp_path)
    settings = get_settings(db=tmp_path / "warehouse.duckdb")
    plan = build_plan(load_config(config, sources=True), Path(settings.cache_dir) / "synth", Path(settings.data_dir))
    with open_warehouse(settings.db):
        pass
    monkeypatch.setattr(executor, "export_training_package", lambda db, reads, scope, ex, key, **_: Path(ex) / key)
    monkeypatch.setattr("medtx.pipeline.exchange.content_digest", lambda package: "0" * 64)  # no package here
    return settings, plan


def test_scheduling_rules_window_order_and_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, plan = _planned(tmp_path, monkeypatch)
    samples = "samples.drug_rec.mimic3_demo"
    backend = _Recorder(fail={samples})
    selected = list(plan.steps)
    executor.start(settings, "rules", {}, selected, lambda e, p: None)
    run = executor.Executor(settings, "rules", backend, train_width=2, publish_cost=0.0)
    monkeypatch.setattr(run, "publish_progress", lambda force: None)
    run.run(executor.layers_of(selected))

    trains = [s.name for s in selected if s.kind.name == "train" and s.dataset == "mimic3_demo"]
    assert trains and all(run.outcomes[t].state == "skipped" for t in trains)  # upstream samples failed
    others = [s.name for s in selected if s.kind.name == "train" and s.dataset != "mimic3_demo"]
    assert others and all(run.outcomes[t].state == "completed" for t in others)  # their own upstream succeeded
    assert all(t not in backend.submitted for t in trains)
    assert run.outcomes[samples].state == "failed"
    # data steps write the warehouse: never two in flight
    assert max(n for kind, n in backend.in_flight if kind != "train") == 1
    assert run.failed() == sorted(run.failed(), key=lambda n: list(run.outcomes).index(n))


def test_training_layer_runs_width_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, plan = _planned(tmp_path, monkeypatch)
    trains = [s for s in plan.steps if s.kind.name == "train" and s.dataset == "mimic3_demo"]
    backend = _Recorder(fail=set())
    executor.start(settings, "width", {}, trains, lambda e, p: None)
    run = executor.Executor(settings, "width", backend, train_width=2)
    monkeypatch.setattr(run, "publish_progress", lambda force: None)
    run.run_layer(trains)
    assert sorted(backend.submitted) == sorted(s.name for s in trains)
    assert max(n for _, n in backend.in_flight) == 2 and len(trains) == 3
    assert all(o.state == "completed" for o in run.outcomes.values())


class _Counting(executor.LocalBackend):
    """LocalBackend that remembers which steps it was handed."""

    def __init__(self) -> None:
        super().__init__(width=1)
        self.handed: list[str] = []

    def submit(self, step: Step, parameters: dict[str, Any]):
        self.handed.append(step.name)
        return super().submit(step, parameters)


def _run_once(settings, selected: list[Step], run_id: str, refresh: set[str] = frozenset()) -> tuple[dict, list]:
    executor.start(settings, run_id, {}, selected, lambda e, p: None)
    with _Counting() as backend:
        run = executor.Executor(settings, run_id, backend, torch_threads=1, refresh=set(refresh))
        run.publish_progress = lambda force: None
        run.run(executor.layers_of(selected))
    return {name: o.state for name, o in run.outcomes.items()}, backend.handed


def test_the_cache_is_the_executors_so_a_prefect_free_run_reuses_steps(tmp_path: Path) -> None:
    """The same plan twice through LocalBackend: the second run hands the backend nothing (every step cached,
    as under Prefect: tests/test_pipeline_flow.py); `refresh` recomputes the named step only, and a step whose
    output rows changed in the warehouse is recomputed."""
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"datasets: [{{source: {DEMO}}}]\nseeds: [42]\n"
                      "tasks: {drug_rec: {models: [{model: most_frequent}]}}\n")
    settings = get_settings(db=tmp_path / "warehouse.duckdb")
    plan = build_plan(load_config(config, sources=True), Path(settings.cache_dir) / "synth", Path(settings.data_dir))
    selected = list(plan.steps)
    names = [s.name for s in selected]

    first, handed = _run_once(settings, selected, "cold")
    assert set(first.values()) == {"completed"} and handed == names

    second, handed = _run_once(settings, selected, "warm")
    assert second == dict.fromkeys(names, "cached") and handed == []

    samples = "samples.drug_rec.mimic3_demo"
    third, handed = _run_once(settings, selected, "refresh", refresh={samples})
    assert handed == [samples] and third[samples] == "completed"
    assert {n: s for n, s in third.items() if n != samples} == {n: "cached" for n in names if n != samples}

    with open_warehouse(settings.db) as con:  # someone deletes the model's metrics: its output changed
        con.execute("DELETE FROM ml.metrics WHERE run_id IN (SELECT run_id FROM ml.runs WHERE model = 'most_frequent')")
    fourth, handed = _run_once(settings, selected, "changed")
    train = next(n for n in names if n.startswith("train."))
    assert handed == [train] and fourth[train] == "completed"
