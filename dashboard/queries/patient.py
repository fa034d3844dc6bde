"""Dashboard queries: patient explorer (the rules every query keeps: dashboard.queries.core)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from dashboard.queries.core import _mart_sql, query
from medtx.tasks import Task


def explorer_runs(snapshot: Path, tasks: Sequence[Task]) -> pl.DataFrame:
    """Completed runs of the given tasks (the registry's, chosen by the page) that stored predictions; runs with
    attention first, then in the order of `tasks` with the Transformer first (so the default selection is the
    headline model on the headline task), newest first."""
    names = [t.name for t in tasks]
    return query(
        snapshot,
        "SELECT run_id, task, model, dataset, seed, has_attention "
        f"FROM {_mart_sql(snapshot, 'explorer_runs')} WHERE list_contains(?, task) "
        "ORDER BY has_attention DESC, list_position(?, task), model = 'transformer' DESC, started_at DESC",
        [names, names],
    )


def run_patients(snapshot: Path, run_id: str) -> pl.DataFrame:
    """Patients with test predictions in a run; those with stored attention first."""
    return query(
        snapshot,
        "SELECT subject_id, count(DISTINCT hadm_id) AS visits, bool_or(has_attention) AS has_attention "
        f"FROM {_mart_sql(snapshot, 'run_visits')} WHERE run_id = ? "
        "GROUP BY subject_id ORDER BY has_attention DESC, subject_id",
        [run_id],
    )


def patient_visits(snapshot: Path, run_id: str, subject_id: int) -> pl.DataFrame:
    """The patient's visits that have predictions in the run, in time order."""
    return query(
        snapshot,
        f"SELECT hadm_id, sample_id, admittime, has_attention FROM {_mart_sql(snapshot, 'run_visits')} "
        "WHERE run_id = ? AND subject_id = ? ORDER BY admittime NULLS LAST, hadm_id",
        [run_id, subject_id],
    )


def patient_history(snapshot: Path, dataset: str, subject_id: int) -> pl.DataFrame:
    """Every admission of a patient, in time order, with its diagnoses and ATC-3 drugs as 'code name' lists."""
    return query(
        snapshot,
        "SELECT hadm_id, admittime, dischtime, admission_type, diagnoses, drugs "
        f"FROM {_mart_sql(snapshot, 'patient_history')} WHERE dataset = ? AND subject_id = ? "
        "ORDER BY admittime, hadm_id",
        [dataset, subject_id],
    )


def visit_predictions(snapshot: Path, run_id: str, sample_id: str) -> pl.DataFrame:
    """The model's probability for every label of one sample, with truth and decision."""
    return query(
        snapshot,
        "SELECT label, prob, y_true, predicted FROM ml.predictions WHERE run_id = ? AND sample_id = ? "
        "ORDER BY prob DESC NULLS LAST, label",
        [run_id, sample_id],
    )


def label_descriptions(snapshot: Path, codes: Sequence[str]) -> dict[str, str]:
    """Readable names for ATC-3 or ICD-9 codes (whichever dictionary knows them)."""
    if not codes:
        return {}
    names: dict[str, str] = {}
    for sql in (
        "SELECT atc_code AS code, atc_name AS name FROM ref.atc WHERE list_contains(?, atc_code)",
        "SELECT icd9_code AS code, short_title AS name FROM ref.icd9_diagnoses WHERE list_contains(?, icd9_code)",
    ):
        df = query(snapshot, sql, [list(codes)])
        if df.height:
            names.update({c: n for c, n in df.iter_rows() if n and c not in names})
    return names


def ddi_pairs(snapshot: Path, atc3_codes: Sequence[str]) -> pl.DataFrame:
    """Known interacting ATC-3 pairs among the given drugs."""
    if len(atc3_codes) < 2:
        return pl.DataFrame()
    return query(
        snapshot,
        "SELECT DISTINCT atc3_a, atc3_b FROM ref.ddi_atc3 "
        "WHERE list_contains(?, atc3_a) AND list_contains(?, atc3_b) AND atc3_a < atc3_b ORDER BY 1, 2",
        [list(atc3_codes), list(atc3_codes)],
    )


def attention_modules(snapshot: Path, run_id: str, sample_id: str) -> pl.DataFrame:
    """Attention stacks stored for a sample, with their layer and head counts."""
    return query(
        snapshot,
        "SELECT module, count(DISTINCT layer) AS layers, count(DISTINCT head) AS heads FROM ml.attention "
        "WHERE run_id = ? AND sample_id = ? GROUP BY module ORDER BY module",
        [run_id, sample_id],
    )


def attention(snapshot: Path, run_id: str, sample_id: str, module: str) -> pl.DataFrame:
    """All layers and heads of one attention stack for one sample (long form)."""
    return query(
        snapshot,
        "SELECT layer, head, query_pos, key_pos, weight, query_token, key_token FROM ml.attention "
        "WHERE run_id = ? AND sample_id = ? AND module = ? ORDER BY layer, head, query_pos, key_pos",
        [run_id, sample_id, module],
    )
