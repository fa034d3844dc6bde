"""benchmarks/results_text.py: the text section shows each run's point estimate with its 95% bootstrap interval
and the paired verdicts against the reference baseline (ml.comparisons), not the retired mean ± sd of 10×80%
subsample means; runs without an interval (older warehouses) still render, marked."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.results_text import write_section
from benchmarks.results_text_render import readmission_table, specialty_table
from medtx.store.db import connect, load_migrations, migrate
from medtx.training import records

CLASSES = ["a", "b", "c"]
N_NOTES = 80  # 40 text groups of 2 notes: enough units (>= 30) for a verdict


def _specialty_run(con, run_id: str, model: str, seed: int, pred: np.ndarray | None, y: np.ndarray,
                   config: dict | None = None) -> None:
    """One specialty run through the recording API (intervals and comparisons are computed on finish);
    `pred=None`: metrics only, no stored predictions (so no interval, no comparison)."""
    records.start_run(con, run_id, task="specialty", model=model, dataset="mtsamples", seed=seed,
                      config={"text": config or {}})
    records.write_metrics(con, run_id, "test", [(m, "none", 0.5, 0.02, 10) for m in ("accuracy", "macro_f1",
                                                                                        "weighted_f1")])
    if pred is not None:
        records.write_predictions(con, run_id, pl.DataFrame({
            "sample_id": np.repeat(np.arange(N_NOTES).astype(str), 3), "label": CLASSES * N_NOTES,
            "prob": np.full(3 * N_NOTES, 1 / 3), "y_true": np.repeat(y, 3) == np.tile(np.arange(3), N_NOTES),
            "predicted": np.repeat(pred, 3) == np.tile(np.arange(3), N_NOTES)}))
    records.finish_run(con, run_id, collapsed=model == "majority")


def _faq_run(con, run_id: str, model: str, f1: np.ndarray, config: dict) -> None:
    records.start_run(con, run_id, task="faq", model=model, dataset="mental_health_faq", seed=0, config=config)
    records.write_metrics(con, run_id, "test", [("token_f1", "none", float(f1.mean()), 0.01, 10),
                                                ("exact_match", "none", float((f1 > 0.9).mean()), 0.01, 10)])
    records.write_predictions(con, run_id, pl.DataFrame({
        "sample_id": np.arange(len(f1)).astype(str), "label": ["answer"] * len(f1), "prob": f1,
        "y_true": f1 > 0.9, "predicted": f1 > 0.9}))
    records.finish_run(con, run_id)


def _build(db: Path) -> None:
    rng = np.random.default_rng(7)
    y = rng.integers(0, 3, N_NOTES)
    noisy = np.where(rng.random(N_NOTES) < 0.6, y, (y + 1) % 3)
    con = connect(db)
    try:
        notes = pl.DataFrame({"note_id": np.arange(N_NOTES), "text": ["t"] * N_NOTES,
                              "label": [CLASSES[i] for i in y], "group_id": np.arange(N_NOTES) // 2,
                              "split": ["test"] * N_NOTES, "conflicting": [False] * N_NOTES})
        con.register("notes", notes.to_arrow())
        con.execute("INSERT INTO samples.specialty SELECT * FROM notes")
        for seed in (0, 1, 2):  # the reference (first of NON_NEURAL's order among the text baselines)
            _specialty_run(con, f"tfidf.s{seed}", "tfidf_logreg", seed, noisy, y)
        for seed in (0, 1, 2):
            _specialty_run(con, f"majority.s{seed}", "majority", seed, np.zeros(N_NOTES, dtype=int), y)
            _specialty_run(con, f"bilstm.s{seed}", "bilstm", seed, y, y)  # perfect: better on every seed
        probe = {"freeze_encoder": True}
        _specialty_run(con, "minilm.s0", "minilm", 0, y, y, probe)  # seeds disagree
        _specialty_run(con, "minilm.s1", "minilm", 1, np.zeros(N_NOTES, dtype=int), y, probe)
        _specialty_run(con, "bert.s0", "bert_scratch", 0, None, y)  # no predictions: no interval
        f1 = rng.random(50)
        _faq_run(con, "faq.tfidf", "retrieval", f1, {"faq": {"embedding": "tfidf"}})
        _faq_run(con, "faq.s2s", "seq2seq", f1 * 0.2, {"faq": {}})
    finally:
        con.close()


def _row(section: str, start: str) -> str:
    return next(line for line in section.splitlines() if line.startswith(start))


def test_text_section_shows_intervals_and_paired_verdicts(tmp_db: Path, tmp_path: Path):
    _build(tmp_db)
    out = tmp_path / "RESULTS.md"
    out.write_text("# results\n\n<!-- BEGIN text -->\nold table\n<!-- END text -->\n\n<!-- BEGIN ehr -->\nehr\n"
                   "<!-- END ehr -->\n")
    section = write_section(tmp_db, out)
    text = out.read_text()
    assert "old table" not in text and "\nehr\n" in text and text.count("<!-- BEGIN text -->") == 1
    ci = r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]"  # point estimate [95% CI]
    # The retired display is gone: per run, the point estimate with its interval; the subsample sd only named.
    assert "per-run bootstrap means" not in section and "mean ± sd over 10 resamples" not in section
    assert re.search(rf"^\| tfidf_logreg \| 0 \| {ci} \| {ci} \| {ci} \|", section, re.M)
    assert re.search(rf"^\| retrieval \(tfidf\) \| 0 \| {ci} \| {ci} \| — \(the reference\) \|", section, re.M)
    assert "10×80% subsample sd of macro-F1" in section
    # The intro says which interval, read from the data, over how many units.
    assert "`text_group_bootstrap_percentile`" in section and "`pair_bootstrap_percentile`" in section  # own units
    assert "patient_bootstrap" not in section
    assert "1,000 resamples with replacement over the 40 text groups" in section
    assert "over the 50 pairs" in section
    # Verdicts per seed from ml.comparisons, with the all-seeds-agree rule.
    assert re.search(r"^- bilstm − tfidf_logreg, macro-F1: s0 \+\d\.\d{4} \[.*better; s1 .*better; s2 .*better "
                     r"→ \*\*bilstm beats tfidf_logreg\*\*\.$", section, re.M)
    assert "- majority − tfidf_logreg, accuracy:" in section and "→ majority is worse than tfidf_logreg." in section
    probe = _row(section, "- minilm, frozen encoder + linear probe (not fine-tuned) − tfidf_logreg, macro-F1:")
    assert probe.endswith("→ seeds disagree: no claim.")
    assert "- seq2seq (word-level Transformer) − retrieval (tfidf), token F1: s0 " in section
    assert "not yet a claim (needs 3 agreeing seeds)" in section  # one FAQ seed is not a claim
    assert "- tfidf_logreg − tfidf_logreg" not in section  # the reference's own seeds are no claim
    # A run without an interval still renders, marked, and without a comparison.
    bert = _row(section, "| bert_scratch | 0 |")
    assert "no interval recorded" in bert and "no comparison recorded" in bert
    assert "1 run(s) have no interval recorded" in section and "bert_scratch s0" in section
    assert "s0 no comparison recorded" in _row(section, "- bert_scratch − tfidf_logreg, macro-F1:")


def test_old_warehouse_without_interval_columns_renders(tmp_db: Path):
    """A warehouse recorded before migration 0011 (no ci_* columns, no ml.comparisons) renders, marked."""
    con = connect(tmp_db, migrate_schema=False)
    try:
        migrate(con, [m for m in load_migrations() if m.version < 11])
        for seed in (0, 1):
            con.execute("INSERT INTO ml.runs (run_id, task, model, status, config, seed, dataset, started_at) "
                        "VALUES (?, 'specialty', 'tfidf_logreg', 'completed', '{\"text\": {}}', ?, 'mtsamples', "
                        "now())", [f"old.s{seed}", seed])
            con.execute("INSERT INTO ml.metrics VALUES (?, 'test', 'macro_f1', 'none', ?, 0.004, 10)",
                        [f"old.s{seed}", 0.41 + seed / 50])
    finally:
        con.close()
    con = connect(tmp_db, read_only=True)
    try:
        section = "\n".join(specialty_table(con))
        assert readmission_table(con) == []  # no readmission runs: no table, no crash
    finally:
        con.close()
    assert "| tfidf_logreg | 2 | — | 0.420 ± 0.014 |" in section
    assert "| tfidf_logreg | 0 | — | 0.410 (no interval recorded) |" in section
    assert "No run of this table has an interval recorded" in section
    assert "No paired comparisons stored for specialty" in section


def test_empty_warehouse_renders(tmp_db: Path, tmp_path: Path):
    connect(tmp_db).close()  # migrated, no runs
    section = write_section(tmp_db, tmp_path / "RESULTS.md", readmission_db=tmp_db)
    assert section.count("No completed runs recorded yet.") == 2  # specialty and FAQ; no readmission table
    assert "30-day readmission" not in section


def _binary_run(con, run_id: str, task: str, model: str, dataset: str, n: int = 60) -> None:
    rng = np.random.default_rng(len(run_id))
    y = rng.random(n) < 0.3
    records.start_run(con, run_id, task=task, model=model, dataset=dataset, seed=42, config={})
    records.write_metrics(con, run_id, "test", [("auroc", "none", 0.5, 0.01, 10)])
    records.write_predictions(con, run_id, pl.DataFrame({
        "sample_id": np.arange(n).astype(str), "subject_id": np.arange(n), "hadm_id": np.arange(n),
        "label": ["readmission"] * n, "prob": rng.random(n), "y_true": y, "predicted": y}))
    records.finish_run(con, run_id)


def test_readmission_table_keeps_only_the_cohorts_with_note_runs(tmp_db: Path):
    """A pipeline warehouse also holds EHR readmission runs of a cohort without notes (the MIMIC-III demo):
    they are not pooled into the notes comparison."""
    con = connect(tmp_db)
    try:
        _binary_run(con, "notes.tfidf", "readmission_notes", "tfidf_logreg", "synth_2000")
        _binary_run(con, "codes.lr", "readmission", "logreg", "synth_2000")
        _binary_run(con, "demo.lr", "readmission", "logreg", "mimic3_demo")
        table = "\n".join(readmission_table(con))
    finally:
        con.close()
    assert "`synth_2000`" in table and "mimic3_demo" not in table
    assert len([line for line in table.splitlines() if line.startswith("| readmission | logreg | 42 |")]) == 1
