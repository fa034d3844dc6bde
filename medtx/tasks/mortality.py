"""Task `mortality`: in-hospital death, predicted 48 hours after admission from what is known then.

The definition of the MIMIC benchmarks (Harutyunyan et al. 2019) and MEDS-DEV's in-hospital mortality task, on
the tables medtx loads (no vitals or labs). Per admission of the dataset (one row per hadm_id):
- prediction time = admittime + 48 hours;
- cohort: the admission has admittime, dischtime and hospital_expire_flag; it lasts more than 48 hours
  (dischtime after the prediction time, so the discharge is never visible at it; as the ACES config and
  PyHealth's "longer than 48 h"); the patient is alive at the prediction time (deathtime, when present,
  after it). Every exclusion is counted in the summary (`excluded_*`), never guessed;
- label = hospital_expire_flag = 1 (death before discharge);
- features = what the clock (medtx.samples.clock) shows at the prediction time, through the one history relation
  (medtx.samples.common.create_history): the diagnoses and procedures of the patient's earlier admissions (coded
  at their discharge; the current stay's own codes, assigned at its discharge, are never visible), the drugs of
  earlier admissions and those of this stay whose start day ended by the prediction time; one visit per
  admission, the current one last (its diagnoses/procedures lists are empty);
- `static` = one visit of three tokens known at admission, taken from the allow-list of medtx.samples.static
  (`STATIC_TOKENS`): `AGE//<decade>` (age at admission in whole years, capped at 90, in 10-year bands:
  `AGE//60-69`; `AGE//UNKNOWN` without a birth date), `SEX//<F|M|UNKNOWN>`,
  `ADMISSION_TYPE//<EMERGENCY|ELECTIVE|URGENT|NEWBORN|UNKNOWN>`. Every EHR model reads it as one more feature
  column (its single visit lines up with the current admission).
Split: by patient, like the other EHR tasks. Rows live in the generic samples.admission_outcome table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import EHR_SAMPLE_EXTRAS, EHR_VISIT_READS, BuildContext, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

NAME = "mortality"
TABLE = "samples.admission_outcome"
PREDICTION_TIME = "admittime + INTERVAL 48 HOUR"

# Every admission with its exclusion reason (NULL: in the cohort), first reason that applies.
COHORT_SQL = f"""
    SELECT subject_id, hadm_id,
           CASE WHEN hospital_expire_flag IS NULL THEN 'without_flag'
                WHEN admittime IS NULL OR dischtime IS NULL THEN 'without_times'
                WHEN dischtime <= {PREDICTION_TIME} THEN 'under_48h'
                WHEN deathtime IS NOT NULL AND deathtime <= {PREDICTION_TIME} THEN 'died_by_48h'
           END AS excluded
    FROM _samples_visits"""

INDEX_SQL = f"SELECT subject_id, hadm_id FROM ({COHORT_SQL}) WHERE excluded IS NULL"

STATIC_TOKENS = ("AGE", "SEX", "ADMISSION_TYPE")  # medtx.samples.static: each known at admission


def samples_sql() -> str:
    """The sample rows: history features, the static tokens of medtx.samples.static, the label."""
    from medtx.samples.static import static_tokens_sql

    return f"""
    SELECT $dataset AS dataset, $task AS task, h.subject_id, h.hadm_id, v.admittime, h.prediction_time,
           h.conditions, h.procedures, h.drugs, st.static, v.hospital_expire_flag = 1 AS label
    FROM _samples_history h JOIN _samples_visits v USING (hadm_id)
    JOIN ({static_tokens_sql(NAME, STATIC_TOKENS)}) st USING (hadm_id)"""


# Histories hold admissions that are no sample themselves (stays under 48 h), and the current admission's codes
# are hidden: the vocabularies count every code of the whole visible history.
VOCAB = {"conditions": "flatten(conditions)", "procedures": "flatten(procedures)", "drugs": "flatten(drugs)",
         "static": "static[-1]"}


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite this task's rows of samples.admission_outcome (+ splits, vocab, summary) for one dataset."""
    from medtx.samples.common import (
        EmptyCohortError, create_history, drop_history, store_task, unknown_code_counts, visit_stats,
    )

    excluded = dict(con.sql(f"SELECT excluded, count(*) FROM ({COHORT_SQL}) GROUP BY 1").fetchall())
    stats = visit_stats(con)
    create_history(con, ctx.dataset, PREDICTION_TIME, INDEX_SQL)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _samples_{NAME} AS {samples_sql()}",
                {"dataset": ctx.dataset, "task": NAME})
    drop_history(con)
    n, patients, positives = con.sql(
        f"SELECT count(*), count(DISTINCT subject_id), count(*) FILTER (WHERE label) FROM _samples_{NAME}"
    ).fetchall()[0]
    counts = {f"excluded_{reason}": excluded.get(reason, 0)
              for reason in ("without_flag", "without_times", "under_48h", "died_by_48h")}
    if n == 0:
        raise EmptyCohortError(f"{NAME}: dataset {ctx.dataset!r} has no admission of at least 48 hours with the "
                               f"patient alive at 48 hours and a hospital_expire_flag ({stats['cohort_visits']} "
                               f"admissions; excluded: {counts})")
    figures = {"samples": n, "patients": patients, "positives": positives, "positive_rate": positives / n,
               "admissions_without_flag": counts["excluded_without_flag"], **counts, **stats,
               **unknown_code_counts(con)}
    store_task(con, dataset=ctx.dataset, task=NAME, source=f"_samples_{NAME}", target=TABLE, seed=ctx.seed,
               fractions=ctx.fractions, min_count=ctx.min_count, vocab=VOCAB, figures=figures, shared=True)
    return n


TASK = Task(
    name=NAME,
    kind="binary",
    family="ehr",
    sample_table=TABLE,
    sample_columns=("dataset", "task", "subject_id", "hadm_id", "admittime", "prediction_time", "conditions",
                    "procedures", "drugs", "static", "label"),
    features=("conditions", "procedures", "drugs", "static"),
    label_column="label",
    label_name="in_hospital_death",
    split_unit="patient",
    metrics=("auroc", "auprc", "rp80"),
    monitor="auprc",
    # paired verdicts against the reference baseline, as readmission (without them the leaderboard ranked its
    # models on point estimates alone)
    compared=(("auprc", "none"), ("rp80", "none")),
    build=build,
    reads=EHR_VISIT_READS,
    writes=(TABLE, *EHR_SAMPLE_EXTRAS),
    shared_table=True,
    # Every EHR model serving a binary task but BEHRT (it needs per-visit ages); the oracle scores the synthetic
    # cohorts' ORACLE_MORTALITY (copy_last and seq2seq serve no binary task).
    excluded_models=("behrt",),
    prediction_time=PREDICTION_TIME,
    clock="48 hours after admission (MIMIC benchmark, Harutyunyan et al. 2019)",
    observation_window=("earlier admissions (their codes, known at their discharge) and this stay's drugs whose "
                        "start day ended within its first 48 hours; age, sex and admission type"),
    feature_sources=(("conditions", "diagnosis"), ("procedures", "procedure"), ("drugs", "drug"),
                     ("static", "static")),
    static_tokens=STATIC_TOKENS,
    outcome="in-hospital death (hospital_expire_flag), known at death or discharge",
    outcome_known="least(dischtime, coalesce(deathtime, dischtime))",
    order=40,
    description="in-hospital death (binary) at 48 h after admission, from earlier admissions, early drugs and "
                "demographics",
)
