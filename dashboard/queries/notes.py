"""Dashboard queries: note explorer (the rules every query keeps: dashboard.queries.core)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from medtx.store.db import quote_table

from dashboard.queries.core import _mart_sql, query
from medtx.tasks import Task


def run_notes(snapshot: Path, run_id: str) -> pl.DataFrame:
    """Notes with predictions in a text run, those with attention first, then by id."""
    return query(
        snapshot,
        f"SELECT sample_id, true_label, pred_label, has_attention FROM {_mart_sql(snapshot, 'run_notes')} "
        "WHERE run_id = ? ORDER BY has_attention DESC, TRY_CAST(sample_id AS BIGINT) NULLS LAST, sample_id",
        [run_id],
    )


def note_text(snapshot: Path, note_id: str) -> dict | None:
    """An MTSamples note: text, specialty label, description."""
    df = query(
        snapshot,
        "SELECT CAST(note_id AS VARCHAR) AS note_id, medical_specialty, description, sample_name, transcription "
        "FROM raw.mtsamples WHERE CAST(note_id AS VARCHAR) = ?",
        [note_id],
    )
    return df.row(0, named=True) if df.height else None


def note_token_attention(snapshot: Path, run_id: str, sample_id: str, layer: int | None) -> pl.DataFrame:
    """Attention from the first token ([CLS]) to every token, averaged over heads (last layer by default)."""
    return query(
        snapshot,
        "WITH chosen AS (SELECT coalesce(?, max(layer)) AS layer FROM ml.attention "
        "WHERE run_id = ? AND sample_id = ?) "
        "SELECT key_pos, any_value(key_token) AS token, avg(weight) AS weight FROM ml.attention "
        "WHERE run_id = ? AND sample_id = ? AND query_pos = 0 AND layer = (SELECT layer FROM chosen) "
        "GROUP BY key_pos ORDER BY key_pos",
        [layer, run_id, sample_id, run_id, sample_id],
    )


def note_layers(snapshot: Path, run_id: str) -> list[int]:
    df = query(snapshot, "SELECT DISTINCT layer FROM ml.attention WHERE run_id = ? ORDER BY layer", [run_id])
    return df.to_series().to_list() if df.height else []


def top_tokens_per_class(snapshot: Path, run_id: str, per_class: int = 8) -> pl.DataFrame:
    """Tokens that [CLS] attends to most (last layer, mean over heads and notes), per predicted class."""
    return query(
        snapshot,
        f"SELECT class, token, weight, n, rank FROM {_mart_sql(snapshot, 'top_tokens')} "
        "WHERE run_id = ? AND rank <= ? ORDER BY class, rank",
        [run_id, per_class],
    )


def admission_notes(task: Task | None) -> bool:
    """A note task over EHR admissions (split by patient): its note text lies in its sample table."""
    return task is not None and task.family == "text" and task.samples.split_unit == "patient"


def discharge_note_text(snapshot: Path, task: Task, dataset: str, hadm_id: int) -> dict | None:
    """The discharge summary behind a sample of an admission note task (`admission_notes`); the table name is
    the registered task's sample table, a constant identifier, never a request's."""
    if not admission_notes(task):
        raise ValueError(f"task {task.name!r} is no note task over admissions")
    df = query(
        snapshot,
        "SELECT CAST(hadm_id AS VARCHAR) AS note_id, text AS transcription, label "
        f"FROM {quote_table(task.samples.table)} WHERE dataset = ? AND hadm_id = ?",
        [dataset, hadm_id],
    )
    return df.row(0, named=True) if df.height else None
