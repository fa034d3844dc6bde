"""Declared lineage is the real lineage: each pipeline step runs against a warehouse copy that holds ONLY the
tables (of raw, ref, core, samples) the step declares it reads or writes; an undeclared read fails here
instead of giving the pipeline a stale cache hit. The reads/writes come from the plan, which takes them from
the declarations beside the SQL (medtx/tasks/*, medtx/codes/*, medtx/synth/oracle.py)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import duckdb
import pytest

from medtx.store.db import open_warehouse
from medtx.pipeline.config import load_config
from medtx.pipeline.plan import Step, build_plan
from medtx.pipeline.steps import train_here
from medtx.models.registry import models_for
from medtx.tasks import all_tasks
from tests.conftest import DATA
from tests.fixtures_samples import demo_db  # noqa: F401

DATA_SCHEMAS = ("raw", "ref", "core", "samples")
DEMO = "mimic3_demo"
# Tasks whose training needs data the bundled demo lacks: note text (the demo ships NOTEEVENTS empty). Their
# samples step (the one they train on) is still checked; a new task is checked without editing this file.
NOT_TRAINABLE_ON_THE_DEMO = {"readmission_notes": "the demo has no note text"}
# The cheapest model of each family that trains a task (the oracle needs a synthetic cohort).
BASELINE_PREFERENCE = ("logreg", "most_frequent", "majority", "retrieval")


def _baseline(task) -> str:
    """A baseline the registry says trains `task` (tests run over the registries, not over task names)."""
    available = models_for(task)
    return next(m for m in BASELINE_PREFERENCE if m in available)


def _dataset(task) -> str:
    return task.samples.dataset or DEMO


TASKS = list(all_tasks())
TASK_NAMES = {t.name for t in TASKS}
TRAINED = [t for t in TASKS if t.name not in NOT_TRAINABLE_ON_THE_DEMO]
CONFIG = (f"datasets: [{{source: {DATA / 'mimic3_demo'}}}]\n"
          f"mtsamples: {{source: {DATA / 'mtsamples' / 'mtsamples.csv.gz'}}}\n"
          "tasks:\n" + "".join(f"  {t.name}: {{models: [{{model: {_baseline(t)}}}]}}\n" for t in TRAINED))
# One train step per task of the registry, with its cheapest baseline.
TRAIN_STEPS = tuple(f"train.{t.name}.{_dataset(t)}.{_baseline(t)}.s42" for t in TRAINED)
SAMPLE_STEPS = tuple(f"samples.{t.name}" + (f".{DEMO}" if t.samples.dataset is None else "")
                     for t in TASKS if t.lineage.build is not None)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("lineage") / "lineage.yaml"
    path.write_text(CONFIG)
    return build_plan(load_config(path), path.parent / "synth", DATA)


def _isolate(db: Path, step: Step) -> list[str]:
    """Drop every data table the step does not declare; returns what was dropped."""
    keep = set(step.reads) | set(step.writes)
    with open_warehouse(db) as con:
        tables = [f"{s}.{t}" for s, t in con.sql(
            "SELECT table_schema, table_name FROM information_schema.tables "
            f"WHERE table_schema IN {DATA_SCHEMAS} AND table_type = 'BASE TABLE'").fetchall()]
        dropped = [t for t in tables if t not in keep]
        for table in dropped:
            con.execute(f"DROP TABLE {table}")
    return dropped


def _run(step: Step, db: Path, tmp: Path) -> dict:
    paths = {"db": str(db), "cache_dir": str(tmp / "cache"), "data_dir": str(DATA), "models_dir": str(tmp / "models")}
    if step.kind.name == "train":
        return {"run_ids": train_here(db, step, tmp / "exchange", tmp / "models", device="cpu")}
    return step.kind.run(step.spec(), paths)


def _steps(plan) -> list[str]:
    return [s.name for s in plan.steps if s.kind.name in ("reference", "codes", "samples")] + list(TRAIN_STEPS)


def test_plan_covers_every_samples_step(plan):
    built = {s.task_name for s in plan.steps if s.kind.name == "samples"}
    assert built == {t.name for t in TASKS if t.lineage.build is not None}
    assert {"drug_rec", "next_visit", "readmission", "mortality", "specialty", "faq"} <= built  # the registry is read
    assert set(NOT_TRAINABLE_ON_THE_DEMO) <= {t.name for t in TASKS}


@pytest.mark.parametrize("name", ["reference", "codes.mimic3_demo", *SAMPLE_STEPS, *TRAIN_STEPS])
def test_step_runs_on_only_the_tables_it_declares(name, plan, demo_db, tmp_path):  # noqa: F811
    assert name in _steps(plan)
    db = tmp_path / "w.duckdb"
    shutil.copy(demo_db, db)
    dropped = _isolate(db, plan[name])
    assert dropped, name  # the isolation really removed something
    result = _run(plan[name], db, tmp_path)
    assert result and all(v for k, v in result.items() if k in ("samples", "mapped_rows", "run_ids")), result


def test_an_undeclared_read_fails(plan, demo_db, tmp_path):  # noqa: F811
    """The bug this guards against: samples steps used to read ref.icd9_* without declaring it."""
    step = plan["samples.drug_rec.mimic3_demo"]
    hidden = dataclasses.replace(step, reads=tuple(t for t in step.reads if t != "ref.icd9_diagnoses"))
    db = tmp_path / "w.duckdb"
    shutil.copy(demo_db, db)
    _isolate(db, hidden)
    with pytest.raises(duckdb.CatalogException, match="icd9_diagnoses"):
        _run(hidden, db, tmp_path)


def test_code_keys_come_from_the_import_closure(plan):
    """Editing one task's builder redoes that task's samples only; models count for training, not samples."""
    mortality, drug_rec = plan["samples.mortality.mimic3_demo"].code, plan["samples.drug_rec.mimic3_demo"].code
    assert {"tasks/mortality", "samples/common", "samples/splits", "samples/vocab"} <= set(mortality)
    # a task's SQL is in its own file, and no other task's file is in its samples key
    assert {m for m in mortality if m.startswith("tasks/") and m[6:] in TASK_NAMES} == {"tasks/mortality"}
    assert {m for m in drug_rec if m.startswith("tasks/") and m[6:] in TASK_NAMES} == {"tasks/drug_rec"}
    # the one model-package module a samples step imports is the Vocab record (medtx/samples/tokens.py, moved there
    # so the torch-only worker reads vocabularies without DuckDB); no model file enters a samples key
    assert {m for m in mortality if m.startswith("models/")} <= {"models/__init__", "models/vocab"}
    train = plan["train.mortality.mimic3_demo.logreg.s42"].code
    assert {"models/logreg", "training/runners/ehr", "tasks/mortality"} <= set(train)
    assert "training/runners/text" in plan["train.specialty.mtsamples.majority.s42"].code
    assert not any(m.startswith(("ingest/", "synth/")) for m in plan["codes.mimic3_demo"].code)
