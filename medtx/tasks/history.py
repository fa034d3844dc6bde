"""The one builder tail of every EHR task: history -> sample rows -> figures -> samples, split, vocab, summary.

Every EHR task builds its samples the same way once it knows its cohort and its SQL: the clock-bounded history of
its index admissions (medtx.samples.common.create_history), its sample rows over that history, a count that may
be empty (then one clear EmptyCohortError), its figures, and the one transaction writing samples, the dataset's
patient split, vocabularies and summary (medtx.samples.common.store_task). A task declares the parts that differ:

    ROWS = HistoryRows(task=NAME, table=TABLE, prediction_time="dischtime", index_sql=INDEX_SQL,
                       rows_sql=SAMPLES_SQL, vocab=VOCAB, figures={"positives": "count(*) FILTER (WHERE label)"})

    def build(con, ctx):
        return ROWS.build(con, ctx, empty=lambda stats: f"my_task: dataset {ctx.dataset!r} has no ...")

The leakage gate runs after it (medtx.tasks.build). This module holds no task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from medtx.tasks.base import BuildContext

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb


@dataclass(frozen=True)
class HistoryRows:
    """How one EHR task's sample rows come from the history relation, and what is written of them.

    `rows_sql` selects the rows from `_samples_history` (and `_samples_visits`); `$dataset` and, in a table several
    tasks share, `$task` are bound. `figures`: summary figures as aggregates over the rows (name -> SQL), after
    `samples` and `patients`; the visit statistics and unknown-code counts follow them in samples.task_summary.
    """

    task: str
    table: str  # schema-qualified target, e.g. "samples.drug_rec"
    prediction_time: str  # the task's clock (Task.clock.prediction_time)
    index_sql: str  # the samples' index admissions (subject_id, hadm_id) over _samples_visits
    rows_sql: str
    vocab: Mapping[str, str]  # feature -> list expression over a sample row (training patients' rows count)
    figures: Mapping[str, str] = field(default_factory=dict)
    visits_sql: str = "TRUE"  # which admissions enter a history (create_history)
    specials: Mapping[str, tuple[str, ...]] | None = None  # feature -> special tokens put first in its vocabulary
    shared: bool = False  # the table holds several tasks' rows (a `task` column)

    @property
    def source(self) -> str:
        return f"_samples_{self.task}"

    def build(self, con: duckdb.DuckDBPyConnection, ctx: BuildContext, *,
              empty: Callable[[dict[str, int]], str], extra_figures: Mapping[str, float] | None = None) -> int:
        """Write the task's samples of `ctx.dataset`; returns their count. `empty(visit_stats)` words why a dataset
        has no sample (raised as EmptyCohortError); `extra_figures`, computed by the builder before (e.g. its
        exclusion counts), follow `figures` in the summary."""
        from medtx.samples.common import (
            EmptyCohortError, create_history, drop_history, store_task, unknown_code_counts, visit_stats,
        )
        from medtx.store.db import quote_ident

        source_sql = quote_ident(self.source)
        create_history(con, ctx.dataset, self.prediction_time, self.index_sql, visits_sql=self.visits_sql)
        params = {"dataset": ctx.dataset, "task": self.task}
        con.execute(f"CREATE OR REPLACE TEMP TABLE {source_sql} AS {self.rows_sql}",
                    {k: v for k, v in params.items() if f"${k}" in self.rows_sql})
        drop_history(con)
        stats = visit_stats(con)
        aggregates_sql = "".join(f", {expr}" for expr in self.figures.values())  # SQL written in code by the task
        n, patients, *values = con.sql(f"SELECT count(*), count(DISTINCT subject_id){aggregates_sql} FROM {source_sql}"
                                       ).fetchall()[0]
        if n == 0:
            con.execute(f"DROP TABLE IF EXISTS {source_sql}")
            raise EmptyCohortError(empty(stats))
        figures = {"samples": n, "patients": patients, **dict(zip(self.figures, values, strict=True)),
                   **(extra_figures or {}), **stats, **unknown_code_counts(con)}
        store_task(con, dataset=ctx.dataset, task=self.task, source=self.source, target=self.table, seed=ctx.seed,
                   fractions=ctx.fractions, min_count=ctx.min_count, vocab=dict(self.vocab), figures=figures,
                   specials=dict(self.specials) if self.specials else None, shared=self.shared)
        return n


# The figures of a binary task's rows (label: BOOLEAN), in the order every binary EHR task reports them.
BINARY_FIGURES = {"positives": "count(*) FILTER (WHERE label)",
                  "positive_rate": "count(*) FILTER (WHERE label) / count(*)"}
