"""`python -m medtx.worker`: trains from a training package where polars, DuckDB, Prefect, Dash and Dask cannot be
imported (a GPU machine's image), and the flow records its result packages like any other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from medtx.pipeline.exchange import export_training_package, record_result_package
from medtx.pipeline.steps import train_in_process
from medtx.tasks import get_task
from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)

READS = ("samples.drug_rec", "samples.splits", "samples.vocab", "samples.leakage_gate", "ref.ddi_atc3",
         "raw.synth_oracle_drug_rec")
SCOPE = {"dataset": "mimic3_demo", "task": "drug_rec"}
BLOCKED = ("polars", "duckdb", "prefect", "dash", "dask", "flows", "dashboard")
ROOT = Path(__file__).resolve().parents[1]
GRU = {"epochs": 1, "d_model": 16, "hidden": 16, "num_threads": 1}

BLOCKER = f'''
import sys

BLOCKED = {set(BLOCKED)!r}


class _Blocked:
    """Importing any of BLOCKED fails as if it were not installed (the GPU image lacks them)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{{name}} is blocked in this test: the worker must run without it", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
'''


def _blocked_env(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "blocker"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(BLOCKER)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)]), "PYTHONUNBUFFERED": "1"}


def _worker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "medtx.worker", *args], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


def _metrics(db: Path, run_id: str) -> dict[tuple[str, str], tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT metric, averaging, value, ci_low, ci_high FROM ml.metrics "
                           "WHERE run_id = ? AND split = 'test'", [run_id]).fetchall()
    return {(m, a): (v, lo, hi) for m, a, v, lo, hi in rows}


def test_the_blocker_really_blocks(tmp_path: Path) -> None:
    env = _blocked_env(tmp_path)
    for name in BLOCKED[:4]:
        probe = subprocess.run([sys.executable, "-c", f"import {name}"], env=env, capture_output=True, text=True)
        assert probe.returncode != 0 and "blocked in this test" in probe.stderr, name
    ok = subprocess.run([sys.executable, "-c", "import torch, pyarrow, sklearn"], env=env, capture_output=True)
    assert ok.returncode == 0


def test_worker_trains_without_polars_duckdb_prefect_dash_and_the_flow_records_it(demo_copy: Path,
                                                                                   tmp_path: Path) -> None:
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k1")
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps([{"model": "gru", "seed": 0, "overrides": GRU}, {"model": "logreg", "seed": 0}]))
    out = tmp_path / "out"
    done = _worker(_blocked_env(tmp_path), str(package), "--runs", str(runs), "--out", str(out), "--device", "cpu",
                   "--threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [(r["run"], r["status"]) for r in lines] == [("drug_rec.mimic3_demo.gru.s0", "completed"),
                                                       ("drug_rec.mimic3_demo.logreg.s0", "completed")]
    models = tmp_path / "models"
    recorded = [record_result_package(demo_copy, r["result"], models)[0] for r in lines]
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        rows = con.execute("SELECT run_id, model, status, device, n_params, code_version, is_synthetic FROM ml.runs "
                           f"WHERE run_id IN ('{recorded[0]}', '{recorded[1]}') ORDER BY model").fetchall()
        n_pred = con.execute(f"SELECT count(*) FROM ml.predictions WHERE run_id = '{recorded[0]}'").fetchall()[0][0]
        n_epochs = con.execute(f"SELECT count(DISTINCT epoch) FROM ml.epochs WHERE run_id = '{recorded[0]}'"
                               ).fetchall()[0][0]
        paths = [Path(p) for (p,) in con.execute(f"SELECT path FROM ml.models WHERE run_id = '{recorded[0]}'"
                                                 ).fetchall()]
    assert [r[1:4] for r in rows] == [("gru", "completed", "cpu"), ("logreg", "completed", "cpu")]
    assert rows[0][4] > 0 and rows[0][5].startswith("0.") and rows[0][6] is False
    assert n_pred > 0 and n_epochs == 1
    assert paths and all(p.is_relative_to(models) and (p / "model.safetensors").exists() for p in paths)
    # the writer computed the patient-bootstrap intervals the worker (no DuckDB) left out
    pr_auc = _metrics(demo_copy, recorded[0])[("pr_auc_samples", "visit")]
    assert pr_auc[1] is not None and pr_auc[1] <= pr_auc[0] <= pr_auc[2]


def test_worker_run_equals_the_same_run_in_process(demo_copy: Path, tmp_path: Path) -> None:
    """Same package, seed and threads: the worker command's test figures (where only torch lives) equal those of
    the same run trained in this process (`train_in_process`: `medtx train`'s path, package -> worker -> record)."""
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k2")
    done = _worker(_blocked_env(tmp_path), str(package), "--run", "gru:3", "--overrides", json.dumps(GRU),
                   "--out", str(tmp_path / "out"), "--device", "cpu", "--threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    (worker_run,) = record_result_package(demo_copy, line["result"], tmp_path / "models")
    here = train_in_process(demo_copy, get_task("drug_rec"), "gru", 3, GRU, dataset="mimic3_demo", device="cpu",
                            models_dir=tmp_path / "models_here")
    theirs, ours = _metrics(demo_copy, worker_run), _metrics(demo_copy, here)
    assert theirs.keys() == ours.keys() and len(ours) > 10
    assert {k: v[0] for k, v in theirs.items()} == {k: v[0] for k, v in ours.items()}


def test_bad_input_is_one_line_and_exit_2(demo_copy: Path, tmp_path: Path) -> None:
    env = _blocked_env(tmp_path)
    missing = _worker(env, str(tmp_path / "nowhere"), "--run", "gru", "--out", str(tmp_path / "o"))
    assert missing.returncode == 2 and "not a training package" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k4")
    bad_seed = _worker(env, str(package), "--run", "gru:x", "--out", str(tmp_path / "o"))
    assert bad_seed.returncode == 2 and "MODEL:SEED" in bad_seed.stderr
    (package / "samples.vocab.parquet").unlink()
    broken = _worker(env, str(package), "--run", "gru", "--out", str(tmp_path / "o"))
    assert broken.returncode == 2 and "samples.vocab.parquet is missing" in broken.stderr
    assert not (tmp_path / "o").exists()  # nothing written for bad input


def test_an_undeclared_read_fails_the_run_and_the_failure_is_recorded(demo_copy: Path, tmp_path: Path) -> None:
    reads = tuple(t for t in READS if t != "ref.ddi_atc3")
    package = export_training_package(demo_copy, reads, SCOPE, tmp_path / "exchange", "k5")
    done = _worker(_blocked_env(tmp_path), str(package), "--run", "logreg", "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    (line,) = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert line["status"] == "failed" and "ref.ddi_atc3" in line["error"]
    (run_id,) = record_result_package(demo_copy, line["result"], tmp_path / "models")
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        status, error = con.execute("SELECT status, error FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()[0]
    assert status == "failed" and "ref.ddi_atc3" in error


@pytest.mark.parametrize("text", ["not a list", "[{\"seed\": 1}]"])
def test_runs_file_must_name_models(demo_copy: Path, tmp_path: Path, text: str) -> None:
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k6")
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps(text) if text == "not a list" else text)
    done = _worker(_blocked_env(tmp_path), str(package), "--runs", str(runs), "--out", str(tmp_path / "o"))
    assert done.returncode == 2 and "'model' key" in done.stderr
