"""Training and result packages (medtx.pipeline.exchange): what a worker sees, and what the single writer records."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from medtx.pipeline.exchange import export_training_package, package_key, record_result_package
from medtx.pipeline.kinds.train import run as run_train_from_package
from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)

READS = ("samples.drug_rec", "samples.splits", "samples.vocab", "samples.leakage_gate", "ref.ddi_atc3")
SCOPE = {"dataset": "mimic3_demo", "task": "drug_rec"}


def _spec(model: str, overrides: dict | None = None) -> dict:
    return {"dataset": "mimic3_demo", "task": "drug_rec", "model": model,
            "params": {"model": model, "overrides": overrides or {}, "seed": 42}}


def _count(db: Path, sql: str) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql(sql).fetchall()[0][0]


def test_package_holds_exactly_the_declared_tables_of_the_scope(demo_copy: Path, tmp_path: Path) -> None:
    key = package_key(READS, SCOPE, {"x": "1"})
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", key)
    manifest = json.loads((package / "manifest.json").read_text())
    assert sorted(manifest["tables"]) == sorted(READS)
    assert manifest["tables"]["samples.drug_rec"] == _count(
        demo_copy, "SELECT count(*) FROM samples.drug_rec WHERE dataset = 'mimic3_demo'") > 0
    splits = duckdb.sql(f"SELECT DISTINCT task FROM '{package / 'samples.splits.parquet'}'").fetchall()
    assert splits == [("drug_rec",)]  # other tasks' splits are not in a drug_rec package
    assert export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", key) == package  # reused
    assert package_key(READS, SCOPE, {"x": "2"}) != key  # new rows upstream: a new package


def test_result_package_is_recorded_once(demo_copy: Path, tmp_path: Path) -> None:
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k1")
    result = run_train_from_package(_spec("gru", {"epochs": 1, "d_model": 16, "hidden": 16}), str(package),
                                    str(tmp_path / "exchange" / "results" / "r1"), pipeline_run_id="p1",
                                    device="cpu", torch_threads=1)
    before = _count(demo_copy, "SELECT count(*) FROM ml.runs")
    models = tmp_path / "models"
    for _ in range(2):
        assert record_result_package(demo_copy, result["result"], models, cleanup=False) == result["run_ids"]
    (run_id,) = result["run_ids"]
    assert _count(demo_copy, "SELECT count(*) FROM ml.runs") == before + 1
    assert _count(demo_copy, f"SELECT count(*) FROM ml.runs WHERE run_id = '{run_id}' AND status = 'completed'") == 1
    n_pred = _count(demo_copy, f"SELECT count(*) FROM ml.predictions WHERE run_id = '{run_id}'")
    assert n_pred > 0
    record_result_package(demo_copy, result["result"], models)  # cleanup (the default): recorded, then deleted
    assert _count(demo_copy, f"SELECT count(*) FROM ml.predictions WHERE run_id = '{run_id}'") == n_pred
    assert not Path(result["result"]).exists() and not Path(result["result"]).parent.exists()
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        paths = [Path(p) for (p,) in con.sql(f"SELECT path FROM ml.models WHERE run_id = '{run_id}'").fetchall()]
    assert paths and all(p.is_relative_to(models) and p.exists() for p in paths)


def test_an_undeclared_read_fails_loudly_and_the_failed_run_is_recorded(demo_copy: Path, tmp_path: Path) -> None:
    """A package without ref.ddi_atc3: the worker's scratch warehouse lacks the table, so drug_rec fails
    instead of computing a DDI rate on nothing; the failure still reaches ml.runs through the package."""
    reads = tuple(t for t in READS if t != "ref.ddi_atc3")
    package = export_training_package(demo_copy, reads, SCOPE, tmp_path / "exchange", "k2")
    result_dir = tmp_path / "exchange" / "results" / "r2"
    with pytest.raises(Exception, match="ddi_atc3"):
        run_train_from_package(_spec("logreg"), str(package), str(result_dir), pipeline_run_id="p2", device="cpu")
    (run_id,) = record_result_package(demo_copy, result_dir, tmp_path / "models")
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        status, error = con.execute("SELECT status, error FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()[0]
    assert status == "failed" and "ddi_atc3" in error


def test_a_worker_that_dies_before_publishing_leaves_nothing(demo_copy: Path, tmp_path: Path, monkeypatch) -> None:
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k3")
    result_dir = tmp_path / "exchange" / "results" / "r3"
    result_dir.parent.mkdir(parents=True)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # not an Exception: stands for a kill; nothing may be published

    monkeypatch.setattr("medtx.training.runners.ehr.train_ehr", killed)
    with pytest.raises(KeyboardInterrupt):
        run_train_from_package(_spec("logreg"), str(package), str(result_dir), pipeline_run_id="p3", device="cpu")
    assert not result_dir.exists()
    assert not [p for p in result_dir.parent.iterdir() if p.name.startswith(".r3")]


def test_a_result_folder_removed_while_training_is_made_again(demo_copy: Path, tmp_path: Path, monkeypatch) -> None:
    """The flow removes results/<pipeline run>/ once its last recorded package is gone; a worker still training
    then publishes into a folder that no longer exists. It is made again (the default-config pipeline lost 4 text
    trainings to FileNotFoundError on this race)."""
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k9")
    result_dir = tmp_path / "exchange" / "results" / "p9" / "train.x"
    result_dir.parent.mkdir(parents=True)

    def removed_meanwhile(*args, **kwargs):
        import shutil

        shutil.rmtree(result_dir.parent)  # what exchange._remove_result does after another step's recording
        raise ValueError("training failed after its folder vanished")

    monkeypatch.setattr("medtx.training.runners.ehr.train_ehr", removed_meanwhile)
    with pytest.raises(ValueError, match="folder vanished"):
        run_train_from_package(_spec("logreg"), str(package), str(result_dir), pipeline_run_id="p9", device="cpu")
    assert json.loads((result_dir / "manifest.json").read_text())["error"].startswith("ValueError")
