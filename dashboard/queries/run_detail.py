"""Dashboard queries: run detail (the rules every query keeps: dashboard.queries.core)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from dashboard.queries.core import _mart_sql, query


def runs_index(snapshot: Path) -> pl.DataFrame:
    """All runs for the run selector."""
    return query(
        snapshot,
        "SELECT run_id, task, model, coalesce(dataset, '') AS dataset, seed, status, started_at "
        "FROM ml.runs ORDER BY started_at DESC",
    )


def default_run(snapshot: Path) -> str | None:
    """The run a reader most likely wants first: of the latest pipeline run's completed runs, one whose page has
    the patient-level figures (subgroups, calibration, standard figures: a binary or multi-label EHR run) before a
    text run's, then the largest test set (then the newest); runs outside any pipeline run come after, so a
    5-patient demo run trained by hand is not the first view."""
    df = query(
        snapshot,
        "SELECT r.run_id FROM ml.runs r LEFT JOIN ml.pipeline_runs p USING (pipeline_run_id) "
        "WHERE r.status = 'completed' ORDER BY p.started_at DESC NULLS LAST, "
        "EXISTS (SELECT 1 FROM ml.subgroups s WHERE s.run_id = r.run_id) DESC, r.n_test_units DESC NULLS LAST, "
        "r.started_at DESC LIMIT 1",
    )
    return df["run_id"][0] if df.height else None


def run(snapshot: Path, run_id: str) -> dict | None:
    df = query(snapshot, "SELECT * FROM ml.runs WHERE run_id = ?", [run_id])
    return df.row(0, named=True) if df.height else None


def run_epochs(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(
        snapshot,
        "SELECT epoch, split, metric, value FROM ml.epochs WHERE run_id = ? ORDER BY metric, split, epoch",
        [run_id],
    )


def run_metrics(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(
        snapshot,
        # n_boot counts the interval's resamples; the sd is the SafeDrug convention's (10 subsamples of 80%), named
        "SELECT split, metric, averaging, value, ci_low, ci_high, n_boot, ci_method, sd AS safedrug_sd FROM ml.metrics "
        "WHERE run_id = ? "
        "ORDER BY split, metric, averaging",
        [run_id],
    )


def run_label_metrics(snapshot: Path, run_id: str, split: str = "test") -> pl.DataFrame:
    return query(
        snapshot,
        "SELECT label, metric, value, support FROM ml.label_metrics WHERE run_id = ? AND split = ? "
        "ORDER BY support DESC NULLS LAST, label",
        [run_id, split],
    )


def run_confusion(snapshot: Path, run_id: str, split: str = "test") -> pl.DataFrame:
    return query(
        snapshot,
        "SELECT true_label, pred_label, n FROM ml.confusion WHERE run_id = ? AND split = ?",
        [run_id, split],
    )


def run_calibration(snapshot: Path, run_id: str) -> pl.DataFrame:
    """Reliability diagram: predicted probability vs observed frequency, pooled over labels (10 bins)."""
    return query(
        snapshot,
        f"SELECT bin, mean_prob, observed, n FROM {_mart_sql(snapshot, 'calibration')} WHERE run_id = ? ORDER BY bin",
        [run_id],
    )
