"""`medtx train` takes the pipeline's path in one process: training package out, result package in.

On a real warehouse built by the real commands (bundled MIMIC-III demo): the run is trained from a package in
the exchange folder and recorded from its result package; a training that fails is recorded as a failed run and
the command exits 1; a model the registry does not offer for the task is refused before any run exists.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from flows.cli import app

runner = CliRunner()


def _invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli-train")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEDTX_HOME", str(folder))
        for args in (("ingest", "mimic3"), ("map-codes",), ("build-samples", "--task", "drug_rec")):
            code, out = _invoke(*args, "--db", str(folder / "w.duckdb"))
            assert code == 0, out
        yield folder


def _runs(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql("SELECT r.model, r.status, count(m.run_id) FROM ml.runs r LEFT JOIN ml.metrics m "
                       "USING (run_id) GROUP BY ALL ORDER BY min(r.started_at)").fetchall()


def test_train_goes_through_a_training_package_and_a_result_package(home: Path, monkeypatch) -> None:
    monkeypatch.setenv("MEDTX_HOME", str(home))
    db = home / "w.duckdb"
    code, out = _invoke("train", "--task", "drug_rec", "--model", "gru", "--epochs", "1", "--db", str(db))
    assert code == 0, out
    [(model, status, n_metrics)] = _runs(db)
    assert (model, status) == ("gru", "completed") and n_metrics > 0
    exchange = home / "exchange"
    [package] = list((exchange / "packages").glob("*/manifest.json"))
    assert "samples.drug_rec" in json.loads(package.read_text())["tables"]
    assert not list((exchange / "results").rglob("manifest.json"))  # recorded, then deleted (issue 34)
    with duckdb.connect(str(db), read_only=True) as con:
        run_ids = [r for (r,) in con.sql("SELECT run_id FROM ml.runs").fetchall()]
    assert len(run_ids) == 1 and run_ids[0] in out
    with duckdb.connect(str(db), read_only=True) as con:
        paths = [Path(p) for (p,) in con.execute("SELECT path FROM ml.models WHERE run_id = ?", run_ids).fetchall()]
    assert paths and all(p.is_relative_to(home / "models") and p.exists() for p in paths)


def test_a_failed_training_is_recorded_and_exits_1_an_unknown_model_writes_nothing(home: Path, monkeypatch) -> None:
    monkeypatch.setenv("MEDTX_HOME", str(home))
    db = home / "w.duckdb"
    before = _runs(db)
    # a setting the config checks cannot judge (a feature column the samples lack) fails inside the training
    code, out = _invoke("train", "--task", "drug_rec", "--model", "gru", "--set", 'features=["no_such_feature"]',
                        "--epochs", "1", "--db", str(db))
    assert code == 1 and "train failed" in out
    assert _runs(db)[len(before):] == [("gru", "failed", 0)]

    code, out = _invoke("train", "--task", "drug_rec", "--model", "bilstm", "--db", str(db))
    assert code == 1 and "does not serve task 'drug_rec'" in " ".join(out.split()) and "transformer" in out
    assert len(_runs(db)) == len(before) + 1


@pytest.mark.parametrize("setting, says", [
    ("lr=-1", "--set lr=-1: must be a finite number in (0, 10]"),
    ("d_model=abc", "--set d_model='abc': must be an integer in [1, 8192]"),
    ("no_such_key=1", "--set no_such_key=1: not a setting of gru; allowed: batch_size,"),
])
def test_a_set_value_the_config_would_refuse_exits_2_naming_it_and_records_nothing(home: Path, monkeypatch,
                                                                                  setting: str, says: str) -> None:
    """`--set` goes through the pipeline config's checks (keys, types, bounds): one line naming the key and what
    is allowed, exit 2 (bad input), no run recorded — it used to reach the training and fail there."""
    monkeypatch.setenv("MEDTX_HOME", str(home))
    db = home / "w.duckdb"
    before = _runs(db)
    code, out = _invoke("train", "--task", "drug_rec", "--model", "gru", "--set", setting, "--epochs", "1",
                        "--db", str(db))
    assert code == 2, out
    assert says in " ".join(out.split()) and len(out.strip().splitlines()) == 1, out
    assert _runs(db) == before


def test_a_run_recorded_as_failed_exits_1_with_one_line_and_no_metrics(home: Path, tmp_path: Path,
                                                                       monkeypatch) -> None:
    """Issue 34 case 15: the training itself succeeds, but recording its result package marks the run failed
    (its test samples differ from the reference baseline's, so its figures cannot be compared): `medtx train`
    reads the status it stored and says so in one line, exit 1, no metrics table, no run id on stdout."""
    import shutil

    shutil.copy(home / "w.duckdb", tmp_path / "w.duckdb")  # a copy: the other tests keep their warehouse
    monkeypatch.setenv("MEDTX_HOME", str(tmp_path))
    db = tmp_path / "w.duckdb"
    code, out = _invoke("train", "--task", "drug_rec", "--model", "most_frequent", "--db", str(db))
    assert code == 0, out
    with duckdb.connect(str(db)) as con:  # the reference's predictions lose one test sample (an older split)
        [(ref_id,)] = con.sql("SELECT run_id FROM ml.runs WHERE model = 'most_frequent' AND status = 'completed'"
                              ).fetchall()
        con.execute("DELETE FROM ml.predictions WHERE run_id = ? AND sample_id = "
                    "(SELECT min(sample_id) FROM ml.predictions WHERE run_id = ?)", [ref_id, ref_id])
    runs_sql = "SELECT run_id, model, status, error FROM ml.runs ORDER BY started_at, run_id"
    with duckdb.connect(str(db), read_only=True) as con:
        before = con.sql(runs_sql).fetchall()
    code, out = _invoke("train", "--task", "drug_rec", "--model", "gru", "--epochs", "1", "--db", str(db))
    with duckdb.connect(str(db), read_only=True) as con:
        after = con.sql(runs_sql).fetchall()
        [(run_id, model, status, error)] = after[len(before):]
        n_metrics = con.execute("SELECT count(*) FROM ml.metrics WHERE run_id = ?", [run_id]).fetchone()[0]
    assert after[:len(before)] == before
    assert (model, status) == ("gru", "failed") and n_metrics > 0  # trained and scored, then refused
    assert "the runs predicted different test samples" in error
    assert code == 1, out
    assert out.strip().splitlines() == [f"train failed: run {run_id} is stored as failed: {error}"], out
    assert "roc_auc" not in out and "│" not in out  # no metrics table
