"""Admission-level binary outcomes as declarations: `admission_outcome(...)` returns the whole `Task`.

An admission-level task (an in-hospital outcome at 48 h, a prolonged stay, ...) predicts one yes/no outcome of an
admission at a moment of that admission, from what the clock shows then. What differs between such tasks is a
handful of facts; everything else (the history features, the static tokens, the sample table, the summary, the
lineage, the metrics) is the same and lives here once (docs/EXTENDING.md shows a whole task file):

    TASK = admission_outcome(
        name="prolonged_stay", label="dischtime > admittime + INTERVAL 7 DAY", label_name="stay_over_7_days",
        clock=Clock(prediction_time="admittime + INTERVAL 48 HOUR", words="48 hours after admission",
                    outcome="a stay longer than 7 days", outcome_known="least(dischtime, coalesce(deathtime, dischtime))"),
        exclusions=(Exclusion("under_48h", "dischtime <= {t}"), ...), ...)

- `exclusions`: the cohort's rules, in order; an admission takes the first that applies (SQL over one row of
  `_samples_visits`: subject_id, hadm_id, admittime, dischtime, deathtime, admission_type, hospital_expire_flag,
  age; `{t}` stands for the prediction time). Each is counted in samples.task_summary as `excluded_<reason>`;
  an admission without its times is excluded first (`without_times`) unless the declaration places that rule.
- `label`: SQL over the same row, true for a positive sample.
- features: every earlier admission's codes and this one's as the clock shows them at the prediction time
  (medtx.samples.common.create_history), one visit per admission, the current one last; plus `static`, one visit
  of tokens from the allow-list of medtx.samples.static (`static_tokens`, each with its time rule).
Rows go to the generic samples.admission_outcome table (told apart by `task`), split by patient. The file that
declares the task is its module (`medtx/tasks/<name>.py`); this module holds no task.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from medtx.tasks.base import BINARY_SCORING, BuildContext, Clock, CohortExclusion, Samples, Task, ehr_lineage
from medtx.tasks.history import BINARY_FIGURES, HistoryRows

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

TABLE = "samples.admission_outcome"
COLUMNS = ("dataset", "task", "subject_id", "hadm_id", "admittime", "prediction_time", "conditions", "procedures",
           "drugs", "static", "label")
FEATURES = ("conditions", "procedures", "drugs", "static")
FEATURE_SOURCES = (("conditions", "diagnosis"), ("procedures", "procedure"), ("drugs", "drug"), ("static", "static"))
# Histories hold admissions that are no sample themselves, and the current admission's codes may be hidden: the
# vocabularies count every code of the whole visible history.
VOCAB = {"conditions": "flatten(conditions)", "procedures": "flatten(procedures)", "drugs": "flatten(drugs)",
         "static": "static[-1]"}
def _text_sql(text: str) -> str:
    """A SQL string literal of a declared reason (a code constant; quotes doubled all the same)."""
    return "'" + text.replace("'", "''") + "'"


DEFAULT_STATIC = ("AGE", "SEX", "ADMISSION_TYPE")  # each known at admission (medtx.samples.static)
# An admission without its times has no prediction time and no clock: never a sample.
WITHOUT_TIMES = "admittime IS NULL OR dischtime IS NULL OR {t} IS NULL"


@dataclass(frozen=True)
class Exclusion:
    """One cohort rule: admissions where `when` holds are left out and counted as `excluded_<reason>`."""

    reason: str
    when: str  # SQL over one `_samples_visits` row; `{t}` is the prediction time

    def when_sql(self, prediction_time_sql: str) -> str:
        """The rule's SQL with the prediction time in place of `{t}` (both are code the task file declares)."""
        return self.when.format(t=prediction_time_sql)


@dataclass(frozen=True)
class OutcomeSQL:
    """The SQL of one admission-level task, from its declaration."""

    name: str
    prediction_time: str
    label_sql: str
    exclusions: tuple[Exclusion, ...]
    static_tokens: tuple[str, ...]
    empty_cohort: str  # why a dataset can have no sample, in words (the EmptyCohortError message)

    @property
    def rules(self) -> tuple[Exclusion, ...]:
        """The declared exclusions, after the times guard unless the declaration places it itself."""
        if any(e.reason == "without_times" for e in self.exclusions):
            return self.exclusions
        return (Exclusion("without_times", WITHOUT_TIMES), *self.exclusions)

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(e.reason for e in self.rules)

    def cohort_exclusions(self) -> tuple[CohortExclusion, ...]:
        """The rules as the cohort flow reads them: each counted by the builder (`excluded_<reason>`), its SQL
        with the prediction time in place."""
        t = f"({self.prediction_time})"
        return tuple(CohortExclusion(r.reason, r.reason.replace("_", " "), " ".join(r.when_sql(t).split()))
                     for r in self.rules)

    def cohort_sql(self) -> str:
        """Every admission with its exclusion reason (NULL: in the cohort), the first reason that applies."""
        t = f"({self.prediction_time})"
        rules = self.rules
        cases_sql = "\n".join(f"                WHEN {r.when_sql(t)} THEN {_text_sql(r.reason)}" for r in rules)
        return f"""
    SELECT subject_id, hadm_id,
           CASE
{cases_sql}
           END AS excluded
    FROM _samples_visits"""

    def index_sql(self) -> str:
        return f"SELECT subject_id, hadm_id FROM ({self.cohort_sql()}) WHERE excluded IS NULL"

    def samples_sql(self) -> str:
        from medtx.samples.static import static_tokens_sql

        return f"""
    SELECT $dataset AS dataset, $task AS task, h.subject_id, h.hadm_id, v.admittime, h.prediction_time,
           h.conditions, h.procedures, h.drugs, st.static, coalesce(({self.label_sql}), false) AS label
    FROM _samples_history h JOIN _samples_visits v USING (hadm_id)
    JOIN ({static_tokens_sql(self.name, self.static_tokens)}) st USING (hadm_id)"""


def build_outcome(sql: OutcomeSQL, con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite one admission-level task's rows of samples.admission_outcome (+ splits, vocab, summary) for a
    dataset, from `_samples_visits` (medtx.tasks.build fills it)."""
    excluded = dict(con.sql(f"SELECT excluded, count(*) FROM ({sql.cohort_sql()}) GROUP BY 1").fetchall())
    counts = {f"excluded_{reason}": excluded.get(reason, 0) for reason in sql.reasons}
    rows = HistoryRows(task=sql.name, table=TABLE, prediction_time=sql.prediction_time, index_sql=sql.index_sql(),
                       rows_sql=sql.samples_sql(), vocab=VOCAB, figures=BINARY_FIGURES, shared=True)
    return rows.build(con, ctx, extra_figures=counts, empty=lambda stats: (
        f"{sql.name}: dataset {ctx.dataset!r} has no {sql.empty_cohort} "
        f"({stats['cohort_visits']} admissions; excluded: {counts})"))


def admission_outcome(
    *, name: str, label: str, label_name: str, clock: Clock, exclusions: Sequence[Exclusion] = (),
    empty_cohort: str = "admission in the cohort", static_tokens: tuple[str, ...] = DEFAULT_STATIC,
    description: str = "", order: int = 100, **task_fields: Any,
) -> Task:
    """The `Task` of an admission-level binary outcome (module docstring). `clock` is the task's clock (its
    prediction time, outcome and when it is known, in SQL and words); the features' sources and static tokens are
    this module's. `task_fields` are any other `Task` fields (e.g. `excluded_models`, `model_defaults`)."""
    if clock.prediction_time is None:
        raise ValueError(f"task {name!r}: an admission-level outcome needs a prediction time (Clock.prediction_time)")
    sql = OutcomeSQL(name, clock.prediction_time, label, tuple(exclusions), tuple(static_tokens), empty_cohort)
    fields: dict[str, Any] = dict(
        kind="binary", family="ehr", scoring=BINARY_SCORING,
        # BEHRT reads per-visit ages, which an admission-level sample does not carry
        excluded_models=("behrt",),
    )
    fields.update(task_fields)
    return Task(
        name=name, description=description, order=order,
        clock=replace(clock, static_tokens=tuple(static_tokens), feature_sources=FEATURE_SOURCES),
        samples=Samples(table=TABLE, columns=COLUMNS, features=FEATURES, label_column="label", label_name=label_name,
                        split_unit="patient", shared=True),
        lineage=ehr_lineage(TABLE, partial(build_outcome, sql), exclusions=sql.cohort_exclusions()), **fields)
