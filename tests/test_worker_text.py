"""The text tasks (notes split by text group or by patient, and the FAQ) train in `python -m medtx.worker` from a
training package, where polars, DuckDB, Prefect, Dash and Dask cannot be imported, and the flow records their
result packages; the numbers equal the same runs trained in process against the warehouse."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from medtx import worker
from medtx.pipeline.exchange import export_training_package, record_result_package
from medtx.pipeline.kinds.train import train_step
from medtx.tasks import get_task
from medtx.pipeline.steps import train_in_process
from medtx.training.packages import read_training_package
from tests.fixtures_dashboard import TINY_BERT
from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)
from tests.test_text import notes, specialty_db  # noqa: F401  (fixtures: 24 MTSamples notes + 1 duplicate)
from tests.test_worker import _blocked_env, _worker

BILSTM = {"epochs": 2, "embed_dim": 16, "hidden_dim": 16, "vocab_size": 500, "bilstm_max_len": 64, "n_showcase": 2}


def _package(db: Path, task: str, dataset: str, folder: Path, key: str) -> Path:
    """The training package the pipeline's train step of (task, dataset) exports: its declared reads and scope."""
    step = train_step(get_task(task), dataset, "majority")
    return export_training_package(db, step.reads, step.scope, folder / "exchange", key)


def _train(env: dict[str, str], package: Path, runs: list[dict], out: Path, *args: str) -> list[dict]:
    spec = out.parent / f"{out.name}.runs.json"
    spec.write_text(json.dumps(runs))
    done = _worker(env, str(package), "--runs", str(spec), "--out", str(out), "--device", "cpu", "--threads", "1",
                   *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _stored(db: Path, run_id: str) -> dict[str, list[tuple]]:
    """A run's stored figures: test metrics (with the writer's intervals), per-label scores, confusion cells,
    predictions and attention, each sorted."""
    queries = {
        "metrics": "SELECT split, metric, averaging, value, sd, n_boot, ci_low, ci_high FROM ml.metrics",
        "label_metrics": "SELECT split, label, metric, value, support FROM ml.label_metrics",
        "confusion": "SELECT split, true_label, pred_label, n FROM ml.confusion",
        "predictions": "SELECT sample_id, subject_id, hadm_id, label, prob, y_true, predicted, text FROM ml.predictions",
        "attention": "SELECT sample_id, module, layer, head, query_pos, key_pos, weight, query_token, key_token "
                     "FROM ml.attention",
    }
    with duckdb.connect(str(db), read_only=True) as con:
        return {name: sorted(con.execute(f"{sql} WHERE run_id = ?", [run_id]).fetchall(), key=repr)
                for name, sql in queries.items()}


def _run_row(db: Path, run_id: str) -> dict:
    with duckdb.connect(str(db), read_only=True) as con:
        rel = con.execute("SELECT * FROM ml.runs WHERE run_id = ?", [run_id])
        names = [c[0] for c in rel.description]
        return dict(zip(names, rel.fetchall()[0], strict=True))


def test_worker_trains_text_runs_without_polars_duckdb_prefect_dash_and_the_flow_records_them(
        specialty_db: Path, tmp_path: Path) -> None:  # noqa: F811
    package = _package(specialty_db, "specialty", "mtsamples", tmp_path, "t1")
    lines = _train(_blocked_env(tmp_path), package, [
        {"model": "tfidf_logreg", "seed": 0},
        {"model": "bert_scratch", "seed": 0, "overrides": TINY_BERT},
    ], tmp_path / "out")
    assert [(r["run"], r["status"]) for r in lines] == [("specialty.mtsamples.tfidf_logreg.s0", "completed"),
                                                       ("specialty.mtsamples.bert_scratch.s0", "completed")]
    models = tmp_path / "models"
    tfidf, bert = (record_result_package(specialty_db, r["result"], models)[0] for r in lines)
    for run_id in (tfidf, bert):
        row = _run_row(specialty_db, run_id)
        assert (row["status"], row["device"], row["dataset"], row["is_synthetic"]) == ("completed", "cpu",
                                                                                        "mtsamples", False)
        config = json.loads(row["config"])
        assert config["n_notes"] == {"train": 12, "val": 6, "test": 6} and config["n_classes"] == 3  # dup dropped
        stored = _stored(specialty_db, run_id)
        assert len(stored["predictions"]) == 6 * 3 and sum(r[3] for r in stored["confusion"]) == 6
        macro_f1 = next(r for r in stored["metrics"] if r[1] == "macro_f1")
        assert macro_f1[6] is not None and macro_f1[6] <= macro_f1[7]  # the writer's bootstrap interval
    assert config["text"]["hidden"] == TINY_BERT["hidden"] and config["text"]["device"] == "cpu"
    with duckdb.connect(str(specialty_db), read_only=True) as con:
        kinds = dict(con.execute("SELECT kind, path FROM ml.models WHERE run_id = ?", [bert]).fetchall())
        shown = con.execute("SELECT count(DISTINCT sample_id), count(DISTINCT layer), count(DISTINCT head) "
                            "FROM ml.attention WHERE run_id = ?", [bert]).fetchall()[0]
        n_epochs = con.execute("SELECT count(DISTINCT epoch) FROM ml.epochs WHERE run_id = ?", [bert]).fetchall()[0][0]
    assert set(kinds) == {"best", "last", "pretrained"}
    assert all(Path(p).is_relative_to(models / bert) and Path(p).exists() for p in kinds.values())
    assert shown == (TINY_BERT["n_showcase"], TINY_BERT["layers"], TINY_BERT["heads"]) and n_epochs == 1


def test_a_text_run_from_the_worker_equals_the_same_run_in_process(specialty_db: Path, tmp_path: Path,  # noqa: F811
                                                                    monkeypatch) -> None:
    """Same notes, model, seed and threads: every stored figure of the worker's run (metrics and intervals,
    per-label scores, confusion, predictions, attention) equals the in-process run's against the warehouse."""
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models_here"))
    package = _package(specialty_db, "specialty", "mtsamples", tmp_path, "t2")
    runs = [{"model": "tfidf_logreg", "seed": 0}, {"model": "bilstm", "seed": 1, "overrides": BILSTM}]
    lines = _train(_blocked_env(tmp_path), package, runs, tmp_path / "out")
    theirs = [record_result_package(specialty_db, r["result"], tmp_path / "models")[0] for r in lines]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker trained (--threads 1)
    try:
        ours = [train_in_process(specialty_db, get_task("specialty"), r["model"], r["seed"], r.get("overrides"),
                                 device="cpu") for r in runs]
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(theirs, ours, strict=True):
        assert _stored(specialty_db, a) == _stored(specialty_db, b)
        assert json.loads(_run_row(specialty_db, a)["config"]) == json.loads(_run_row(specialty_db, b)["config"])
    assert len(_stored(specialty_db, theirs[1])["attention"]) > 0  # the bilstm's showcase rows were compared


@pytest.fixture
def notes_copy(demo_copy: Path) -> Path:  # noqa: F811
    """The demo with discharge summaries (the demo ships without notes) planted in raw.noteevents, charted on the
    day of discharge, and readmission rebuilt so the leakage gate judges them: every fourth admission has none
    and some a blank one, which the note task leaves out."""
    from medtx.tasks.build import build_samples
    from tests.conftest import DATA

    with duckdb.connect(str(demo_copy)) as con:
        stays = con.sql("SELECT subject_id, hadm_id, dischtime, label FROM samples.readmission "
                        "WHERE dataset = 'mimic3_demo'").fetchall()
        notes = [("mimic3_demo", 8_000_000 + hadm, subject, hadm, disch.replace(hour=0, minute=0, second=0),
                  "Discharge summary", "  " if hadm % 8 == 1 else
                  f"discharge summary {hadm}" + (" chf copd readmit" if label else " stable home"))
                 for subject, hadm, disch, label in stays if hadm % 4 != 0]
        con.executemany("INSERT INTO raw.noteevents (dataset, row_id, subject_id, hadm_id, chartdate, category, text) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)", notes)
        build_samples(con, DATA, ["readmission"], ["mimic3_demo"])
    return demo_copy


def test_a_patient_split_note_run_from_the_worker_equals_the_run_in_process(notes_copy: Path, tmp_path: Path,
                                                                           monkeypatch) -> None:
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models_here"))
    package = _package(notes_copy, "readmission_notes", "mimic3_demo", tmp_path, "r1")
    spec = {"dataset": "mimic3_demo", "task": "readmission_notes",
            "params": {"model": "tfidf_logreg", "seed": 0, "overrides": {}}}
    out = worker.train_run(package, spec, tmp_path / "out" / "r1", device="cpu", torch_threads=1)
    (theirs,) = record_result_package(notes_copy, out["result"], tmp_path / "models")
    ours = train_in_process(notes_copy, get_task("readmission_notes"), "tfidf_logreg", 0, dataset="mimic3_demo",
                            device="cpu")
    a, b = _stored(notes_copy, theirs), _stored(notes_copy, ours)
    assert a == b and len(a["predictions"]) >= 10
    assert all(r[1] is not None and r[2] is not None for r in a["predictions"])  # subject and admission ids kept
    row = _run_row(notes_copy, theirs)
    assert (row["threshold"], row["threshold_source"], row["status"]) == (0.5, "fixed", "completed")


def test_the_worker_command_trains_the_task_it_is_told_on_a_package_scoped_by_another(notes_copy: Path,
                                                                                      tmp_path: Path) -> None:
    """readmission_notes trains on readmission's samples, so its package's scope says 'readmission': from the
    command line `--task readmission_notes` trains the note task (recorded under that name); without it the run
    is the EHR task's, and an unknown --task is refused with one line, exit 2."""
    package = _package(notes_copy, "readmission_notes", "mimic3_demo", tmp_path, "r3")
    assert read_training_package(package)[0]["scope"]["task"] == "readmission"
    env = _blocked_env(tmp_path)
    (line,) = _train(env, package, [{"model": "tfidf_logreg"}], tmp_path / "out", "--task", "readmission_notes")
    assert line["run"].startswith("readmission_notes.mimic3_demo.tfidf_logreg") and line["status"] == "completed"
    (run_id,) = record_result_package(notes_copy, line["result"], tmp_path / "models")
    assert _run_row(notes_copy, run_id)["task"] == "readmission_notes"
    bad = _worker(env, str(package), "--run", "tfidf_logreg", "--task", "nope", "--out", str(tmp_path / "o2"))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("medtx.worker: --task 'nope'")
    default = _worker(env, str(package), "--run", "tfidf_logreg", "--out", str(tmp_path / "o3"), "--device", "cpu")
    assert default.returncode == 1 and "readmission.mimic3_demo.tfidf_logreg" in default.stdout

def test_a_blocked_leakage_gate_refuses_the_note_run_and_the_refusal_is_recorded(notes_copy: Path,
                                                                                tmp_path: Path) -> None:
    with duckdb.connect(str(notes_copy)) as con:
        con.execute("UPDATE samples.leakage_gate SET status = 'blocked', message = 'leakage gate: blocked for "
                    "this test' WHERE task = 'readmission_notes' AND dataset = 'mimic3_demo'")
    package = _package(notes_copy, "readmission_notes", "mimic3_demo", tmp_path, "r2")
    spec = {"dataset": "mimic3_demo", "task": "readmission_notes",
            "params": {"model": "tfidf_logreg", "seed": 0, "overrides": {}}}
    with pytest.raises(Exception, match="blocked for this test"):
        worker.train_run(package, spec, tmp_path / "out" / "r2", device="cpu")
    (run_id,) = record_result_package(notes_copy, tmp_path / "out" / "r2", tmp_path / "models")
    row = _run_row(notes_copy, run_id)
    assert row["status"] == "failed" and "blocked for this test" in row["error"]
    assert _stored(notes_copy, run_id)["predictions"] == []


def test_the_faq_trains_in_the_worker_and_equals_the_run_in_process(demo_copy: Path, tmp_path: Path,  # noqa: F811
                                                                    monkeypatch) -> None:
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models_here"))
    package = _package(demo_copy, "faq", "mental_health_faq", tmp_path, "f1")
    (line,) = _train(_blocked_env(tmp_path), package, [{"model": "retrieval", "seed": 0}], tmp_path / "out")
    (theirs,) = record_result_package(demo_copy, line["result"], tmp_path / "models")
    ours = train_in_process(demo_copy, get_task("faq"), "retrieval", 0, device="cpu")
    a, b = _stored(demo_copy, theirs), _stored(demo_copy, ours)
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        n_para = con.execute("SELECT count(*) FROM samples.faq WHERE paraphrase IS NOT NULL").fetchall()[0][0]
    assert a == b and len(a["predictions"]) == n_para and all(r[7] for r in a["predictions"])  # answers kept
    assert {r[1] for r in a["metrics"]} == {"token_f1", "exact_match"}
    assert json.loads(_run_row(demo_copy, theirs)["config"])["protocol"] == "kfold_paraphrase"


def test_bad_text_runs_fail_in_the_worker_with_the_reason_recorded(specialty_db: Path,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    package = _package(specialty_db, "specialty", "mtsamples", tmp_path, "t3")
    runs = tmp_path / "bad.json"
    runs.write_text(json.dumps([{"model": "gpt"}, {"model": "bilstm", "overrides": {"epoch": 1}}]))
    done = _worker(_blocked_env(tmp_path), str(package), "--runs", str(runs), "--out", str(tmp_path / "out"))
    assert done.returncode == 1
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert [r["status"] for r in lines] == ["failed", "failed"]
    assert "unknown text model 'gpt'" in lines[0]["error"] and "unknown text config keys ['epoch']" in lines[1]["error"]
    for line in lines:
        (run_id,) = record_result_package(specialty_db, line["result"], tmp_path / "models")
        assert _run_row(specialty_db, run_id)["status"] == "failed"
