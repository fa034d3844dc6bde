"""Dashboard queries: leaderboard (the rules every query keeps: dashboard.queries.core)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from dashboard.queries.core import _mart_sql, _scalar, query


def task_datasets(snapshot: Path) -> pl.DataFrame:
    """(task, dataset, runs, n_test_units) with at least one run, for the selectors; n_test_units is the most
    test patients (text groups, FAQ pairs) any run of the dataset was evaluated on (NULL for runs recorded before test sizes were kept)."""
    return query(
        snapshot,
        "SELECT r.task, coalesce(r.dataset, '') AS dataset, count(*) AS runs, max(t.n_test_units) AS n_test_units "
        f"FROM ml.runs r LEFT JOIN {_mart_sql(snapshot, 'test_sizes')} t ON t.run_id = r.run_id "
        "GROUP BY ALL ORDER BY r.task, dataset",
    )


def averaging_options(snapshot: Path, task: str, dataset: str) -> list[str]:
    """Metric conventions present for a task ('visit', 'patient'), besides 'none'."""
    df = query(
        snapshot,
        "SELECT DISTINCT m.averaging FROM ml.metrics m JOIN ml.runs r USING (run_id) "
        "WHERE r.task = ? AND coalesce(r.dataset, '') = ? AND m.split = 'test' AND m.averaging <> 'none' "
        "ORDER BY 1 DESC",
        [task, dataset],
    )
    return df.to_series().to_list() if df.height else []


# How a run used its model when one model name covers several trainings (the text encoders: a frozen encoder with a
# linear probe vs fine-tuning the top K layers; a run on a GPU, recorded from benchmarks/gpu), so that the
# leaderboard never shows them as the same thing (nor pools a GPU run's seed with CPU runs' seeds); a run imported
# from another tool's predictions (medtx.meds.import_predictions) says "trained outside medtx" beside its name.
RUN_VARIANT_SQL = """nullif(concat_ws(', ', CASE
    WHEN json_extract_string(config, '$.text.freeze_encoder') = 'true' THEN 'frozen encoder + linear probe'
    WHEN json_extract_string(config, '$.text.finetune_layers') IS NOT NULL
        THEN 'top ' || json_extract_string(config, '$.text.finetune_layers') || ' layers fine-tuned'
    END, CASE WHEN device LIKE 'cuda%' THEN 'on ' || device END, json_extract_string(config, '$.origin')), '')"""


def leaderboard_runs(snapshot: Path, task: str, dataset: str) -> pl.DataFrame:
    """Every run of a task on a dataset, newest first; interrupted runs (owner killed) are not results."""
    return query(
        snapshot,
        "SELECT run_id, model, " + RUN_VARIANT_SQL + " AS variant, seed, status, is_synthetic, collapsed, "
        "collapse_reason, threshold, threshold_source, n_params, best_epoch, train_seconds, started_at, error "
        "FROM ml.runs WHERE task = ? AND coalesce(dataset, '') = ? AND status <> 'interrupted'"
        " ORDER BY started_at DESC",
        [task, dataset],
    )


def leaderboard_metrics(snapshot: Path, task: str, dataset: str, averaging: str | None) -> pl.DataFrame:
    """Test metrics of those runs in one averaging convention (plus convention-free ones): value, the SafeDrug
    subsample sd, the 95% patient-bootstrap interval, and the paired verdict against the reference baseline."""
    return query(
        snapshot,
        "SELECT run_id, metric, value, sd, ci_low, ci_high, reference_run_id, diff, diff_low, diff_high, p_better, "
        f"verdict FROM {_mart_sql(snapshot, 'leaderboard')} WHERE task = ? AND dataset = ? "
        "AND (averaging = 'none' OR averaging = ?)",
        [task, dataset, averaging or "none"],
    )


def leaderboard_sizes(snapshot: Path, task: str, dataset: str) -> pl.DataFrame:
    """(run_id, n_test_units, n_test_samples) of the runs of a task on a dataset."""
    return query(
        snapshot,
        f"SELECT run_id, n_test_units, n_test_samples FROM {_mart_sql(snapshot, 'test_sizes')} "
        "WHERE task = ? AND dataset = ?",
        [task, dataset],
    )


def leaderboard_trust(snapshot: Path, task: str, dataset: str) -> pl.DataFrame:
    """Per run of a task on a dataset: its calibration slope (before recalibration) with its interval, and the
    largest subgroup gap of each metric (ml.subgroup_gaps rows marked `largest`)."""
    return query(
        snapshot,
        "SELECT r.run_id, c.value AS slope, c.ci_low AS slope_low, c.ci_high AS slope_high, g.metric AS gap_metric, "
        "g.attribute AS gap_attribute, g.group_high, g.group_low, g.gap, g.ci_low AS gap_low, g.ci_high AS gap_high, "
        "g.detected FROM ml.runs r "
        "LEFT JOIN ml.calibration c ON c.run_id = r.run_id AND c.method = 'none' AND c.metric = 'slope' "
        "LEFT JOIN ml.subgroup_gaps g ON g.run_id = r.run_id AND g.largest "
        "WHERE r.task = ? AND coalesce(r.dataset, '') = ? ORDER BY r.run_id, g.metric",
        [task, dataset],
    )


def run_comparisons(snapshot: Path, run_id: str) -> pl.DataFrame:
    """The run's paired comparisons against its reference baseline, with the resampled differences."""
    return query(
        snapshot,
        "SELECT c.reference_run_id, r.model AS reference_model, c.metric, c.averaging, c.diff, c.ci_low, c.ci_high, "
        "c.p_better, c.verdict, c.n_units, c.n_boot, c.diffs FROM ml.comparisons c "
        "LEFT JOIN ml.runs r ON r.run_id = c.reference_run_id WHERE c.run_id = ? ORDER BY c.metric",
        [run_id],
    )


def default_leaderboard_dataset(snapshot: Path, task: str) -> str | None:
    """Of the datasets with runs of `task`, the one with the most test patients (then most runs, then name):
    the one where models can be told apart, not a demo with five test visits."""
    df = query(
        snapshot,
        "SELECT r.dataset FROM (SELECT coalesce(dataset, '') AS dataset, count(*) AS runs FROM ml.runs "
        "WHERE task = ? GROUP BY 1) r LEFT JOIN (SELECT dataset, count(DISTINCT subject_id) AS n FROM samples.splits "
        "WHERE task = ? AND split = 'test' GROUP BY 1) t USING (dataset) "
        "ORDER BY coalesce(t.n, 0) DESC, r.runs DESC, r.dataset LIMIT 1",
        [task, task],
    )
    return _scalar(df)
