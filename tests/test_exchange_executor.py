"""Issue 34, case 6 at the pipeline's level: a result package the flow refuses (medtx.training.integrity) fails
that training step with the one line, and the run goes on — it does not abort the pipeline. The scheduler runs a
real plan over the bundled demo with a backend that returns damaged result packages."""

from __future__ import annotations

import json
import textwrap
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
DEMO = Path(__file__).resolve().parent.parent / "data" / "mimic3_demo"
CONFIG = """
    datasets:
      - source: {demo}
    seeds: [42]
    tasks:
      drug_rec:
        models:
          - {{model: most_frequent}}
          - {{model: logreg}}
          - {{model: gru, overrides: {{epochs: 1}}}}
    runner: {{torch_threads: 1}}
"""


@dataclass
class _Finished:
    result_dir: Path

    def wait(self) -> None:
        pass

    def state(self) -> str:
        return "completed"

    def result(self) -> dict | None:
        return {"run_ids": ["r"], "result": str(self.result_dir)}

    def error(self) -> str:
        return ""


class _DamagedResults:
    """Every training "finishes" with a result package whose manifest names a run id `../../x`."""

    def __init__(self, exchange: Path):
        self.exchange, self.submitted = exchange, []

    def submit(self, step: Step, parameters: dict[str, Any]) -> _Finished:
        self.submitted.append(step.name)
        folder = self.exchange / "results" / step.name
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"run_ids": ["../../x"], "models_root": "/m", "files": {}}))
        return _Finished(folder)

    def first_done(self, handles: Sequence[_Finished]) -> int:
        return 0


def test_a_refused_result_package_fails_its_step_and_the_run_goes_on(tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(textwrap.dedent(CONFIG.format(demo=DEMO)))
    settings = get_settings(db=tmp_path / "warehouse.duckdb")
    plan = build_plan(load_config(config, sources=True), Path(settings.cache_dir) / "synth", Path(settings.data_dir))
    with open_warehouse(settings.db):
        pass
    monkeypatch.setattr(executor, "export_training_package", lambda db, reads, scope, ex, key, **_: Path(ex) / key)
    monkeypatch.setattr("medtx.pipeline.exchange.content_digest", lambda package: "0" * 64)  # no package here
    trains = [s for s in plan.steps if s.kind.name == "train"]
    backend = _DamagedResults(tmp_path / "exchange")
    executor.start(settings, "refused", {}, trains, lambda e, p: None)
    run = executor.Executor(settings, "refused", backend, train_width=2)
    monkeypatch.setattr(run, "publish_progress", lambda force: None)
    run.run_layer(trains)  # before: PackageDamaged (then: 50 foreign rows inserted) out of the scheduler
    assert sorted(backend.submitted) == sorted(s.name for s in trains) and len(trains) == 3
    assert all(o.state == "failed" for o in run.outcomes.values())
    for outcome in run.outcomes.values():
        assert outcome.error.startswith("result package refused: unsafe run id in ") and "'../../x'" in outcome.error
    with duckdb.connect(str(settings.db), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM ml.runs").fetchall()[0][0] == 0
        states = con.sql("SELECT DISTINCT state FROM ml.pipeline_steps").fetchall()
    assert states == [("failed",)]
    assert all((tmp_path / "exchange" / "results" / s.name).exists() for s in trains)  # kept for a person


