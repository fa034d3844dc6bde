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
from medtx.pipeline.steps import RUNNERS, run_train
from tests.conftest import DATA
from tests.fixtures_samples import demo_db  # noqa: F401

DATA_SCHEMAS = ("raw", "ref", "core", "samples")
CONFIG = f"""
datasets: [{{source: {DATA / 'mimic3_demo'}}}]
mtsamples: {{source: {DATA / 'mtsamples' / 'mtsamples.csv.gz'}}}
tasks:
  drug_rec: {{models: [{{model: logreg}}]}}
  next_visit: {{models: [{{model: most_frequent}}]}}
  readmission: {{models: [{{model: most_frequent}}]}}
  mortality: {{models: [{{model: logreg}}]}}
  specialty: {{models: [{{model: majority}}]}}
  faq: {{models: [{{model: retrieval}}]}}
"""
# One train step per runner (EHR, text, FAQ) and per kind of extra read (drug_rec: ref.ddi_atc3).
TRAIN_STEPS = ("train.drug_rec.mimic3_demo.logreg.s42", "train.mortality.mimic3_demo.logreg.s42",
               "train.specialty.mtsamples.majority.s42", "train.faq.mental_health_faq.retrieval.s42")


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
    if step.kind == "train":
        return run_train(step.spec(), paths, pipeline_run_id=None, device="cpu")
    return RUNNERS[step.kind](step.spec(), paths)


def _steps(plan) -> list[str]:
    return [s.name for s in plan.steps if s.kind in ("reference", "codes", "samples")] + list(TRAIN_STEPS)


def test_plan_covers_every_samples_step(plan):
    built = {s.task for s in plan.steps if s.kind == "samples"}
    assert built == {"drug_rec", "next_visit", "readmission", "mortality", "specialty", "faq"}


@pytest.mark.parametrize("name", [
    "reference", "codes.mimic3_demo", "samples.drug_rec.mimic3_demo", "samples.next_visit.mimic3_demo",
    "samples.readmission.mimic3_demo", "samples.mortality.mimic3_demo", "samples.specialty", "samples.faq",
    *TRAIN_STEPS,
])
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
    assert "samples/drug_rec" not in mortality and {"tasks/drug_rec", "samples/drug_rec"} <= set(drug_rec)
    assert not any(m.startswith("models/") for m in mortality)
    train = plan["train.mortality.mimic3_demo.logreg.s42"].code
    assert {"models/baselines", "training/experiment", "tasks/mortality"} <= set(train)
    assert "text/experiment" in plan["train.specialty.mtsamples.majority.s42"].code
    assert not any(m.startswith(("ingest/", "synth/")) for m in plan["codes.mimic3_demo"].code)
