"""Task `readmission`: unplanned readmission within 30 days of discharge, from the admission's codes and the
patient's history (the corrected ClinicalBERT rule). Its record and its SQL (`samples.readmission`).

Rule, per admission A of a patient (admissions ordered by admittime, then hadm_id):
- A is excluded when the patient died in hospital (hospital_expire_flag = 1 or deathtime set), when A is a
  NEWBORN admission, or when A has no discharge time (it has no prediction time; it stays history).
- The *next admission* is the first later admission whose admission_type is not ELECTIVE (planned
  admissions are not readmissions; a later unplanned one still counts).
- label = that next admission starts less than 30 days (30 * 24 h) after A's discharge. An overlapping
  next admission (admittime before A's dischtime) counts as a readmission.
Features: the per-visit conditions/procedures/ATC-3 drugs of all the patient's admissions up to and
including A (excluded admissions still count as history). text = A's discharge summaries from NOTEEVENTS
(category 'Discharge summary', error rows dropped) charted before the patient's next admission began and within
the 30-day window, joined in chart order (NULL when there is none); text_time = the last one's chart time, the
prediction time of the note-text view (readmission_notes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import BINARY_SCORING, BuildContext, Clock, CohortExclusion, Samples, Task, ehr_lineage
from medtx.tasks.history import BINARY_FIGURES, HistoryRows

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

NAME = "readmission"
TABLE = "samples.readmission"
PREDICTION_TIME = "dischtime"

WINDOW_DAYS = 30

# The samples' index admissions: every admission but in-hospital deaths, newborns and stays without a
# discharge time, with its label (the first
# later non-elective admission within 30 days of discharge).
INDEX_SQL = """
    SELECT * FROM (
        SELECT subject_id, hadm_id, dischtime, hospital_expire_flag, deathtime, admission_type,
               min(CASE WHEN admission_type IS DISTINCT FROM 'ELECTIVE' THEN admittime END)
                   OVER (w ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_admittime
        FROM _samples_visits
        WINDOW w AS (PARTITION BY subject_id ORDER BY admittime NULLS LAST, hadm_id)
    ) WHERE coalesce(hospital_expire_flag, 0) <> 1 AND deathtime IS NULL
        AND admission_type IS DISTINCT FROM 'NEWBORN' AND dischtime IS NOT NULL"""

# INDEX_SQL's exclusions for the cohort flow, in its order (an admission takes the first that holds), each counted
# over the dataset's admissions
EXCLUSIONS = (
    CohortExclusion("in_hospital_death", "died in hospital (hospital_expire_flag = 1 or deathtime set)",
                    "coalesce(hospital_expire_flag, 0) = 1 OR deathtime IS NOT NULL", counted="admissions"),
    CohortExclusion("newborn", "NEWBORN admission", "admission_type = 'NEWBORN'", counted="admissions"),
    CohortExclusion("no_discharge_time", "no discharge time (no prediction time)", "dischtime IS NULL",
                    counted="admissions"),
)

# Features from the history relation (medtx.samples.common.create_history: what the clock shows at discharge).
# The note-text view (readmission_notes): the admission's discharge summaries that may be features by the note
# clock (medtx.samples.clock.usable_note_sql: charted before the patient's next admission began and before the
# 30-day window closed), in chart order, and `text_time`, the last one's chart time (that task's prediction time).
NOTES_UNTIL = f"v.dischtime + INTERVAL {WINDOW_DAYS} DAY"


def readmission_sql() -> str:
    """The sample rows: history features, the note text with its time_sql, the label."""
    from medtx.samples.clock import DISCHARGE_SUMMARY_SQL, note_time_sql, usable_note_sql

    time_sql = note_time_sql("n.charttime", "n.chartdate")
    return f"""
    WITH notes AS (
        SELECT n.hadm_id, string_agg(n.text, chr(10) || chr(10) ORDER BY n.chartdate, n.charttime, n.row_id) AS text,
               CAST(max({time_sql}) AS TIMESTAMP) AS text_time
        FROM raw.noteevents n JOIN _samples_visits v ON v.hadm_id = n.hadm_id
        WHERE n.dataset = $dataset AND {DISCHARGE_SUMMARY_SQL}
          AND {usable_note_sql(time_sql, 'v.subject_id', 'v.admittime', NOTES_UNTIL)}
        GROUP BY n.hadm_id
    )
    SELECT $dataset AS dataset, h.subject_id, h.hadm_id, v.admittime, v.dischtime, h.prediction_time,
           h.conditions, h.procedures, h.drugs, notes.text, notes.text_time,
           coalesce(date_diff('second', i.dischtime, i.next_admittime) < {WINDOW_DAYS} * 86400, false) AS label
    FROM _samples_history h JOIN ({INDEX_SQL}) i USING (hadm_id) JOIN _samples_visits v USING (hadm_id)
    LEFT JOIN notes USING (hadm_id)"""

VOCAB = {"conditions": "conditions[-1]", "procedures": "procedures[-1]", "drugs": "drugs[-1]"}


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    """Rewrite `samples.readmission` (+ splits, vocab, summary) for one dataset from `_samples_visits`."""
    rows = HistoryRows(task=NAME, table=TABLE, prediction_time=PREDICTION_TIME, index_sql=INDEX_SQL,
                       rows_sql=readmission_sql(), vocab=VOCAB,
                       figures={**BINARY_FIGURES, "samples_with_text": "count(text)"})
    return rows.build(con, ctx, empty=lambda stats: (
        f"readmission: dataset {ctx.dataset!r} has no admission left after excluding in-hospital deaths and "
        f"newborns ({stats['cohort_visits']} admissions)"))


TASK = Task(
    name=NAME,
    kind="binary",
    family="ehr",
    description="unplanned readmission within 30 days (binary), codes of the admission and history",
    order=30,
    clock=Clock(
        prediction_time=PREDICTION_TIME,
        words="at discharge of the admission",
        observation_window="every admission of the patient up to and including this one",
        feature_sources=(("conditions", "diagnosis"), ("procedures", "procedure"), ("drugs", "drug")),
        # Known at the latest when the 30-day window closes (a readmission overlapping the stay is known earlier;
        # the bound does not see the next admission).
        outcome="a non-elective admission within 30 days of discharge",
        outcome_known=f"dischtime + INTERVAL {WINDOW_DAYS} DAY",
    ),
    samples=Samples(
        table=TABLE,
        columns=("dataset", "subject_id", "hadm_id", "admittime", "dischtime", "prediction_time", "conditions",
                 "procedures", "drugs", "text", "text_time", "label"),
        features=("conditions", "procedures", "drugs"),
        label_column="label",
        label_name="readmission_30d",
        split_unit="patient",
    ),
    # EHR_VISIT_READS holds raw.noteevents: the discharge summaries, for the note-text view
    lineage=ehr_lineage(TABLE, build, exclusions=EXCLUSIONS),
    scoring=BINARY_SCORING,
    # models: every EHR model serving a binary task (the default; copy_last has no rule for a yes/no outcome
    # and seq2seq generates drug sets, so neither serves it)
)
