"""The rules every run family shares (medtx/training/runs.py): synthetic datasets, checkpoint folders, attention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from medtx.store.db import connect
from medtx.training.runs import attention_frame, is_synthetic, run_folder


def test_a_dataset_is_synthetic_by_name_or_by_its_oracle_rows(tmp_db: Path):
    con = connect(tmp_db)
    try:
        assert is_synthetic(con, "synth_2000") and not is_synthetic(con, "mimic3_demo")
        con.execute("INSERT INTO raw.synth_oracle_readmission (dataset, hadm_id, prob) VALUES ('cohort_b', 1, 0.2)")
        assert is_synthetic(con, "cohort_b")  # generated, under a name that does not say so
        con.execute("INSERT INTO raw.synth_oracle_drug_rec (dataset, hadm_id, atc3, prob) "
                    "VALUES ('cohort_c', 1, 'A01A', 0.5)")
        assert is_synthetic(con, "cohort_c")  # any task's oracle rows count
        assert not is_synthetic(con, "mimic3_demo")
    finally:
        con.close()


def test_one_checkpoint_folder_rule(tmp_path: Path):
    assert run_folder(tmp_path, "drug_rec.gru.s42") == tmp_path / "drug_rec.gru.s42"
    assert run_folder(str(tmp_path), "r1") == tmp_path / "r1"


def test_attention_frame_keeps_the_end_that_matters_and_rejects_others():
    weights = np.arange(2 * 1 * 3 * 3, dtype=np.float32).reshape(2, 1, 3, 3)  # 2 layers, 1 head, 3 x 3
    rows = [{"codes": (weights, ["a", "b", "c"], ["x", "y", "z"])}]
    import polars as pl

    last = pl.from_arrow(attention_frame([7], rows, max_tokens=2, keep="last"))  # an Arrow table (pure training path)
    first = pl.from_arrow(attention_frame([7], rows, max_tokens=2, keep="first"))
    assert last.height == first.height == 2 * 2 * 2
    assert set(last["query_token"]) == {"b", "c"} and set(last["key_token"]) == {"y", "z"}
    assert set(first["query_token"]) == {"a", "b"} and set(first["key_token"]) == {"x", "y"}
    row = last.filter((last["layer"] == 1) & (last["query_pos"] == 0) & (last["key_pos"] == 1))
    assert row["weight"].to_list() == [float(weights[1, 0, 1, 2])] and row["sample_id"].to_list() == ["7"]
    with pytest.raises(ValueError, match="keep must be"):
        attention_frame([7], rows, max_tokens=2, keep="middle")
    assert attention_frame([], [], max_tokens=2).num_rows == 0


def test_settings_run_folder_defaults_to_the_settings_models_folder(tmp_path: Path):
    from medtx.settings import get_settings
    from medtx.training.runs import settings_run_folder

    db = tmp_path / "warehouse.duckdb"
    assert settings_run_folder(db, "r1") == run_folder(get_settings(db=db).models_dir, "r1")
    assert settings_run_folder(db, "r1", tmp_path / "elsewhere") == tmp_path / "elsewhere" / "r1"


def test_record_results_is_one_transaction(tmp_db: Path):
    """A run's results land together or not at all: a writer failing half-way leaves no metric behind and the
    run still `running` (the runner then marks it failed)."""
    import polars as pl

    from medtx.training import records

    con = connect(tmp_db)
    try:
        records.start_run(con, "r1", task="specialty", model="majority", dataset="mtsamples", seed=0, config={})
        broken = records.RunResults(metrics={"test": [("accuracy", "none", 0.5, 0.01, 10)]},
                                    predictions=pl.DataFrame({"sample_id": ["1"]}))  # lacks label, prob
        with pytest.raises(ValueError, match="lacks columns"):
            records.record_results(con, "r1", broken)
        assert con.execute("SELECT count(*) FROM ml.metrics WHERE run_id = 'r1'").fetchone()[0] == 0
        assert con.execute("SELECT status FROM ml.runs WHERE run_id = 'r1'").fetchone()[0] == "running"
        records.write_metrics(con, "r1", "val", [("accuracy", "none", 0.4, None, None)])  # writers work again alone
        assert con.execute("SELECT count(*) FROM ml.metrics WHERE run_id = 'r1'").fetchone()[0] == 1
    finally:
        con.close()
