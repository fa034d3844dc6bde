"""FAQ QA: token F1 / exact match, and real k-fold runs (retrieval, tiny seq2seq) on the bundled FAQ."""

from __future__ import annotations

import polars as pl
import pytest

from medtx.store.db import connect
from medtx.tasks import get_task
from medtx.training.runners.faq import exact_match, token_f1
from tests.conftest import DATA


def test_token_f1_and_exact_match():
    assert token_f1("Mental illness is common.", "mental illness is common") == 1.0
    assert exact_match("Mental illness is common.", "mental illness is common") == 1.0
    assert token_f1("illness common", "mental illness is common") == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert token_f1("nothing shared", "mental illness") == 0.0
    assert exact_match("mental", "mental illness") == 0.0


@pytest.fixture
def faq_db(tmp_db):
    from medtx.tasks import BuildContext, get_task

    con = connect(tmp_db)
    get_task("faq").lineage.build(con, BuildContext("mental_health_faq", DATA, seed=0, fractions=(), k_folds=5))
    con.close()
    return tmp_db


def test_retrieval_and_seq2seq_runs(faq_db, tmp_path, monkeypatch):
    from medtx.pipeline.steps import train_in_process

    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    retrieval = train_in_process(faq_db, get_task("faq"), "retrieval", 0)
    seq2seq = train_in_process(faq_db, get_task("faq"), "seq2seq", 0,
                               {"epochs": 1, "d_model": 16, "n_heads": 2, "layers": 1, "max_answer": 8})
    con = connect(faq_db, read_only=True)
    try:
        m = {(r, k): v for r, k, v in con.sql("SELECT run_id, metric, value FROM ml.metrics").fetchall()}
        n_para = con.sql("SELECT count(*) FROM samples.faq WHERE paraphrase IS NOT NULL").fetchall()[0][0]
        for run_id in (retrieval, seq2seq):
            assert con.execute("SELECT count(*) FROM ml.predictions WHERE run_id = ?", [run_id]).fetchall()[0][0] == n_para
        status = dict(con.sql("SELECT model, status FROM ml.runs").fetchall())
    finally:
        con.close()
    assert status == {"retrieval": "completed", "seq2seq": "completed"}
    # Nearest-question retrieval finds the right pair for most reworded questions.
    assert m[(retrieval, "exact_match")] > 0.2 and m[(retrieval, "token_f1")] >= m[(retrieval, "exact_match")]
    assert 0.0 <= m[(seq2seq, "token_f1")] < 1.0  # one epoch of a tiny model cannot reproduce answers


def test_faq_unknown_model_and_keys(faq_db):
    from medtx.pipeline.steps import train_in_process

    with pytest.raises(ValueError, match="unknown FAQ model"):
        train_in_process(faq_db, get_task("faq"), "gpt")
    with pytest.raises(ValueError, match="unknown FAQ config keys"):
        train_in_process(faq_db, get_task("faq"), "retrieval", 0, {"epoch": 1})
