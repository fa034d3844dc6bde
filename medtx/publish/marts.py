"""Read models for the dashboard, built into each published snapshot (dbt-style marts, schema `dash`).

At full scale a page's default view would otherwise aggregate millions of rows on every first request after
a publish (5.3M prescriptions, millions of long-form predictions). Each mart is a plain SELECT over the
warehouse tables, materialised once at publish time into the snapshot, sorted by its lookup key so DuckDB's
zone maps skip everything but the requested run or patient. The dashboard reads `dash.<name>` when the
snapshot has it and falls back to `(<the same SELECT>)` when it does not (a snapshot published before the
marts existed), so one definition serves both and the figures cannot drift apart.

Definitions are constant SQL text; nothing here takes user input.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import duckdb

from medtx.ingest.plausibility import RULES
from medtx.tasks import all_tasks, tasks_of_family
from medtx.store.db import quote_ident, quote_table, sql_literal

log = logging.getLogger("medtx.publish.snapshot")

SCHEMA = "dash"
CALIBRATION_BINS = 10
TOP_TOKENS_KEPT = 20  # per (run, class); the page shows fewer
_SPECIAL_TOKENS = "('[CLS]', '[SEP]', '[PAD]', '<pad>', '<cls>', '<sep>')"
_ATTENTION_SAMPLES = "(SELECT DISTINCT run_id, sample_id, true AS stored FROM ml.attention)"


def _sample_counts_sql() -> str:
    """Rows per (dataset, task, split) of every task that builds its own samples (from the task registry)."""
    patient_sql = [
        f"SELECT dataset, subject_id, {sql_literal(t.name)} AS task FROM {quote_table(t.samples.table)}"
        + (f" WHERE task = {sql_literal(t.name)}" if t.samples.shared else "")
        for t in all_tasks() if t.lineage.build is not None and t.samples.split_unit == "patient"
    ]
    grouped_sql = [
        f"UNION ALL SELECT {sql_literal(t.samples.dataset)}, {sql_literal(t.name)}, coalesce(split, 'unassigned'), count(*) "
        f"FROM {quote_table(t.samples.table)} GROUP BY ALL"
        for t in all_tasks() if t.lineage.build is not None and t.samples.split_unit == "text_group"
    ]
    return (
        "SELECT x.dataset, x.task, coalesce(s.split, 'unassigned') AS split, count(*) AS n FROM "
        f"({' UNION ALL '.join(patient_sql)}) x "
        "LEFT JOIN samples.splits s ON s.dataset = x.dataset AND s.subject_id = x.subject_id AND s.task = x.task "
        "GROUP BY ALL " + " ".join(grouped_sql)
    )


def _ingest_checks_sql() -> str:
    """Plausibility findings of each dataset's latest ingest (raw.ingest_checks), one row per (table, rule), with
    what the rule says (medtx.ingest.plausibility.RULES, constants) and what the policy did with the rows."""
    says_sql = ", ".join(f"({sql_literal(r.table)}, {sql_literal(r.name)}, {sql_literal(r.says)})" for r in RULES)
    return ("SELECT c.dataset, c.table_name, c.rule, coalesce(r.says, c.rule) AS says, c.n_rows, c.policy, "
            "CASE c.policy WHEN 'reject' THEN 'moved to raw.ingest_rejects' ELSE 'kept' END AS action, "
            "c.example, c.checked_at FROM raw.ingest_checks c "
            f"LEFT JOIN (VALUES {says_sql}) r(table_name, rule, says) USING (table_name, rule)")


def _note_tasks_sql() -> str:
    """The text classification tasks (whose predictions are notes), as an SQL list literal."""
    return "(" + ", ".join(f"'{t.name}'" for t in tasks_of_family("text") if t.kind != "generation") + ")"


class Mart(NamedTuple):
    select: str  # over the warehouse tables, unqualified names
    key: str  # ORDER BY of the materialised table: what the dashboard filters on


MARTS: dict[str, Mart] = {
    # Overview and `medtx status`: rows per raw table and dataset (a full scan of 5M+ prescriptions otherwise).
    "cohort_counts": Mart(
        select=(
            "SELECT dataset, 'patients' AS table_name, count(*) AS n FROM raw.patients GROUP BY dataset "
            "UNION ALL SELECT dataset, 'admissions', count(*) FROM raw.admissions GROUP BY dataset "
            "UNION ALL SELECT dataset, 'diagnoses', count(*) FROM raw.diagnoses_icd GROUP BY dataset "
            "UNION ALL SELECT dataset, 'procedures', count(*) FROM raw.procedures_icd GROUP BY dataset "
            "UNION ALL SELECT dataset, 'prescriptions', count(*) FROM raw.prescriptions GROUP BY dataset"
        ),
        key="dataset, table_name",
    ),
    # Overview: the plausibility checks' findings at each dataset's latest ingest, per table and rule (issue 34).
    "ingest_checks": Mart(select=_ingest_checks_sql(), key="dataset, table_name, rule"),
    # Overview: samples per task and split (text-group tasks have their own split column and fixed dataset).
    "sample_counts": Mart(select=_sample_counts_sql(), key="dataset, task, split"),
    # Explorers: completed runs with stored predictions, and whether they stored attention.
    "explorer_runs": Mart(
        select=(
            "SELECT r.run_id, r.task, r.model, coalesce(r.dataset, '') AS dataset, r.seed, r.started_at, "
            "r.run_id IN (SELECT DISTINCT run_id FROM ml.attention) AS has_attention "
            "FROM ml.runs r WHERE r.status = 'completed' "
            "AND r.run_id IN (SELECT DISTINCT run_id FROM ml.predictions)"
        ),
        key="run_id",
    ),
    # Patient explorer: one row per (run, test visit) with its admission time.
    "run_visits": Mart(
        select=(
            "SELECT p.run_id, p.subject_id, p.hadm_id, p.sample_id, a.admittime, "
            "coalesce(att.stored, false) AS has_attention "
            "FROM (SELECT DISTINCT run_id, subject_id, hadm_id, sample_id FROM ml.predictions "
            "      WHERE subject_id IS NOT NULL) p "
            "JOIN ml.runs r ON r.run_id = p.run_id "
            "LEFT JOIN raw.admissions a ON a.hadm_id = p.hadm_id AND a.dataset = r.dataset "
            f"LEFT JOIN {_ATTENTION_SAMPLES} att ON att.run_id = p.run_id AND att.sample_id = p.sample_id"
        ),
        key="run_id, subject_id, admittime, hadm_id",
    ),
    # Patient explorer: every admission of every patient, diagnoses and ATC-3 drugs with names, pre-joined.
    "patient_history": Mart(
        select=(
            "WITH dx AS (SELECT d.dataset, d.hadm_id, "
            "  list(trim(d.icd9_code || ' ' || coalesce(n.short_title, '')) ORDER BY d.seq_num, d.icd9_code) "
            "  AS diagnoses "
            "  FROM raw.diagnoses_icd d LEFT JOIN ref.icd9_diagnoses n ON n.icd9_code = d.icd9_code "
            "  WHERE d.icd9_code IS NOT NULL GROUP BY ALL), "
            "rx AS (SELECT dataset, hadm_id, list(trim(atc3 || ' ' || coalesce(atc_name, '')) ORDER BY atc3) AS drugs "
            "  FROM (SELECT DISTINCT p.dataset, p.hadm_id, p.atc3, n.atc_name FROM core.prescriptions_atc3 p "
            "        LEFT JOIN ref.atc n ON n.atc_code = p.atc3 WHERE p.atc3 IS NOT NULL) GROUP BY ALL) "
            "SELECT a.dataset, a.subject_id, a.hadm_id, a.admittime, a.dischtime, a.admission_type, "
            "coalesce(dx.diagnoses, []) AS diagnoses, coalesce(rx.drugs, []) AS drugs FROM raw.admissions a "
            "LEFT JOIN dx ON dx.dataset = a.dataset AND dx.hadm_id = a.hadm_id "
            "LEFT JOIN rx ON rx.dataset = a.dataset AND rx.hadm_id = a.hadm_id"
        ),
        key="dataset, subject_id, admittime, hadm_id",
    ),
    # Run detail: reliability diagram, pooled over labels.
    "calibration": Mart(
        select=(
            f"SELECT run_id, least(floor(prob * {CALIBRATION_BINS}), {CALIBRATION_BINS} - 1)::INTEGER AS bin, "
            "avg(prob) AS mean_prob, avg(y_true::INTEGER) AS observed, count(*) AS n FROM ml.predictions "
            "WHERE prob IS NOT NULL AND y_true IS NOT NULL GROUP BY ALL"
        ),
        key="run_id, bin",
    ),
    # Leaderboard: per run, the test units resampled by the bootstrap (patients, text groups, FAQ pairs) and the
    # test samples predicted — counting distinct samples over millions of long-form predictions is the slow part.
    "test_sizes": Mart(
        select=(
            "SELECT r.run_id, r.task, coalesce(r.dataset, '') AS dataset, r.n_test_units, r.test_unit, "
            "s.n AS n_test_samples FROM ml.runs r "
            "LEFT JOIN (SELECT run_id, count(DISTINCT sample_id) AS n FROM ml.predictions GROUP BY run_id) s "
            "ON s.run_id = r.run_id"
        ),
        key="task, dataset, run_id",
    ),
    # Leaderboard and forest plot: test metrics with their 95% interval and the paired verdict against the
    # reference baseline (NULL for metrics not compared); the resampled differences stay in ml.comparisons.
    "leaderboard": Mart(
        select=(
            "SELECT r.task, coalesce(r.dataset, '') AS dataset, m.run_id, m.metric, m.averaging, m.value, m.sd, "
            "m.sd_method, m.ci_low, m.ci_high, m.n_boot, m.ci_method, c.reference_run_id, c.diff, "
            "c.ci_low AS diff_low, c.ci_high AS diff_high, c.p_better, c.verdict "
            "FROM ml.metrics m JOIN ml.runs r ON r.run_id = m.run_id "
            "LEFT JOIN ml.comparisons c ON c.run_id = m.run_id AND c.metric = m.metric AND c.averaging = m.averaging "
            "WHERE m.split = 'test'"
        ),
        key="task, dataset, run_id, metric",
    ),
    # Note explorer: one row per (run, note) with its true and predicted class.
    "run_notes": Mart(
        select=(
            "SELECT p.run_id, p.sample_id, max(CASE WHEN p.y_true THEN p.label END) AS true_label, "
            "max(CASE WHEN p.predicted THEN p.label END) AS pred_label, "
            "coalesce(any_value(att.stored), false) AS has_attention "
            "FROM ml.predictions p JOIN ml.runs r ON r.run_id = p.run_id "
            f"LEFT JOIN {_ATTENTION_SAMPLES} att ON att.run_id = p.run_id AND att.sample_id = p.sample_id "
            f"WHERE r.task IN {_note_tasks_sql()} GROUP BY p.run_id, p.sample_id"
        ),
        key="run_id, sample_id",
    ),
    # Note explorer: tokens [CLS] attends to most (last layer, mean over heads and notes) per predicted class.
    # Overview, leaderboard, run detail: the leakage gate's verdict per (dataset, task) (medtx.tasks.leakage), with
    # the features its shortcut audit flagged, strongest first.
    "leakage_gate": Mart(
        select=(
            "SELECT g.dataset, g.task, g.status, g.samples, g.split_overlap, g.late_codes, g.shortcuts, "
            "g.acknowledged, g.message, coalesce((SELECT string_agg(s.feature || ':' || s.token || CASE WHEN "
            "s.acknowledged THEN ' (acknowledged)' ELSE '' END, ', ' ORDER BY s.value DESC, s.feature, s.token) "
            "FROM samples.leakage_shortcuts s WHERE s.dataset = g.dataset AND s.task = g.task), '') AS flagged "
            "FROM samples.leakage_gate g"
        ),
        key="dataset, task",
    ),
    "top_tokens": Mart(
        select=(
            "WITH last AS (SELECT run_id, max(layer) AS layer FROM ml.attention GROUP BY run_id), "
            "cls AS (SELECT a.run_id, a.sample_id, a.key_token AS token, avg(a.weight) AS weight FROM ml.attention a "
            "  JOIN last USING (run_id) WHERE a.layer = last.layer AND a.query_pos = 0 "
            f"  AND a.key_token NOT IN {_SPECIAL_TOKENS} AND regexp_matches(a.key_token, '[A-Za-z]{{3,}}') "
            "  GROUP BY a.run_id, a.sample_id, a.key_pos, a.key_token), "
            "pred AS (SELECT run_id, sample_id, label FROM ml.predictions WHERE predicted "
            "  AND run_id IN (SELECT run_id FROM last)), "
            "ranked AS (SELECT cls.run_id, pred.label AS class, cls.token, avg(cls.weight) AS weight, count(*) AS n, "
            "  row_number() OVER (PARTITION BY cls.run_id, pred.label "
            "                    ORDER BY avg(cls.weight) DESC, cls.token) AS rank "
            "  FROM cls JOIN pred USING (run_id, sample_id) GROUP BY cls.run_id, pred.label, cls.token) "
            f"SELECT run_id, class, token, weight, n, rank FROM ranked WHERE rank <= {TOP_TOKENS_KEPT}"
        ),
        key="run_id, class, rank",
    ),
}


def current_marts() -> dict[str, Mart]:
    """MARTS with its registry-read marts made now: a pipeline config declares its ACES tasks (medtx.aces.task)
    after this module is imported."""
    return {**MARTS, "sample_counts": Mart(select=_sample_counts_sql(), key=MARTS["sample_counts"].key)}


def build_marts(con: duckdb.DuckDBPyConnection, database: str) -> dict[str, int]:
    """Materialise every mart into `<database>.dash` (replacing it); returns rows per mart.

    Runs against the snapshot being published (the caller's transaction/attachment): the live warehouse
    never carries them. A mart whose source tables or columns are missing is skipped with a warning, and
    the dashboard then computes it from the base tables (or shows its empty state).
    """
    previous = con.sql("SELECT current_database()").fetchall()[0][0]
    con.execute(f"USE {quote_ident(database)}")  # the SELECTs name tables unqualified: read the snapshot's copies
    try:
        con.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        con.execute(f"CREATE SCHEMA {SCHEMA}")
        rows: dict[str, int] = {}
        for name, mart in current_marts().items():
            started = time.perf_counter()
            try:
                select_sql, key_sql = mart.select, mart.key  # constants of this module (MARTS)
                con.execute(
                    f"CREATE TABLE {SCHEMA}.{quote_ident(name)} AS SELECT * FROM ({select_sql}) ORDER BY {key_sql}"
                )
            except (duckdb.CatalogException, duckdb.BinderException) as exc:
                # A table or column a not-yet-run stage (or an older warehouse) lacks: publish anyway.
                log.warning("mart %s.%s skipped (a source table or column is missing): %s", SCHEMA, name, exc)
                continue
            rows[name] = con.sql(f"SELECT count(*) FROM {SCHEMA}.{quote_ident(name)}").fetchall()[0][0]
            log.info("mart %s.%s: %d rows in %.2f s", SCHEMA, name, rows[name], time.perf_counter() - started)
    finally:
        con.execute(f"USE {quote_ident(previous)}")
    return rows
