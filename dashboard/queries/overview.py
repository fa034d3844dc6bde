"""Dashboard queries: datasets and overview (the rules every query keeps: dashboard.queries.core)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from dashboard.queries.core import _mart_sql, query
from medtx.tasks import all_tasks


def datasets(snapshot: Path) -> list[str]:
    """Every dataset with raw data or runs: EHR cohorts (with raw tables) first, then the others, each sorted."""
    found: dict[str, set[str]] = {}
    for kind, sql in (
        ("ehr", "SELECT DISTINCT dataset FROM raw.patients"),
        ("runs", "SELECT DISTINCT dataset FROM ml.runs WHERE dataset IS NOT NULL"),
    ):
        df = query(snapshot, sql)
        found[kind] = {v for v in df.to_series() if v} if df.height else set()
    return sorted(found["ehr"]) + sorted(found["runs"] - found["ehr"])


def cohort_counts(snapshot: Path) -> pl.DataFrame:
    """Patients, admissions, diagnoses, procedures and prescriptions per dataset."""
    df = query(snapshot, f"SELECT dataset, table_name, n FROM {_mart_sql(snapshot, 'cohort_counts')} "
               "ORDER BY dataset, table_name")
    if not df.height:
        return pl.DataFrame()
    return df.pivot(on="table_name", index="dataset", values="n").sort("dataset")


def sample_counts(snapshot: Path, dataset: str) -> pl.DataFrame:
    """Samples per task and split for one EHR dataset, plus the text-corpus tasks (MTSamples specialty)."""
    df = query(
        snapshot,
        f"SELECT task, split, n FROM {_mart_sql(snapshot, 'sample_counts')} "
        "WHERE dataset = ? OR list_contains(?, task) ORDER BY task, split",
        [dataset, [t.name for t in all_tasks() if t.samples.split_unit == "text_group"]],  # one corpus, no EHR dataset
    )
    return df.with_columns(pl.col("n").cast(pl.Int64)) if df.height else pl.DataFrame()


def leakage_gates(snapshot: Path, dataset: str) -> pl.DataFrame:
    """The leakage gate's verdict of every task of one dataset (medtx.tasks.leakage): status, the checks' counts,
    the flagged features and its one-line message."""
    return query(
        snapshot,
        "SELECT task, status, samples, split_overlap, late_codes, shortcuts, acknowledged, flagged, message "
        f"FROM {_mart_sql(snapshot, 'leakage_gate')} WHERE dataset = ? ORDER BY task",
        [dataset],
    )


def leakage_gate(snapshot: Path, task: str, dataset: str) -> dict | None:
    """One (task, dataset)'s gate verdict as a dict, or None when the gate has no record of it."""
    df = query(snapshot, "SELECT status, message, flagged FROM "
               f"{_mart_sql(snapshot, 'leakage_gate')} WHERE task = ? AND dataset = ?", [task, dataset])
    return df.to_dicts()[0] if df.height else None


def ingest_rejects(snapshot: Path, dataset: str) -> pl.DataFrame:
    """Rejected source rows (DuckDB CSV rejects) per table, error type and column."""
    return query(
        snapshot,
        "SELECT table_name, error_type AS reason, column_name, count(*) AS n, min(line) AS first_line "
        "FROM raw.ingest_rejects WHERE dataset = ? GROUP BY ALL ORDER BY n DESC, table_name, reason",
        [dataset],
    )


def ingest_checks(snapshot: Path, dataset: str) -> pl.DataFrame:
    """The plausibility rules that found rows at the dataset's latest ingest: table, rule, what it says, rows,
    policy and what it did (kept / moved to raw.ingest_rejects), one example (medtx.ingest.plausibility)."""
    return query(
        snapshot,
        "SELECT table_name, rule, says, n_rows, policy, action, example, checked_at "
        f"FROM {_mart_sql(snapshot, 'ingest_checks')} WHERE dataset = ? ORDER BY table_name, rule",
        [dataset],
    )


def ingest_log(snapshot: Path, dataset: str) -> pl.DataFrame:
    """The latest ingest of each table of a dataset: rows loaded and rejected."""
    return query(
        snapshot,
        "SELECT table_name, status, rows_loaded, rows_rejected, finished_at FROM raw.ingest_log "
        "WHERE dataset = ? QUALIFY row_number() OVER (PARTITION BY table_name ORDER BY finished_at DESC) = 1 "
        "ORDER BY table_name",
        [dataset],
    )


def meds_codes(snapshot: Path, dataset: str) -> pl.DataFrame:
    """A MEDS import's codes per prefix: the raw table they went to (empty: not mapped), codes and rows."""
    return query(
        snapshot,
        "SELECT prefix, coalesce(target_table, '(not mapped)') AS loaded_into, n_codes, n_rows FROM raw.meds_codes "
        "WHERE dataset = ? ORDER BY target_table IS NULL DESC, n_rows DESC",
        [dataset],
    )


def mapping_coverage(snapshot: Path, dataset: str) -> pl.DataFrame:
    """NDC -> ATC-3 coverage by route (rxcui, ndc, name, unmapped, mapped, no_ndc)."""
    return query(
        snapshot,
        "SELECT route, n_ndc, n_rows, pct_rows FROM core.mapping_coverage "
        "WHERE dataset = ? AND kind = 'route' ORDER BY n_rows DESC",
        [dataset],
    )


def top_unmapped_drugs(snapshot: Path, dataset: str, limit: int = 15) -> pl.DataFrame:
    """The NDCs no route mapped, by prescription rows, with their drug names."""
    return query(
        snapshot,
        "SELECT ndc, drug, n_rows AS prescriptions, rank FROM core.mapping_coverage "
        "WHERE dataset = ? AND kind = 'unmapped_ndc' ORDER BY rank, n_rows DESC LIMIT ?",
        [dataset, limit],
    )


def last_pipeline_run(snapshot: Path) -> dict | None:
    df = query(
        snapshot,
        "SELECT pipeline_run_id, status, started_at, finished_at, error FROM ml.pipeline_runs "
        "ORDER BY started_at DESC LIMIT 1",
    )
    return df.row(0, named=True) if df.height else None


def pipeline_steps(snapshot: Path, pipeline_run_id: str) -> pl.DataFrame:
    """The steps of one pipeline run with their state (completed, cached, failed, skipped)."""
    return query(
        snapshot,
        "SELECT step, kind, dataset, task, model, state, round(seconds, 1) AS seconds, error "
        "FROM ml.pipeline_steps WHERE pipeline_run_id = ? ORDER BY finished_at, step",
        [pipeline_run_id],
    )


def pipeline_progress(snapshot: Path, pipeline_run_id: str) -> pl.DataFrame:
    """Every planned step of one run (ml.pipeline_plan) with its finished state, if any, in plan order."""
    return query(
        snapshot,
        "SELECT p.step, p.kind, p.expected_seconds, p.started_at, s.state, s.seconds FROM ml.pipeline_plan p "
        "LEFT JOIN ml.pipeline_steps s USING (pipeline_run_id, step) WHERE p.pipeline_run_id = ? ORDER BY p.position",
        [pipeline_run_id],
    )


def run_status_counts(snapshot: Path) -> pl.DataFrame:
    return query(snapshot, "SELECT status, count(*) AS n FROM ml.runs GROUP BY status ORDER BY status")
