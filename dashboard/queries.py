"""Every SQL statement the dashboard runs, in one place.

Rules this module keeps so the dashboard stays up and safe while flows write:
- Only the published snapshot is read, read-only, so the writer never waits on us, and a newly published
  snapshot is picked up by the next query. The reader of each snapshot version is a private in-memory
  DuckDB that ATTACHes the file READ_ONLY (`duckdb.connect(path)` would reuse DuckDB's per-process instance
  for that path, which can still be the *old* file for a moment after a publish renamed the new one into
  place; ATTACH always opens what the path names now); each query runs on its own cursor of it, so a
  request does not pay for re-opening the file's catalog.
- User input only ever travels as bound parameters (`?`); SQL text is constant. The few identifiers that
  vary (mart names) come from constant mappings, never from a request.
- Results are cached per snapshot *version* (inode, mtime, size): repeated callbacks are fast, and a publish
  (an `os.replace` of the file) changes the key, so nobody sees stale data after it.
- A table that does not exist yet (a stage that has not run) reads as an empty frame: the pages then show
  an empty state instead of a traceback.
- Aggregations over millions of rows are not run per request: they read the `dash.*` marts that publishing
  materialises into the snapshot (`medtx.marts`), or, for a snapshot published before they existed, the
  same SELECT inline.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import duckdb
import polars as pl

from medtx.db import WarehouseVersionError, load_migrations, quote_ident, quote_table
from medtx.marts import MARTS
from medtx.marts import SCHEMA as MART_SCHEMA
from medtx.tasks import all_tasks, tasks_of_family

log = logging.getLogger("medtx.dashboard")

# Views of the task registry (medtx/tasks/): the patient explorer shows EHR tasks, the note explorer the text
# classification tasks, and a `task` request parameter must name a registered task.
EHR_TASKS = tuple(t.name for t in tasks_of_family("ehr"))
NOTE_TASKS = tuple(t.name for t in tasks_of_family("text") if t.kind != "generation")
TASKS = tuple(t.name for t in all_tasks())
# Note tasks over EHR admissions (split by patient) -> the sample table holding their note text; constant
# identifiers from the registry, never from a request.
ADMISSION_NOTE_TABLES = {t.name: t.sample_table for t in tasks_of_family("text") if t.split_unit == "patient"}
# Tasks split by text group (one corpus, no EHR dataset): their sample counts show beside every dataset's.
_CORPUS_TASKS = [t.name for t in all_tasks() if t.split_unit == "text_group"]

Signature = tuple[int, int, int]
T = TypeVar("T")


def snapshot_signature(snapshot: Path) -> Signature | None:
    """Identity of the snapshot's current version, or None when nothing has been published yet."""
    try:
        st = os.stat(snapshot)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def query(snapshot: Path, sql: str, params: Sequence[object] = ()) -> pl.DataFrame:
    """Run one parameterised SELECT against the snapshot; empty frame if it or a table is missing."""
    signature = snapshot_signature(snapshot)
    if signature is None:
        return pl.DataFrame()
    return _cached_query(str(snapshot), signature, sql, _freeze(params))


def _freeze(params: Sequence[object]) -> tuple[object, ...]:
    """Hashable form of the parameters (lists become tuples) for the cache key."""
    return tuple(tuple(p) if isinstance(p, list) else p for p in params)


def open_snapshot(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the snapshot file as it is now (see the module docstring).

    Refuses a snapshot written by a newer medtx, like `medtx.db.connect(read_only=True)`.
    """
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute("ATTACH ? AS snapshot (READ_ONLY)", [str(path)])
        con.execute("USE snapshot")
        version = con.sql("SELECT coalesce(max(version), 0) FROM snapshot.main.schema_migrations").fetchall()[0][0]
    except duckdb.CatalogException:
        version = 0  # no migrations table: an empty or foreign file; queries then find no tables
    except BaseException:
        con.close()
        raise
    if version > _supported_version():
        con.close()
        raise WarehouseVersionError(f"snapshot {path} has schema version {version}, newer than this medtx supports")
    return con


@lru_cache(maxsize=1)
def _supported_version() -> int:
    return max((m.version for m in load_migrations()), default=0)


# snapshot path -> (version, attached connection): the reader of the newest version seen.
_ATTACHED: dict[str, tuple[Signature, duckdb.DuckDBPyConnection]] = {}
_ATTACH_LOCK = threading.Lock()


def _cursor(path: str, signature: Signature) -> duckdb.DuckDBPyConnection:
    """A cursor (own connection, shared database) on the snapshot version `signature`.

    A new version (a publish renamed a new file into place) gets a fresh ATTACH. The previous reader is
    dropped, not closed: closing it would close the cursors of queries still running on it; they finish
    on the old (unlinked) file, which is released with the last of them.
    """
    with _ATTACH_LOCK:
        known = _ATTACHED.get(path)
        if known is None or known[0] != signature:
            _ATTACHED[path] = (signature, open_snapshot(path))
        cursor = _ATTACHED[path][1].cursor()
    cursor.execute("USE snapshot")
    return cursor


def _forget_connections() -> None:
    with _ATTACH_LOCK:
        _ATTACHED.clear()  # dropped, not closed: see `_cursor`


@lru_cache(maxsize=1024)
def _cached_query(path: str, signature: Signature, sql: str, params: tuple[object, ...]) -> pl.DataFrame:
    bound = [list(p) if isinstance(p, tuple) else p for p in params]
    try:
        con = _cursor(path, signature)
    except (FileNotFoundError, duckdb.IOException) as exc:
        log.warning("snapshot %s not readable right now: %s", path, exc)
        return pl.DataFrame()
    try:
        return con.sql(sql, params=bound or None).pl()
    except duckdb.CatalogException as exc:
        # A schema or table that a not-yet-run stage creates: an empty state, not an error.
        log.debug("snapshot %s lacks a table for this query: %s", path, exc)
        return pl.DataFrame()
    finally:
        con.close()


def _mart_sql(snapshot: Path, name: str) -> str:
    """FROM-clause text of a mart: its materialised table when this snapshot has one, else its SELECT.

    Both come from the constant `medtx.marts.MARTS`; no request data reaches SQL text.
    """
    if name in _snapshot_marts(snapshot):
        return f"{MART_SCHEMA}.{quote_ident(name)}"
    return f"({MARTS[name].select}) AS {quote_ident(name)}"


def _snapshot_marts(snapshot: Path) -> set[str]:
    df = query(snapshot, "SELECT table_name FROM duckdb_tables() WHERE database_name = 'snapshot' "
               "AND schema_name = ?", [MART_SCHEMA])
    return set(df.to_series().to_list()) if df.height else set()


_VIEW_CACHES: list = []


def cached_view(build: Callable[..., T]) -> Callable[..., T]:
    """Cache a page part built by `build(snapshot, *hashable_args)` per snapshot version, like the queries:
    warm callbacks then skip figure building too, and a publish invalidates them."""

    @lru_cache(maxsize=256)
    def cached(path: str, signature: Signature | None, *args: object) -> T:
        return build(Path(path), *args)

    @functools.wraps(build)
    def wrapper(snapshot: Path, *args: object) -> T:
        return cached(str(snapshot), snapshot_signature(snapshot), *args)

    _VIEW_CACHES.append(cached)
    return wrapper


def clear_cache() -> None:
    """Forget cached results, views and open readers (benchmarks measure cold latency with it)."""
    _cached_query.cache_clear()
    _forget_connections()
    for cache in _VIEW_CACHES:
        cache.cache_clear()


def has_snapshot(snapshot: Path) -> bool:
    return snapshot_signature(snapshot) is not None


def _scalar(df: pl.DataFrame, default: object = None) -> object:
    return df.item(0, 0) if df.height and df.width else default


# --- datasets and overview --------------------------------------------------------------------------


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
    """Patients, admissions, diagnoses and prescriptions per dataset."""
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
        [dataset, _CORPUS_TASKS],
    )
    return df.with_columns(pl.col("n").cast(pl.Int64)) if df.height else pl.DataFrame()


def ingest_rejects(snapshot: Path, dataset: str) -> pl.DataFrame:
    """Rejected source rows (DuckDB CSV rejects) per table, error type and column."""
    return query(
        snapshot,
        "SELECT table_name, error_type AS reason, column_name, count(*) AS n, min(line) AS first_line "
        "FROM raw.ingest_rejects WHERE dataset = ? GROUP BY ALL ORDER BY n DESC, table_name, reason",
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


# --- leaderboard ------------------------------------------------------------------------------------


def task_datasets(snapshot: Path) -> pl.DataFrame:
    """(task, dataset, runs, n_test_units) with at least one run, for the selectors; n_test_units is the most
    test patients (text groups, FAQ pairs) any run of the dataset was evaluated on (NULL before issue 14)."""
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
# linear probe vs fine-tuning the top K layers), so that the leaderboard never shows them as the same thing.
RUN_VARIANT_SQL = """CASE
    WHEN json_extract_string(config, '$.text.freeze_encoder') = 'true' THEN 'frozen encoder + linear probe'
    WHEN json_extract_string(config, '$.text.finetune_layers') IS NOT NULL
        THEN 'top ' || json_extract_string(config, '$.text.finetune_layers') || ' layers fine-tuned'
    END"""


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


def run_comparisons(snapshot: Path, run_id: str) -> pl.DataFrame:
    """The run's paired comparisons against its reference baseline, with the resampled differences."""
    return query(
        snapshot,
        "SELECT c.reference_run_id, r.model AS reference_model, c.metric, c.averaging, c.diff, c.ci_low, c.ci_high, "
        "c.p_better, c.verdict, c.n_units, c.n_boot, c.diffs FROM ml.comparisons c "
        "LEFT JOIN ml.runs r ON r.run_id = c.reference_run_id WHERE c.run_id = ? ORDER BY c.metric",
        [run_id],
    )


# --- run detail -------------------------------------------------------------------------------------


def runs_index(snapshot: Path) -> pl.DataFrame:
    """All runs for the run selector."""
    return query(
        snapshot,
        "SELECT run_id, task, model, coalesce(dataset, '') AS dataset, seed, status, started_at "
        "FROM ml.runs ORDER BY started_at DESC",
    )


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
        "SELECT split, metric, averaging, value, sd, n_boot, ci_low, ci_high FROM ml.metrics WHERE run_id = ? "
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


# --- patient explorer -------------------------------------------------------------------------------


def explorer_runs(snapshot: Path, tasks: Sequence[str]) -> pl.DataFrame:
    """Completed runs of the given tasks that stored predictions; runs with attention first, then in the order
    of `tasks` with the Transformer first (so the default selection is the headline model on the headline task),
    newest first."""
    return query(
        snapshot,
        "SELECT run_id, task, model, dataset, seed, has_attention "
        f"FROM {_mart_sql(snapshot, 'explorer_runs')} WHERE list_contains(?, task) "
        "ORDER BY has_attention DESC, list_position(?, task), model = 'transformer' DESC, started_at DESC",
        [list(tasks), list(tasks)],
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
        f"SELECT hadm_id, sample_id, admittime FROM {_mart_sql(snapshot, 'run_visits')} "
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


# --- note explorer ----------------------------------------------------------------------------------


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


def discharge_note_text(snapshot: Path, task: str, dataset: str, hadm_id: int) -> dict | None:
    """The discharge summary behind a sample of an admission note task (see ADMISSION_NOTE_TABLES)."""
    df = query(
        snapshot,
        "SELECT CAST(hadm_id AS VARCHAR) AS note_id, text AS transcription, label "
        f"FROM {quote_table(ADMISSION_NOTE_TABLES[task])} WHERE dataset = ? AND hadm_id = ?",
        [dataset, hadm_id],
    )
    return df.row(0, named=True) if df.height else None


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
