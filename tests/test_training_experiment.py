"""One EHR run end to end (train_in_process: package -> worker -> recorded) on a tiny real DuckDB warehouse:
every ml.* table filled, failures recorded.

The sample tables are written with the samples stage's own schema (migration 0004) and vocab writer; the
cohort is small and learnable (drug D<k> is given exactly when condition C<k> is diagnosed in the visit).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from medtx.store.db import connect, open_warehouse
from medtx.pipeline.steps import train_in_process
from medtx.tasks import get_task

DATASET = "tiny"
N_PATIENTS, N_VISITS, N_CODES = 40, 3, 6


def _drug_rec_rows(seed: int = 0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(N_PATIENTS):
        conds, procs, drugs = [], [], []
        for v in range(N_VISITS):
            ks = sorted(set(rng.choice(N_CODES, size=2, replace=False).tolist()))
            conds.append([f"C{k}" for k in ks])
            procs.append([f"P{rng.integers(3)}"])
            drugs.append([f"D{k}" for k in ks])
            rows.append({
                "dataset": DATASET, "subject_id": s + 1, "hadm_id": 1000 * (s + 1) + v, "visit_index": v,
                "admittime": None, "conditions": [list(c) for c in conds], "procedures": [list(p) for p in procs],
                "drugs_hist": [list(d) for d in drugs[:-1]] + [[]], "drugs": list(drugs[-1]),
            })
    return pl.DataFrame(rows, schema_overrides={"admittime": pl.Datetime})


def _splits(frame: pl.DataFrame) -> pl.DataFrame:
    subjects = sorted(set(frame["subject_id"].to_list()))
    split = ["train"] * 28 + ["val"] * 6 + ["test"] * 6
    return pl.DataFrame({"dataset": DATASET, "task": "drug_rec", "subject_id": subjects, "split": split, "seed": 7})


@pytest.fixture
def tiny_db(tmp_db: Path) -> Path:
    frame = _drug_rec_rows()
    con = connect(tmp_db)
    try:
        con.register("f", frame.to_arrow())
        con.execute("INSERT INTO samples.drug_rec BY NAME SELECT * FROM f")  # prediction_time: NULL (no clock here)
        # hand-made samples have no raw events for the leakage gate to check: record it as passed, as the gate
        # would after a build, so training (which refuses a task without a record) runs
        con.execute("INSERT INTO samples.leakage_gate (dataset, task, status, samples, split_overlap, late_codes, "
                    "shortcuts, acknowledged, message, created_at) VALUES (?, 'drug_rec', 'pass', ?, 0, 0, 0, 0, "
                    "'test fixture: hand-made samples', current_timestamp)", [DATASET, frame.height])
        con.register("sp", _splits(frame).to_arrow())
        con.execute("INSERT INTO samples.splits SELECT * FROM sp")
        train = frame.join(_splits(frame).filter(pl.col("split") == "train").select("subject_id"), on="subject_id")
        for feature in ("conditions", "procedures", "drugs_hist", "drugs"):
            values = train[feature].to_list()
            tokens = sorted({t for v in values for t in (v[-1] if feature != "drugs" else v)})
            rows = [(DATASET, "drug_rec", feature, t, i, 1) for i, t in enumerate(["<pad>", "<unk>", *tokens])]
            con.executemany("INSERT INTO samples.vocab VALUES (?, ?, ?, ?, ?, ?)", rows)
        con.execute("INSERT INTO ref.ddi_atc3 VALUES ('D0', 'D1'), ('D2', 'Z999')")
        # ... of these samples (training refuses samples other than those the gate judged)
        from medtx.tasks import get_task
        from medtx.tasks.leakage import current_fingerprint

        con.execute("UPDATE samples.leakage_gate SET fingerprint = ? WHERE task = 'drug_rec'",
                    [current_fingerprint(con, get_task("drug_rec"), DATASET)])
    finally:
        con.close()
    return tmp_db


def _q(db: Path, sql: str, params=()) -> list[tuple]:
    with open_warehouse(db, read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


@pytest.mark.parametrize("model", ["logreg", "most_frequent", "copy_last"])
def test_baseline_runs_fill_ml_tables(tiny_db: Path, model: str):
    run_id = train_in_process(tiny_db, get_task("drug_rec"), model, 0, dataset=DATASET)
    status, threshold, source, synthetic = _q(
        tiny_db, "SELECT status, threshold, threshold_source, is_synthetic FROM ml.runs WHERE run_id = ?", [run_id])[0]
    assert status == "completed" and not synthetic
    assert source == {"logreg": "tuned_on_val", "most_frequent": "model_rule", "copy_last": "model_rule"}[model]
    metrics = {(m, a): (v, sd, n, lo, hi, ci, sdm) for m, a, v, sd, n, lo, hi, ci, sdm in _q(
        tiny_db, "SELECT metric, averaging, value, sd, n_boot, ci_low, ci_high, ci_method, sd_method FROM ml.metrics "
        "WHERE run_id = ? AND split = 'test'", [run_id])}
    for key in [("pr_auc_samples", "visit"), ("pr_auc_samples", "patient"), ("jaccard_samples", "visit"),
                ("jaccard_samples", "patient"), ("f1_samples", "visit"), ("ddi_rate", "none"),
                ("ddi_rate_true", "none"), ("avg_pred_size", "visit"), ("avg_true_size", "visit")]:
        value, sd, n_boot, lo, hi, ci_method, sd_method = metrics[key]
        # n_boot counts the patient-bootstrap resamples of the 95% interval (issue 14); the 10 x 80% subsample
        # sd stays, named by sd_method.
        assert 0 <= value <= max(1.0, value) and sd is not None and n_boot == 1000, key
        assert lo is not None and lo <= hi and ci_method == "patient_bootstrap_percentile", key
        assert sd_method == "subsample_10x80pct_sd", key
    value, _, n_boot, lo, hi, *_ = metrics[("brier", "visit")]
    assert 0 <= lo <= value <= hi <= 1 and n_boot == 1000
    value, _, n_boot, lo, hi, ci_method, _ = metrics[("ece", "none")]  # a biased bootstrap: no interval, said so
    assert 0 <= value <= 1 and lo is None and hi is None and ci_method == "patient_bootstrap_percentile_withheld_biased"
    n_labels = _q(tiny_db, "SELECT count(*) - 2 FROM samples.vocab WHERE task = 'drug_rec' AND feature = 'drugs'")[0][0]
    n_pred = _q(tiny_db, "SELECT count(*), count(DISTINCT sample_id) FROM ml.predictions WHERE run_id = ?", [run_id])[0]
    assert n_pred == (6 * N_VISITS * n_labels, 6 * N_VISITS)
    if model == "logreg":  # the structure is learnable: LR must nearly solve it
        assert metrics[("jaccard_samples", "visit")][0] > 0.8


def test_a_rerun_under_a_recorded_run_id_is_refused_and_leaves_the_run_as_it_was(tiny_db: Path):
    from medtx.pipeline.exchange import ResultRefused

    train_in_process(tiny_db, get_task("drug_rec"), "most_frequent", dataset=DATASET, run_id="fixed-run")
    first = _q(tiny_db, "SELECT count(*) FROM ml.predictions WHERE run_id = 'fixed-run'")[0][0]
    with pytest.raises(ResultRefused, match="run fixed-run is already in the warehouse"):
        train_in_process(tiny_db, get_task("drug_rec"), "most_frequent", dataset=DATASET, run_id="fixed-run")
    assert _q(tiny_db, "SELECT count(*) FROM ml.predictions WHERE run_id = 'fixed-run'")[0][0] == first > 0
    assert _q(tiny_db, "SELECT count(*) FROM ml.runs WHERE run_id = 'fixed-run'")[0][0] == 1


def test_transformer_run_records_epochs_checkpoints_and_attention(tiny_db: Path, tmp_path: Path):
    overrides = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "batch_size": 16, "lr": 5e-3,
                 "num_threads": 1}
    run_id = train_in_process(tiny_db, get_task("drug_rec"), "transformer", 1,
                              {**overrides, "epochs": 3, "n_showcase": 3}, dataset=DATASET, device="cpu",
                              models_dir=tmp_path / "models")
    status, device, best_epoch, n_params, config = _q(
        tiny_db, "SELECT status, device, best_epoch, n_params, config FROM ml.runs WHERE run_id = ?", [run_id])[0]
    assert status == "completed" and device == "cpu" and 1 <= best_epoch <= 3 and n_params > 0
    assert json.loads(config)["model"]["d_model"] == 16
    assert json.loads(config)["train"]["length_buckets"] == 16  # drug_rec's trainer default for the transformer
    epochs = _q(tiny_db, "SELECT DISTINCT epoch, split, metric FROM ml.epochs WHERE run_id = ?", [run_id])
    assert {(e, s, m) for e, s, m in epochs} >= {(3, "train", "loss"), (3, "val", "loss"), (3, "val", "pr_auc_samples")}
    kinds = dict(_q(tiny_db, "SELECT kind, path FROM ml.models WHERE run_id = ?", [run_id]))
    assert set(kinds) == {"best", "last"}
    assert (Path(kinds["best"]) / "model.safetensors").exists() and (Path(kinds["best"]) / "vocab.json").exists()
    # Attention: stored for 3 showcase samples, every row sums to 1 over keys, tokens are codes.
    sums = _q(tiny_db, """SELECT sample_id, module, layer, head, query_pos, sum(weight), any_value(query_token)
                          FROM ml.attention WHERE run_id = ? GROUP BY ALL""", [run_id])
    assert len({s[0] for s in sums}) == 3 and {s[1] for s in sums} == {"codes"}  # drug_rec: one joint sequence
    assert all(abs(s[5] - 1.0) < 1e-4 for s in sums)
    assert any(":C" in s[6] for s in sums)


def test_a_runs_overrides_win_over_the_tasks_trainer_defaults(tiny_db: Path, tmp_path: Path):
    overrides = {"d_model": 16, "n_heads": 1, "d_ff": 32, "batch_size": 16, "num_threads": 1, "length_buckets": 0}
    run_id = train_in_process(tiny_db, get_task("drug_rec"), "transformer", 1,
                              {**overrides, "epochs": 1, "n_showcase": 1}, dataset=DATASET, device="cpu",
                              models_dir=tmp_path / "models")
    config = json.loads(_q(tiny_db, "SELECT config FROM ml.runs WHERE run_id = ?", [run_id])[0][0])
    assert config["train"]["length_buckets"] == 0


def test_a_tasks_trainer_default_that_is_no_trainer_field_is_named():
    import dataclasses

    from medtx.tasks import get_task
    from medtx.training.runners import ehr as ehr_run

    typo = dataclasses.replace(get_task("drug_rec"), train_defaults={"transformer": {"length_bucket": 16}})
    with pytest.raises(ValueError, match=r"task 'drug_rec': train_defaults for 'transformer' name \['length_bucket'\]"):
        ehr_run.task_train_defaults(typo, "transformer")


def test_failure_is_recorded(tiny_db: Path):
    with pytest.raises(ValueError, match="nothing to train on"):
        train_in_process(tiny_db, get_task("drug_rec"), "logreg", dataset="absent")
    status, error = _q(tiny_db, "SELECT status, error FROM ml.runs WHERE dataset = 'absent'")[0]
    assert status == "failed" and "nothing to train on" in error


def test_cli_train_prints_run_and_metrics(tiny_db: Path):
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["train", "--task", "drug_rec", "--model", "logreg", "--dataset", DATASET,
                                      "--db", str(tiny_db), "--seed", "3", "--set", "C=0.5"])
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip().splitlines()[-1]
    seed, config = _q(tiny_db, "SELECT seed, config FROM ml.runs WHERE run_id = ?", [run_id])[0]
    assert seed == 3 and json.loads(config)["C"] == 0.5
    import re  # the default display is the 95% patient-bootstrap interval, not the subsample sd

    assert re.search(r"pr_auc_samples .*\d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\]", result.output), result.output
    assert "±" not in result.output
    bad = CliRunner().invoke(app, ["train", "--task", "drug_rec", "--model", "nope", "--dataset", DATASET,
                                   "--db", str(tiny_db)])
    assert bad.exit_code == 1 and "nope" in bad.output


def test_ehr_runs_follow_the_one_checkpoint_rule(tiny_db: Path, monkeypatch: pytest.MonkeyPatch):
    """Without models_dir an EHR run's checkpoints go where a text run's go (`runs.settings_run_folder`: here
    MEDTX_MODELS_DIR, not the warehouse's folder), and BEHRT's pre-trained checkpoint is recorded with the run's
    other results (one transaction, at the end)."""
    from medtx.training.runs import settings_run_folder

    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tiny_db.parent / "checkpoints"))
    run_id = train_in_process(tiny_db, get_task("drug_rec"), "behrt", 0,
                              {"d_model": 16, "n_layers": 1, "n_heads": 2, "epochs": 1}, dataset=DATASET, device="cpu")
    rows = dict((k, (p, m)) for k, p, m in _q(tiny_db, "SELECT kind, path, metric FROM ml.models WHERE run_id = ?",
                                               [run_id]))
    assert set(rows) == {"pretrained", "best", "last"}
    folder = settings_run_folder(tiny_db, run_id)
    assert folder == tiny_db.parent / "checkpoints" / run_id
    assert all(Path(path).is_relative_to(folder) for path, _ in rows.values())
    assert rows["pretrained"][1] == "mlm_loss" and rows["best"][1] == "pr_auc_samples"
    assert _q(tiny_db, "SELECT status, device FROM ml.runs WHERE run_id = ?", [run_id])[0] == ("completed", "cpu")
