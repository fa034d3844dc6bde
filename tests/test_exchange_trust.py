"""Issue 34, cases 6 and 10: the exchange folder is untrusted input. Training and result packages carry the
sha256 of every file in their manifests and are checked before use; a tampered or damaged training package is
rebuilt, never reused, and later trainings succeed; a result package may write only the rows of the runs it
names, under plain run ids; a recorded result package is deleted. Real packages exported from the bundled demo,
real trainings (logreg), a real DuckDB warehouse; every case checks the ml.* rows before and after."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from medtx.pipeline.exchange import export_training_package, record_result_package
from medtx.training.integrity import PackageDamaged, file_digests
from medtx.training.packages import PackageError, read_training_package
from medtx.pipeline.kinds.train import TRAIN_READS
from medtx.pipeline.kinds.train import run as run_train_from_package
from medtx.tasks import get_task
from medtx.tasks.verdict import LeakageError
from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)

READS = ("samples.readmission", *TRAIN_READS, *get_task("readmission").lineage.train_reads)  # what the plan's step reads
SCOPE = {"dataset": "mimic3_demo", "task": "readmission"}
ML = ("ml.runs", "ml.models", "ml.epochs", "ml.metrics", "ml.predictions")


def _spec(seed: int = 42) -> dict:
    return {"dataset": "mimic3_demo", "task": "readmission", "model": "logreg",
            "params": {"model": "logreg", "overrides": {}, "seed": seed}}


def _counts(db: Path) -> dict[str, int]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {t: con.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in ML}


def _train(package: Path, result_dir: Path, seed: int = 42) -> dict:
    return run_train_from_package(_spec(seed), str(package), str(result_dir), pipeline_run_id=None, device="cpu",
                                  torch_threads=1)


def _rehash(folder: Path) -> None:
    """What a careful attacker does after editing a package: recompute its manifest's hashes."""
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = file_digests(folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture
def exchange(demo_copy: Path, tmp_path: Path) -> tuple[Path, Path]:
    return demo_copy, export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k-trust")


# ------------------------------------------------------------------------------- case 6: tampered packages


def test_a_tampered_training_package_is_refused_by_the_worker_and_rebuilt_by_the_flow(exchange, tmp_path) -> None:
    db, package = exchange
    table = package / "samples.readmission.parquet"
    original = table.read_bytes()
    rows = pq.read_table(table)
    flipped = rows.set_column(rows.schema.get_field_index("label"), "label",
                              pc.invert(rows.column("label").cast(pa.bool_())).cast(rows.schema.field("label").type))
    pq.write_table(flipped, table)  # rewritten labels, same row count: before, reused without a check
    with pytest.raises(PackageError, match=r"samples\.readmission\.parquet: .*(bytes, the manifest says|content "
                                           r"differs from the manifest's sha256)"):
        read_training_package(package)
    before = _counts(db)
    with pytest.raises(PackageError):
        _train(package, tmp_path / "exchange" / "results" / "r0")
    assert _counts(db) == before and not (tmp_path / "exchange" / "results" / "r0").exists()
    again = export_training_package(db, READS, SCOPE, tmp_path / "exchange", "k-trust")  # the flow's next use
    assert again == package and table.read_bytes() == original
    result = _train(package, tmp_path / "exchange" / "results" / "r1")
    assert record_result_package(db, result["result"], tmp_path / "models") == result["run_ids"]
    assert _counts(db)["ml.runs"] == before["ml.runs"] + 1


def test_a_result_package_may_write_only_its_own_runs_rows(exchange, tmp_path) -> None:
    db, package = exchange
    first = _train(package, tmp_path / "exchange" / "results" / "a")
    record_result_package(db, first["result"], tmp_path / "models")
    (victim,) = first["run_ids"]
    second = _train(package, tmp_path / "exchange" / "results" / "b", seed=7)
    folder = Path(second["result"])
    preds = pq.read_table(folder / "ml.predictions.parquet")
    pool = pa.concat_tables([preds] * (50 // max(preds.num_rows, 1) + 1)).slice(0, 50)  # the demo tests 28
    injected = pool.set_column(preds.schema.get_field_index("run_id"), "run_id",
                                             pa.array([victim] * 50, pa.string()))
    pq.write_table(pa.concat_tables([preds, injected]), folder / "ml.predictions.parquet")
    before = _counts(db)
    with pytest.raises(PackageDamaged, match=r"ml\.predictions\.parquet: [\d,]+ bytes, the manifest says \d+ "
                                             r"\(cut or rewritten\)"):
        record_result_package(db, folder, tmp_path / "models")  # the hashes no longer match
    _rehash(folder)
    with pytest.raises(PackageDamaged, match=rf"50 row\(s\) of run '{victim}', which the package's manifest does "
                                             "not name"):
        record_result_package(db, folder, tmp_path / "models")
    assert _counts(db) == before  # before: the 50 predictions were inserted into the other run
    assert folder.exists()  # a refused package stays for a person to look at


def test_a_changed_result_file_is_refused(exchange, tmp_path) -> None:
    db, package = exchange
    result = _train(package, tmp_path / "exchange" / "results" / "c")
    folder = Path(result["result"])
    metrics = pq.read_table(folder / "ml.metrics.parquet")
    pq.write_table(metrics.set_column(metrics.schema.get_field_index("value"), "value",
                                      pa.array([0.99] * metrics.num_rows, pa.float64())), folder / "ml.metrics.parquet")
    before = _counts(db)
    with pytest.raises(PackageDamaged, match=r"ml\.metrics\.parquet: .*(the manifest says|sha256)"):
        record_result_package(db, folder, tmp_path / "models")
    assert _counts(db) == before


@pytest.mark.parametrize("run_id", ["../../x", "a/b", ".hidden", ""])
def test_an_unsafe_run_id_is_refused_and_nothing_lands_outside_models(exchange, tmp_path, run_id: str) -> None:
    db, package = exchange
    result = _train(package, tmp_path / "exchange" / "results" / "d")
    folder = Path(result["result"])
    (real,) = result["run_ids"]
    for table in ("ml.runs", "ml.models", "ml.epochs", "ml.metrics", "ml.predictions"):
        rows = pq.read_table(folder / f"{table}.parquet")
        pq.write_table(rows.set_column(rows.schema.get_field_index("run_id"), "run_id",
                                       pa.array([run_id] * rows.num_rows, pa.string())), folder / f"{table}.parquet")
    if (folder / "models" / real).exists() and run_id == "../../x":
        (folder / "models" / real).rename(folder / "models" / "x")
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "run_ids": [run_id]}))
    _rehash(folder)
    models = tmp_path / "deep" / "er" / "models"
    before = _counts(db)
    with pytest.raises(PackageDamaged, match=rf"unsafe run id in .*manifest\.json: {run_id!r}"):
        record_result_package(db, folder, models)
    assert _counts(db) == before
    assert not (tmp_path / "deep" / "x").exists() and not models.exists()  # before: copied outside models/


# ------------------------------------------------------------------------------- case 10: damaged packages


def _truncate(package: Path) -> None:
    table = package / "samples.readmission.parquet"
    table.write_bytes(table.read_bytes()[: table.stat().st_size // 2])


def _drop_table_file(package: Path) -> None:
    """A table's file gone and the manifest's hashes recomputed: the manifest still lists the table (issue 44)."""
    (package / "samples.readmission.parquet").unlink()
    _rehash(package)


DAMAGE = {
    "truncated table file": _truncate,
    "table file gone, hashes recomputed": _drop_table_file,
    "missing manifest": lambda package: (package / "manifest.json").unlink(),
    "garbage manifest": lambda package: (package / "manifest.json").write_bytes(b"\x00{not json"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_training_package_is_rebuilt_and_later_trainings_succeed(exchange, tmp_path, case: str) -> None:
    db, package = exchange
    DAMAGE[case](package)
    with pytest.raises(PackageError):
        read_training_package(package)
    before = _counts(db)
    for seed in (1, 2):  # before: every later training of this task and dataset failed until a person deleted it
        again = export_training_package(db, READS, SCOPE, tmp_path / "exchange", "k-trust")
        assert again == package and read_training_package(package)[1]["samples.readmission"].num_rows > 0
        result = _train(package, tmp_path / "exchange" / "results" / f"s{seed}", seed=seed)
        record_result_package(db, result["result"], tmp_path / "models")
    after = _counts(db)
    assert after["ml.runs"] == before["ml.runs"] + 2 and after["ml.predictions"] > before["ml.predictions"]
    assert not [p for p in package.parent.iterdir() if p.name.startswith(".damaged-")]  # the old one is gone


def test_recorded_result_packages_are_deleted(exchange, tmp_path) -> None:
    db, package = exchange
    results = tmp_path / "exchange" / "results" / "pipeline-run-1"
    done = [_train(package, results / f"train.readmission.mimic3_demo.logreg.s{s}", seed=s) for s in (3, 4)]
    size = sum(f.stat().st_size for f in results.rglob("*") if f.is_file())
    assert size > 0
    record_result_package(db, done[0]["result"], tmp_path / "models")
    assert not Path(done[0]["result"]).exists() and results.exists()  # the other step's package is still pending
    record_result_package(db, done[1]["result"], tmp_path / "models")
    assert not results.exists()  # the pipeline run's folder goes with its last package
    with duckdb.connect(str(db), read_only=True) as con:
        paths = [Path(p) for (p,) in con.sql("SELECT path FROM ml.models WHERE run_id IN "
                                             f"('{done[0]['run_ids'][0]}', '{done[1]['run_ids'][0]}')").fetchall()]
    assert all(p.exists() and p.is_relative_to(tmp_path / "models") for p in paths)  # logreg keeps none


def test_a_package_exported_before_a_tasks_gate_record_is_written_again(exchange, tmp_path) -> None:
    """Issue 44: readmission_notes trains on readmission's samples; its gate record is not part of the step's cache
    key (scoped by the samples task). A package exported without it was reused for ever and every training
    refused with advice ("rebuild its samples") that could not help; now the package's own rows are compared."""
    db, package = exchange
    with duckdb.connect(str(db)) as con:
        gate = [r[0] for r in con.sql("SELECT task FROM samples.leakage_gate WHERE dataset = 'mimic3_demo' "
                                      "ORDER BY task").fetchall()]
        assert "readmission_notes" in gate
        con.execute("DELETE FROM samples.leakage_gate WHERE dataset = 'mimic3_demo' AND task = 'readmission_notes'")
    stale = export_training_package(db, READS, SCOPE, tmp_path / "exchange", "k-trust")  # rebuilt without it
    assert "readmission_notes" not in pq.read_table(stale / "samples.leakage_gate.parquet").column("task").to_pylist()
    with duckdb.connect(str(db)) as con:  # the samples are built again: the gate writes its record
        con.execute("INSERT INTO samples.leakage_gate SELECT * REPLACE ('readmission_notes' AS task) FROM "
                    "samples.leakage_gate WHERE dataset = 'mimic3_demo' AND task = 'readmission'")
    again = export_training_package(db, READS, SCOPE, tmp_path / "exchange", "k-trust")
    assert again == package
    assert "readmission_notes" in pq.read_table(again / "samples.leakage_gate.parquet").column("task").to_pylist()


def test_the_advice_for_a_missing_gate_record_works(exchange, tmp_path) -> None:
    """Issue 44: a package without its task's gate record is refused with a command to run; running exactly that
    command writes the record, and the next package trains (the advice is followed literally, in a subprocess)."""
    db, _ = exchange
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM samples.leakage_gate WHERE dataset = 'mimic3_demo' AND task = 'readmission'")
    package = export_training_package(db, READS, SCOPE, tmp_path / "exchange", "k-trust")
    with pytest.raises(LeakageError, match=r"no record for task 'readmission'") as refused:
        _train(package, tmp_path / "exchange" / "results" / "refused")
    advice = re.search(r"`medtx ([^`]+)`", str(refused.value))
    assert advice and "\n" not in str(refused.value), refused.value
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                        "MEDTX_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", *shlex.split(advice[1]),
                           "--db", str(db)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT status FROM samples.leakage_gate WHERE dataset = 'mimic3_demo' "
                       "AND task = 'readmission'").fetchall() == [("pass",)]
    again = export_training_package(db, READS, SCOPE, tmp_path / "exchange", "k-trust")
    result = _train(again, tmp_path / "exchange" / "results" / "after")
    assert record_result_package(db, result["result"], tmp_path / "models") == result["run_ids"]
