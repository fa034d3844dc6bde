"""Task `mortality`: in-hospital death during an admission, from that admission's own codes.

Rule, per admission of the dataset (one row per hadm_id, as in medtx.samples.common.create_visits):
- label = raw.admissions.hospital_expire_flag = 1 (MIMIC-III: the patient died during this stay);
- features = the admission's distinct diagnoses, procedures and mapped ATC-3 drugs, each as a one-visit
  history [[codes]] so every EHR model reads them like samples.readmission (no history: later admissions
  of a patient who died cannot exist, earlier ones would leak nothing but are left out to keep the task
  "this stay only");
- admissions whose flag is NULL are left out and counted (`admissions_without_flag` in the summary), never
  guessed as survivors; admissions with no code at all are kept (a model must still score them).
Split: by patient, like the other EHR tasks. Rows live in the generic samples.admission_outcome table.
"""

from __future__ import annotations

import duckdb

from medtx.tasks.base import EHR_VISIT_READS, SAMPLE_EXTRAS, BuildContext, Task

NAME = "mortality"
TABLE = "samples.admission_outcome"

SAMPLES_SQL = """
    SELECT $dataset AS dataset, $task AS task, subject_id, hadm_id, admittime,
           [conditions] AS conditions, [procedures] AS procedures, [drugs] AS drugs,
           hospital_expire_flag = 1 AS label
    FROM _samples_visits
    WHERE hospital_expire_flag IS NOT NULL"""

VOCAB = {"conditions": "conditions[-1]", "procedures": "procedures[-1]", "drugs": "drugs[-1]"}


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite this task's rows of samples.admission_outcome (+ splits, vocab, summary) for one dataset."""
    from medtx.samples.common import EmptyCohortError, store_task, unknown_code_counts, visit_stats

    con.execute(f"CREATE OR REPLACE TEMP TABLE _samples_{NAME} AS {SAMPLES_SQL}",
                {"dataset": ctx.dataset, "task": NAME})
    stats = visit_stats(con)
    n, patients, positives = con.sql(
        f"SELECT count(*), count(DISTINCT subject_id), count(*) FILTER (WHERE label) FROM _samples_{NAME}"
    ).fetchall()[0]
    if n == 0:
        raise EmptyCohortError(f"{NAME}: dataset {ctx.dataset!r} has no admission with a hospital_expire_flag "
                               f"in raw.admissions ({stats['cohort_visits']} admissions)")
    figures = {"samples": n, "patients": patients, "positives": positives, "positive_rate": positives / n,
               "admissions_without_flag": stats["cohort_visits"] - n, **stats, **unknown_code_counts(con)}
    store_task(con, dataset=ctx.dataset, task=NAME, source=f"_samples_{NAME}", target=TABLE, seed=ctx.seed,
               fractions=ctx.fractions, min_count=ctx.min_count, vocab=VOCAB, figures=figures, shared=True)
    return n


TASK = Task(
    name=NAME,
    kind="binary",
    family="ehr",
    sample_table=TABLE,
    sample_columns=("dataset", "task", "subject_id", "hadm_id", "admittime", "conditions", "procedures", "drugs",
                    "label"),
    features=("conditions", "procedures", "drugs"),
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
    writes=(TABLE, *SAMPLE_EXTRAS),
    shared_table=True,
    # Every EHR model serving a binary task but these: BEHRT needs ages, and the oracle has no rule for this
    # outcome (copy_last and seq2seq serve no binary task).
    excluded_models=("behrt", "oracle"),
    order=40,
    description="in-hospital death (binary) from the admission's diagnoses, procedures and drugs",
)
