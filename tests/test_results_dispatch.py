"""Issue 44: results fill only the run that was asked for, and packages are authenticated against the warehouse.

The flow records every training it hands out (ml.dispatches: the package's content digest, step, pipeline run,
task, dataset, model, seed); a worker given that digest refuses a changed package, and a result package is
recorded only against its awaited dispatch, under a run id the warehouse does not hold. Real packages exported
from the bundled demo, real logreg trainings, a real DuckDB warehouse; each refusal is one line and leaves the
warehouse's rows (or the victim run) unchanged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from medtx.pipeline.exchange import (ResultRefused, dispatch_training, export_training_package,
                                     record_result_package)
from medtx.pipeline.kinds.train import run as run_train_from_package
from medtx.training.integrity import PackageDamaged, content_digest, file_digests
from medtx.training.packages import PackageError
from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)
from tests.test_exchange_trust import ML, READS, SCOPE, _counts, _rehash

PIPELINE = "p-1"


def _spec(seed: int = 42, model: str = "logreg") -> dict:
    return {"dataset": "mimic3_demo", "task": "readmission", "model": model,
            "params": {"model": model, "overrides": {}, "seed": seed}}


def _step(seed: int = 42, model: str = "logreg") -> SimpleNamespace:
    spec = _spec(seed, model)
    return SimpleNamespace(name=f"train.readmission.{model}.s{seed}", spec=lambda: spec)


def _dispatch(db: Path, package: Path, seed: int = 42) -> tuple[str, str]:
    step = _step(seed)
    dispatch_id = f"{PIPELINE}/{step.name}"
    return dispatch_id, dispatch_training(db, dispatch_id, step, package, "k-trust", {"samples.readmission": "x"},
                                          PIPELINE)


def _train(package: Path, result_dir: Path, seed: int = 42, digest: str | None = None) -> dict:
    return run_train_from_package(_spec(seed), str(package), str(result_dir), pipeline_run_id=PIPELINE,
                                  device="cpu", torch_threads=1, package_digest=digest)


def _run_row(db: Path, run_id: str) -> tuple:
    with duckdb.connect(str(db), read_only=True) as con:
        return (con.execute("SELECT model, status, finished_at FROM ml.runs WHERE run_id = ?", [run_id]).fetchall(),
                {t: con.execute(f"SELECT count(*) FROM {t} WHERE run_id = ?", [run_id]).fetchall()[0][0] for t in ML})


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


@pytest.fixture
def exchange(demo_copy: Path, tmp_path: Path) -> tuple[Path, Path]:  # noqa: F811
    return demo_copy, export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k-trust")


def _rename(folder: Path, old: str, new: str) -> None:
    """What an attacker does to aim a package at another run: every row, checkpoint folder and path renamed."""
    for path in folder.glob("*.parquet"):
        table = pq.read_table(path)
        i = table.schema.get_field_index("run_id")
        table = table.set_column(i, "run_id", pc.replace_substring(table.column("run_id"), old, new))
        if "path" in table.schema.names:
            j = table.schema.get_field_index("path")
            table = table.set_column(j, "path", pc.replace_substring(table.column("path"), old, new))
        pq.write_table(table, path)
    if (folder / "models" / old).exists():
        (folder / "models" / old).rename(folder / "models" / new)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["run_ids"] = [new]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _rehash(folder)


def test_a_dispatched_result_is_recorded_once_and_closes_its_dispatch(exchange, tmp_path) -> None:
    db, package = exchange
    dispatch_id, digest = _dispatch(db, package)
    assert digest == content_digest(package)
    result = _train(package, tmp_path / "r" / "a", digest=digest)
    assert record_result_package(db, result["result"], tmp_path / "models", dispatch_id=dispatch_id) == \
        result["run_ids"]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status, run_ids, package_digest FROM ml.dispatches WHERE dispatch_id = ?",
                           [dispatch_id]).fetchall() == [("recorded", result["run_ids"], digest)]
    again = _train(package, tmp_path / "r" / "b", digest=digest)  # a second answer to the same request
    before = _counts(db)
    with pytest.raises(ResultRefused) as exc:
        record_result_package(db, again["result"], tmp_path / "models", dispatch_id=dispatch_id)
    assert "is recorded, no result is awaited" in _one_line(exc)
    assert _counts(db) == before and Path(again["result"]).exists()


def test_a_package_renamed_to_a_completed_run_is_refused_and_the_run_is_unchanged(exchange, tmp_path) -> None:
    db, package = exchange
    first = _train(package, tmp_path / "r" / "a")
    (victim,) = record_result_package(db, first["result"], tmp_path / "models")
    victim_before = _run_row(db, victim)
    assert victim_before[0][0][1] == "completed"
    dispatch_id, digest = _dispatch(db, package, seed=7)
    second = _train(package, tmp_path / "r" / "b", seed=7, digest=digest)
    folder = Path(second["result"])
    _rename(folder, second["run_ids"][0], victim)
    before = _counts(db)
    for given in (None, dispatch_id):  # as a foreign result, and as the answer to an awaited dispatch
        with pytest.raises(ResultRefused) as exc:
            record_result_package(db, folder, tmp_path / "models", dispatch_id=given)
        assert f"run {victim} is already in the warehouse (completed)" in _one_line(exc)
    assert _counts(db) == before and _run_row(db, victim) == victim_before


def test_a_result_for_another_seed_or_without_a_dispatch_is_refused(exchange, tmp_path) -> None:
    db, package = exchange
    dispatch_id, digest = _dispatch(db, package, seed=42)
    other = _train(package, tmp_path / "r" / "a", seed=5, digest=digest)  # a run nobody asked for
    before = _counts(db)
    with pytest.raises(ResultRefused) as exc:
        record_result_package(db, other["result"], tmp_path / "models", dispatch_id=dispatch_id)
    assert "seed 5, dispatch" in _one_line(exc) and "asked for 42" in str(exc.value)
    with pytest.raises(ResultRefused) as exc:
        record_result_package(db, other["result"], tmp_path / "models", dispatch_id=f"{PIPELINE}/nothing")
    assert "no training was dispatched as" in _one_line(exc)
    assert _counts(db) == before


def _poison(package: Path) -> None:
    """Flip every label of the package's samples and recompute the manifest's hashes: checksums alone pass."""
    table = package / "samples.readmission.parquet"
    rows = pq.read_table(table)
    i = rows.schema.get_field_index("label")
    flipped = pc.invert(rows.column("label").cast(pa.bool_())).cast(rows.schema.field("label").type)
    pq.write_table(rows.set_column(i, "label", flipped), table)
    _rehash(package)


def test_a_poisoned_package_with_recomputed_hashes_trains_nothing_and_records_nothing(exchange, tmp_path) -> None:
    db, package = exchange
    dispatch_id, digest = _dispatch(db, package)
    _poison(package)
    before = _counts(db)
    with pytest.raises(PackageError) as exc:  # the worker, told the digest out of band
        _train(package, tmp_path / "r" / "a", digest=digest)
    assert "is not the one the flow handed out" in _one_line(exc)
    assert not (tmp_path / "r" / "a").exists()
    from medtx.tasks import get_task
    from medtx.tasks.verdict import LeakageError, samples_fingerprint

    with pytest.raises(LeakageError, match="not those the gate judged"):  # a worker not told the digest: the
        _train(package, tmp_path / "r" / "b0")  # gate's record in the package no longer matches the samples...
    gate = pq.read_table(package / "samples.leakage_gate.parquet")  # ...so the attacker forges the record too
    task = get_task("readmission")
    forged = samples_fingerprint(pq.read_table(package / "samples.readmission.parquet"),
                                 pq.read_table(package / "samples.splits.parquet"), task, "mimic3_demo")
    i = gate.schema.get_field_index("fingerprint")
    pq.write_table(gate.set_column(i, "fingerprint", pa.array([forged] * gate.num_rows, pa.string())),
                   package / "samples.leakage_gate.parquet")
    _rehash(package)
    unchecked = _train(package, tmp_path / "r" / "b")  # now a worker not told the digest trains on the poison...
    with pytest.raises(ResultRefused) as exc:  # ...and the flow refuses what it returns
        record_result_package(db, unchecked["result"], tmp_path / "models", dispatch_id=dispatch_id)
    assert "trained on package" in _one_line(exc)
    assert _counts(db) == before


def test_the_worker_command_refuses_a_changed_package_given_its_digest(exchange, tmp_path) -> None:
    db, package = exchange
    digest = content_digest(package)
    _poison(package)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "medtx.worker", str(package), "--run", "logreg", "--out", str(out),
                           "--package-digest", digest, "--device", "cpu"], capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("medtx.worker:")]
    assert proc.returncode == 2 and len(lines) == 1 and "not the one the flow handed out" in lines[0], proc.stderr
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("case", ["probability", "metric"])
def test_forged_figures_are_refused(exchange, tmp_path, case: str) -> None:
    db, package = exchange
    result = _train(package, tmp_path / "r" / case)
    folder = Path(result["result"])
    name, column, value = (("ml.predictions", "prob", 1.7) if case == "probability" else
                           ("ml.metrics", "value", 1e9))
    table = pq.read_table(folder / f"{name}.parquet")
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, column, pa.array([value] * table.num_rows, pa.float64())),
                   folder / f"{name}.parquet")
    _rehash(folder)
    before = _counts(db)
    with pytest.raises(PackageDamaged) as exc:
        record_result_package(db, folder, tmp_path / "models")
    assert ("not within [0, 1]" if case == "probability" else "not a value that metric takes") in _one_line(exc)
    assert _counts(db) == before


def _worker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "medtx.worker", *args], capture_output=True, text=True, timeout=120)


def test_the_worker_checks_its_command_line_before_reading_the_package(tmp_path) -> None:
    missing = tmp_path / "no-such-package"
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps([{"model": "logreg", "label": "x/../../escape"}]))
    for args, words in ((["--runs", str(runs)], "unsafe run label 'x/../../escape'"),
                        (["--run", "logreg", "--package-digest", "abc"], "--package-digest 'abc'"),
                        (["--run", "logreg", "--overrides", "{bad"], "--overrides '{bad': not JSON")):
        proc = _worker(str(missing), *args, "--out", str(tmp_path / "out"))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr
    assert not (tmp_path / "escape").exists() and not (tmp_path / "out").exists()
    text = _worker("--help").stdout
    assert "record-results" not in text and "export-package" not in text


def test_a_worker_never_replaces_a_folder_that_is_not_a_result_package(exchange, tmp_path) -> None:
    db, package = exchange
    mine = tmp_path / "out" / "readmission.mimic3_demo.logreg.s42"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(PackageError) as exc:
        _train(package, mine)
    assert "is not a result package" in _one_line(exc)
    assert (mine / "thesis.tex").read_text() == "years of work"
    shutil.rmtree(tmp_path / "out")
