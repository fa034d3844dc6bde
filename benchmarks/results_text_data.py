"""What the text section of RESULTS.md is rendered from: the completed runs of the text tasks with their test
metrics (point estimate, 95% bootstrap interval, old 10×80% subsample sd) and their paired comparison against
the task's reference baseline (ml.comparisons), read from a warehouse read-only.

Warehouses recorded before issue 14 lack the interval columns (or hold NULL in them): those runs load with no
interval and no comparison, and the tables say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from medtx.store.db import quote_ident

ENCODER_LAYERS = {"minilm": 6}  # all-MiniLM-L6-v2: 6 transformer layers (for "top K of N" labels)

# How a BERT-family run used its encoder, from ml.runs.config: '' (trained end to end, or not a BERT),
# 'probe' (frozen encoder + linear probe) or 'top<K>' (only the top K layers fine-tuned).
VARIANT_SQL = """CASE WHEN json_extract_string(r.config, '$.text.freeze_encoder') = 'true' THEN 'probe'
     WHEN json_extract_string(r.config, '$.text.finetune_layers') IS NOT NULL
     THEN 'top' || json_extract_string(r.config, '$.text.finetune_layers') ELSE '' END"""
# FAQ runs differ by their retrieval embedding (ml.runs.config faq.embedding).
RUN_VARIANT_SQL = ("CASE WHEN r.task = 'faq' THEN coalesce(json_extract_string(r.config, '$.faq.embedding'), '') "
                   "ELSE " + VARIANT_SQL + " END")


@dataclass(frozen=True)
class Metric:
    """One test metric of a run: the point estimate on the whole test split and its 95% interval."""

    value: float | None
    low: float | None = None
    high: float | None = None
    sd: float | None = None  # the old convention: sd over 10 subsamples of 80% of test units
    method: str | None = None  # ml.metrics.ci_method
    n_boot: int | None = None

    @property
    def has_interval(self) -> bool:
        return self.low is not None and self.high is not None


@dataclass(frozen=True)
class Comparison:
    """The paired bootstrap of a run against its task's reference run on one metric (run − reference)."""

    reference_run_id: str
    diff: float | None
    low: float | None
    high: float | None
    verdict: str
    n_units: int
    n_boot: int


@dataclass
class Run:
    run_id: str
    task: str
    model: str
    variant: str
    seed: int | None
    dataset: str | None
    collapsed: bool
    seconds: float
    n_units: int | None
    unit: str | None
    metrics: dict[str, Metric] = field(default_factory=dict)
    compared: dict[str, Comparison] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return run_label(self.task, self.model, self.variant)


def model_label(model: str, variant: str) -> str:
    """Row name saying what was trained: e.g. 'minilm, top 2 of 6 layers fine-tuned'."""
    if variant == "probe":
        return f"{model}, frozen encoder + linear probe (not fine-tuned)"
    if variant.startswith("top"):
        n = ENCODER_LAYERS.get(model)
        return f"{model}, top {variant[3:]}{f' of {n}' if n else ''} layers fine-tuned"
    return model


def run_label(task: str, model: str, variant: str) -> str:
    """A row's model name; FAQ runs say their embedding (retrieval) or architecture (seq2seq)."""
    if task != "faq":
        return model_label(model, variant)
    return f"{model} ({variant or 'tfidf'})" if model == "retrieval" else f"{model} (word-level Transformer)"


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    return {c for (c,) in con.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = 'ml' "
                                      "AND table_name = ?", [table]).fetchall()}


def optional_columns_sql(con: duckdb.DuckDBPyConnection, table: str, alias: str, names: tuple[str, ...]) -> str:
    """`alias.name, ...` for the columns of ml.<table> that exist, NULL for those an older warehouse lacks."""
    present = _columns(con, table)
    return ", ".join(f"{quote_ident(alias)}.{quote_ident(n)}" if n in present else "NULL" for n in names)


def load_runs(con: duckdb.DuckDBPyConnection, tasks: tuple[str, ...]) -> list[Run]:
    """The completed runs of `tasks` with their test metrics (averaging 'none') and comparisons."""
    units_sql = optional_columns_sql(con, "runs", "r", ("n_test_units", "test_unit"))
    rows = con.execute(
        f"SELECT r.run_id, r.task, r.model, {RUN_VARIANT_SQL}, r.seed, r.dataset, r.collapsed, "
        f"coalesce(r.train_seconds, 0), {units_sql} FROM ml.runs r "
        "WHERE r.task IN (SELECT unnest(?::VARCHAR[])) AND r.status = 'completed' ORDER BY r.run_id",
        [list(tasks)]).fetchall()
    runs = {row[0]: Run(*row[:6], bool(row[6]), float(row[7]), row[8], row[9]) for row in rows}
    interval_sql = optional_columns_sql(con, "metrics", "m", ("ci_low", "ci_high", "sd", "ci_method", "n_boot"))
    for run_id, metric, *values in con.execute(
            f"SELECT m.run_id, m.metric, m.value, {interval_sql} FROM ml.metrics m WHERE m.split = 'test' "
            "AND m.averaging = 'none' AND m.run_id IN (SELECT unnest(?::VARCHAR[]))", [list(runs)]).fetchall():
        runs[run_id].metrics[metric] = Metric(*values)
    for run_id, metric, *values in _comparison_rows(con, list(runs)):
        runs[run_id].compared[metric] = Comparison(*values)
    return list(runs.values())


def _comparison_rows(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> list[tuple]:
    """ml.comparisons rows (averaging 'none') of the runs; none in a warehouse older than the table."""
    if not _columns(con, "comparisons"):
        return []
    return con.execute(
        "SELECT run_id, metric, reference_run_id, diff, ci_low, ci_high, verdict, n_units, n_boot "
        "FROM ml.comparisons WHERE averaging = 'none' AND run_id IN (SELECT unnest(?::VARCHAR[]))",
        [run_ids]).fetchall()


def group_runs(runs: list[Run]) -> list[list[Run]]:
    """The runs of each (task, row label), seeds in order; groups in first-seen order."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.task, run.label), []).append(run)
    return [sorted(g, key=lambda r: (r.seed is None, r.seed or 0, r.run_id)) for g in groups.values()]
