"""`medtx import predictions` (issue 45): a model trained outside medtx joins the leaderboard from a
meds-evaluation PredictionSchema file. Proved on medtx's own exported predictions: a logreg run's test
predictions, exported and imported under another model name, give the same AUROC and AUPRC, a paired verdict
against the reference baseline, subgroups, calibration, a card, and the "trained outside medtx" mark; every kind of
bad file is refused with one line naming the first bad row, exit 2, and nothing written."""

from __future__ import annotations

import shutil

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score
from typer.testing import CliRunner

from flows.cli import app
from medtx.tasks import get_task
from medtx.pipeline.steps import train_in_process
from tests.fixtures_samples import DEMO, demo_db  # noqa: F401  (session fixture)

TASK = "mortality"


@pytest.fixture(scope="module")
def exported(demo_db, tmp_path_factory):  # noqa: F811
    """A copy of the demo warehouse with one logreg mortality run, and its test predictions exported."""
    folder = tmp_path_factory.mktemp("import-predictions")
    db = folder / "warehouse.duckdb"
    shutil.copy(demo_db, db)
    run_id = train_in_process(db, get_task(TASK), "logreg", 0, dataset=DEMO)
    preds = folder / "logreg.parquet"
    r = CliRunner().invoke(app, ["export", "predictions", "--run", run_id, "--out", str(preds), "--db", str(db)])
    assert r.exit_code == 0, r.output
    return db, run_id, preds


def _invoke(db, path, model="outside_logreg", *extra):
    return CliRunner().invoke(app, ["import", "predictions", "--task", TASK, "--model", model, "--dataset", DEMO,
                                    "--db", str(db), *extra, str(path)])


def _runs(db) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM ml.runs").fetchall()[0][0]


def test_reimported_logreg_predictions_score_the_same_and_are_marked(exported, tmp_path):
    db, logreg, preds = exported
    r = _invoke(db, preds)
    assert r.exit_code == 0, r.output
    run_id = r.output.strip().splitlines()[-1]
    assert "trained outside medtx" in r.output
    frame = pl.read_parquet(preds)
    with duckdb.connect(str(db), read_only=True) as con:
        status, config, fingerprint, threshold_source, n_units = con.execute(
            "SELECT status, config, data_fingerprint, threshold_source, n_test_units FROM ml.runs WHERE run_id = ?",
            [run_id]).fetchall()[0]
        ref_fingerprint = con.execute("SELECT data_fingerprint FROM ml.runs WHERE run_id = ?", [logreg]).fetchall()[0][0]
        metrics = {run: dict(con.execute(
            "SELECT metric, value FROM ml.metrics WHERE run_id = ? AND split = 'test' AND averaging = 'none'",
            [run]).fetchall()) for run in (run_id, logreg)}
        intervals = con.execute("SELECT ci_low, ci_high FROM ml.metrics WHERE run_id = ? AND split = 'test' "
                                "AND metric = 'auroc'", [run_id]).fetchall()[0]
        comparison = con.execute("SELECT reference_run_id, verdict, n_units FROM ml.comparisons WHERE run_id = ? "
                                 "AND metric = 'auprc'", [run_id]).fetchall()
        subgroups = con.execute("SELECT count(*) FROM ml.subgroups WHERE run_id = ?", [run_id]).fetchall()[0][0]
        calibration = con.execute("SELECT count(*) FROM ml.calibration WHERE run_id = ? AND method = 'none'",
                                  [run_id]).fetchall()[0][0]
        stored = con.execute("SELECT count(*), count(*) FILTER (WHERE y_true) FROM ml.predictions WHERE run_id = ?",
                             [run_id]).fetchall()[0]
    assert status == "completed" and '"origin": "trained outside medtx"' in config and threshold_source == "file"
    assert fingerprint == ref_fingerprint  # the same samples and split as the run it came from
    assert stored == (frame.height, int(frame["boolean_value"].sum()))
    # the file's own figures (meds-evaluation computes exactly these with scikit-learn) and the original run's
    y, p = frame["boolean_value"].to_numpy(), frame["predicted_boolean_probability"].to_numpy()
    assert abs(metrics[run_id]["auroc"] - roc_auc_score(y, p)) < 1e-9
    assert abs(metrics[run_id]["auprc"] - average_precision_score(y, p)) < 1e-9
    assert abs(metrics[run_id]["auroc"] - metrics[logreg]["auroc"]) < 1e-6
    assert intervals[0] is not None and intervals[0] < metrics[run_id]["auroc"] < intervals[1]
    assert n_units == frame["subject_id"].n_unique()
    assert comparison and comparison[0][0] == logreg and comparison[0][1]  # paired, against the reference logreg
    assert subgroups > 0 and calibration > 0
    # the card and the leaderboard say where it was trained
    card = tmp_path / "card.html"
    r = CliRunner().invoke(app, ["report", "--run", run_id, "--out", str(card), "--db", str(db)])
    assert r.exit_code == 0, r.output
    text = card.read_text()
    assert "TRAINED OUTSIDE MEDTX" in text and "trained outside medtx: predictions imported from" in text
    from dashboard import queries
    from dashboard.pages.leaderboard import headline_metric, leaderboard_rows

    snapshot = tmp_path / "snapshot.duckdb"  # the dashboard reads a published copy, never the warehouse
    shutil.copy(db, snapshot)
    rows, _ = leaderboard_rows(queries.leaderboard_runs(snapshot, TASK, DEMO), queries.leaderboard_metrics(
        snapshot, TASK, DEMO, None), queries.leaderboard_sizes(snapshot, TASK, DEMO), headline_metric(TASK))
    mine = [row for row in rows if row["run_id"] == run_id]
    assert mine and "(trained outside medtx)" in mine[0]["model"] and "trained outside medtx" in mine[0]["flags"]
    assert mine[0].get("verdict") == comparison[0][1]  # its verdict is on the leaderboard
    assert not any("outside" in row["flags"] for row in rows if row["run_id"] == logreg)


def _rewrite(preds, tmp_path, change) -> str:
    table = pq.read_table(preds)
    out = tmp_path / "bad.parquet"
    pq.write_table(change(table), out)
    return out


def _with(table: pa.Table, column: str, values) -> pa.Table:
    i = table.schema.get_field_index(column)
    return table.set_column(i, table.schema.field(i).name, pa.array(values, type=table.schema.field(i).type))


def _train_sample(db):
    task = get_task(TASK)
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            f"SELECT s.subject_id, CAST(s.prediction_time AS TIMESTAMP), s.{task.samples.label_column} FROM "
            f"{task.samples.table} s JOIN samples.splits sp ON sp.dataset = s.dataset AND sp.task = ? "
            "AND sp.subject_id = s.subject_id WHERE s.dataset = ? AND s.task = ? AND sp.split = 'train' "
            "ORDER BY 1, 2 LIMIT 1", [TASK, DEMO, TASK]).fetchall()[0]


def test_bad_files_are_refused_with_the_first_bad_row(exported, tmp_path):
    db, _, preds = exported
    before = _runs(db)
    n = pq.read_metadata(preds).num_rows
    subject, at, label = _train_sample(db)
    train_row = pa.table({"subject_id": pa.array([subject], pa.int64()), "prediction_time": pa.array([at], pa.timestamp("us")),
                          "boolean_value": [bool(label)], "predicted_boolean_value": [False],
                          "predicted_boolean_probability": pa.array([0.1], pa.float32())})
    flip = lambda t: _with(t, "boolean_value", [not v if i == 2 else v for i, v in enumerate(t["boolean_value"].to_pylist())])  # noqa: E731
    cases = {
        "train": (lambda t: pa.concat_tables([t, train_row.cast(t.schema)]),
                  f"row {n + 1}: subject {subject} at {at} is a train sample; only held-out (test) samples"),
        "label": (flip, "row 3: subject"),
        "duplicate": (lambda t: pa.concat_tables([t, t.slice(4, 1)]), f"repeats row 5"),
        "missing": (lambda t: t.slice(1), "1 of "),
        "nan": (lambda t: _with(t, "predicted_boolean_probability",
                                [float("nan") if i == 6 else v for i, v in enumerate(
                                    t["predicted_boolean_probability"].to_pylist())]),
                "row 7: predicted_boolean_probability is NaN"),
        "time": (lambda t: _with(t, "prediction_time", [v.replace(minute=(v.minute + 1) % 60) if i == 0 else v
                                                         for i, v in enumerate(t["prediction_time"].to_pylist())]),
                 "row 1: subject"),
        "tz": (lambda t: t.set_column(1, "prediction_time", t["prediction_time"].cast(pa.timestamp("us", tz="UTC"))),
               "column prediction_time is timestamp[us, tz=UTC]"),
        "type": (lambda t: t.set_column(4, "predicted_boolean_probability",
                                        t["predicted_boolean_probability"].cast(pa.string())),
                 "column predicted_boolean_probability is string"),
        "column": (lambda t: t.drop_columns(["boolean_value"]), "column boolean_value is missing"),
    }
    for name, (change, expected) in cases.items():
        bad = _rewrite(preds, tmp_path, change)
        r = _invoke(db, bad)
        text = " ".join(r.output.split())
        assert r.exit_code == 2, (name, r.output)
        assert expected in text and "nothing was imported" in text, (name, text)
        assert len(r.output.strip().splitlines()) <= 3, (name, r.output)  # one line (wrapped by the terminal)
    assert "label is" in " ".join(_invoke(db, _rewrite(preds, tmp_path, flip)).output.split())
    assert "have no row (first: subject" in " ".join(_invoke(db, _rewrite(preds, tmp_path, cases["missing"][0])).output.split())
    r = _invoke(db, preds, "logreg")
    assert r.exit_code == 2 and "one of medtx's own models" in r.output
    r = _invoke(db, preds, "outside", "--task", "readmission")
    assert r.exit_code == 2, r.output  # mortality's predictions are no readmission labels
    assert _runs(db) == before  # nothing recorded by any refusal
    # a nanosecond time column (what pandas writes) with the same instants is the same file
    ns = _rewrite(preds, tmp_path, lambda t: t.set_column(1, "prediction_time",
                                                          t["prediction_time"].cast(pa.timestamp("ns"))))
    r = _invoke(db, ns, "outside_ns")
    assert r.exit_code == 0, r.output


def test_import_waits_for_the_writer_lock(exported, monkeypatch):
    """Another writer holds the warehouse: the import waits (bounded), names the holder, exits 1, writes nothing."""
    import os
    import subprocess
    import sys
    import textwrap

    from tests.conftest import REPO_ROOT

    db, _, preds = exported
    code = textwrap.dedent(f"""
        import time
        from medtx.store.writer_lock import hold_writer
        with hold_writer({str(db)!r}, "medtx pipeline", wait_s=0):
            print("held", flush=True)
            time.sleep(600)
        """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        before = _runs(db)
        monkeypatch.setenv("MEDTX_LOCK_WAIT_S", "1")
        r = _invoke(db, preds, "outside_locked")
        text = " ".join(r.output.split())
        assert r.exit_code == 1 and f"is being written by `medtx pipeline` pid {holder.pid}" in text, text
        assert _runs(db) == before
    finally:
        holder.kill()
        holder.wait()
