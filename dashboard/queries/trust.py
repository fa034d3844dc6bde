"""Dashboard queries: a run's subgroups, calibration before/after recalibration and operating points (the
ml.* tables of migration 0018; rules every query keeps: dashboard.queries.core). A snapshot published before
those tables existed answers with empty frames (`query`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from dashboard.queries.core import query


def subgroups(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(snapshot, "SELECT attribute, grp, metric, averaging, n_patients, n_samples, n_positives, too_small, "
                           "value, ci_low, ci_high, diff, diff_ci_low, diff_ci_high, verdict, reference_run_id "
                           "FROM ml.subgroups WHERE run_id = ? ORDER BY attribute, grp, metric", [run_id])


def subgroup_gaps(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(snapshot, "SELECT attribute, metric, group_high, group_low, gap, ci_low, ci_high, detected, largest "
                           "FROM ml.subgroup_gaps WHERE run_id = ? ORDER BY metric, gap DESC", [run_id])


def calibration(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(snapshot, "SELECT method, metric, value, ci_low, ci_high, n_fit FROM ml.calibration "
                           "WHERE run_id = ? ORDER BY method, metric", [run_id])


def reliability(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(snapshot, "SELECT method, bin, n, mean_pred, observed, ci_low, ci_high FROM ml.reliability "
                           "WHERE run_id = ? ORDER BY method, bin", [run_id])


def operating_points(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(snapshot, "SELECT target, threshold, metric, value, ci_low, ci_high, val_value "
                           "FROM ml.operating_points WHERE run_id = ? ORDER BY target, threshold, metric", [run_id])


def operating_targets(snapshot: Path, run_id: str) -> pl.DataFrame:
    """Each named target chosen on validation or unreachable, with its reason (migration 0019)."""
    return query(snapshot, "SELECT target, status, reason, threshold, val_alerts FROM ml.operating_targets "
                           "WHERE run_id = ? ORDER BY target", [run_id])


def decision_curve(snapshot: Path, run_id: str) -> pl.DataFrame:
    return query(snapshot, "SELECT threshold, net_benefit, ci_low, ci_high, treat_all FROM ml.decision_curve "
                           "WHERE run_id = ? ORDER BY threshold", [run_id])
