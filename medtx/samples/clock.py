"""The event-time rule of every MIMIC-III table medtx reads, stated once: when is an event *known*?

Every task declares a prediction time (`Task.clock.prediction_time`, an expression over its index admission's
`admittime` and `dischtime`); a feature may only hold events known at or before it (MEDS: "up to and
including"). This module (part of the sample-building kit, medtx.samples) is the one place that says when
each table's events become known; the sample builders (medtx.samples.common.create_history), the leakage gate
(medtx.tasks.leakage) and the MEDS export read the times from here instead of restating them.

The rules (each conservative: an event is never counted as known before it could have been):

| source      | table                                   | known at                                                          |
|-------------|-----------------------------------------|-------------------------------------------------------------------|
| `diagnosis` | raw.diagnoses_icd                       | the stay's `dischtime` (ICD-9 codes are assigned after discharge)  |
| `procedure` | raw.procedures_icd                      | the stay's `dischtime` (coded after discharge, like diagnoses)     |
| `drug`      | core.prescriptions_atc3 (code = ATC-3)  | `startdate` is a date, not a time: the last instant of that day    |
|             |                                         | (23:59:59.999999), clamped into the stay: never before `admittime`,|
|             |                                         | never after `dischtime`; no `startdate`: the stay's `dischtime`.   |
|             |                                         | A start date on a later day than the discharge: no event (dropped) |
| `note`      | raw.noteevents (code = category)        | `charttime`; a note with only `chartdate`: the last instant of that|
|             |                                         | day. Not clamped (discharge summaries are often written after      |
|             |                                         | discharge). Rows marked `iserror = '1'` are not events.            |

Why the end of the day: MIMIC-III's PRESCRIPTIONS.startdate carries no time of day, so a drug started on the day
of admission may have started an hour before the prediction time or twenty hours after it. Counting it at the
end of its day means a 48-hour window sees only drugs whose whole start day lies inside the window - some drugs
started in the window are missed, none started after it is seen. Clamping to the stay keeps a prescription of
one stay from ever appearing before that stay began (about 21% of midnight-stamped starts preceded their own
admission in the old MEDS export). A prescription dated after its stay's discharge (its start day begins
after `dischtime`: 15 of 8,417 mapped rows, 7 stays, on the demo) is no event of the stay at all: moved to the
discharge time, as medtx once did, it became a discharge-time feature (of a task predicting at discharge) that
was not known then. It is dropped from every feature, from the stay's drug set
(`medtx.samples.common.create_visits`, a label of drug sets) and from the MEDS export; the builders count it
(`prescriptions_after_discharge` in samples.task_summary).

An event with no known time (a diagnosis of a stay without `dischtime`) has `time` NULL and is visible to no
prediction time (`time <= prediction_time` is never true for NULL).

Stays are the dataset's admissions, one row per hadm_id (the first by row_id, as medtx.samples.common does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import duckdb

SOURCES = ("diagnosis", "procedure", "drug", "note")
EVENT_COLUMNS = ("subject_id", "hadm_id", "source", "code", "time")

# The last instant of a date-only value's day.
END_OF_DAY = "(date_trunc('day', {value}) + INTERVAL 1 DAY - INTERVAL 1 MICROSECOND)"


def end_of_day_sql(value: str) -> str:
    """SQL: the last instant (23:59:59.999999) of the day of `value` (a date or a timestamp)."""
    return END_OF_DAY.format(value=value)


def drug_time_sql(startdate: str = "startdate", admittime: str = "admittime", dischtime: str = "dischtime") -> str:
    """SQL: when a prescription is known, from its start date and its stay's admission and discharge times.

    The end of the start date's day, never before `admittime` and never after `dischtime`; without a start
    date, the stay's `dischtime`. (The column names are SQL expressions of the caller's query.)"""
    known = f"coalesce({end_of_day_sql(startdate)}, {dischtime})"
    return (f"CASE WHEN {known} < {admittime} THEN {admittime} "
            f"WHEN {known} > {dischtime} THEN {dischtime} ELSE {known} END")


def drug_after_discharge_sql(startdate: str = "startdate", dischtime: str = "dischtime") -> str:
    """SQL: TRUE when a prescription is dated after its stay's discharge (its start day begins after `dischtime`),
    so it is dropped, not clamped; FALSE without a start date or a discharge time."""
    return f"coalesce(date_trunc('day', {startdate}) > {dischtime}, false)"


def note_time_sql(charttime: str = "charttime", chartdate: str = "chartdate") -> str:
    """SQL: when a note is known: its chart time, else the end of its chart date."""
    return f"coalesce({charttime}, {end_of_day_sql(chartdate)})"


# A discharge summary (NOTEEVENTS category 'Discharge summary', error rows and empty texts dropped), as `n`.
DISCHARGE_SUMMARY_SQL = ("lower(trim(n.category)) = 'discharge summary' AND coalesce(trim(n.iserror), '') <> '1' "
                         "AND nullif(trim(n.text), '') IS NOT NULL")


def next_admission_sql(subject_sql: str, admittime_sql: str) -> str:
    """SQL: when the patient's next admission began (the first strictly later admittime of raw.admissions in
    `$dataset`), NULL when there is none. `subject_sql`, `admittime_sql`: SQL expressions of the caller's stay."""
    return (f"(SELECT min(a2.admittime) FROM raw.admissions a2 WHERE a2.dataset = $dataset "
            f"AND a2.subject_id = {subject_sql} AND a2.admittime > {admittime_sql})")


def usable_note_sql(note_time: str, subject: str, admittime: str, until: str | None = None) -> str:
    """SQL predicate: a note of the stay known at `note_time` may be a feature: it was charted before the patient's
    next admission began (and before `until`, e.g. when the task's outcome is known). Notes follow the clock: a
    note is a feature only from its chart time, and never once a later stay has begun."""
    nxt = next_admission_sql(subject, admittime)
    bound = f" AND {note_time} < ({until})" if until else ""
    return f"(({nxt}) IS NULL OR {note_time} < ({nxt})){bound}"


def summary_time_sql(hadm_sql: str, subject: str, admittime: str, until: str | None = None) -> str:
    """SQL: the chart time (this module's note rule) of the stay's last discharge summary that may be a feature
    (`usable_note_sql`); NULL when none. The clock of a task that reads the discharge summary (readmission_notes):
    its prediction time, recomputed by the leakage gate from raw.noteevents."""
    time_sql = note_time_sql("n.charttime", "n.chartdate")
    return (f"(SELECT max({time_sql}) FROM raw.noteevents n WHERE n.dataset = $dataset AND n.hadm_id = {hadm_sql} "
            f"AND {DISCHARGE_SUMMARY_SQL} AND {usable_note_sql(time_sql, subject, admittime, until)})")


# Diagnoses and procedures: at the stay's discharge.
CODED_AT_DISCHARGE = "dischtime"

STAYS_SQL = """
    SELECT subject_id, hadm_id, admittime, dischtime, deathtime
    FROM raw.admissions
    WHERE dataset = $dataset AND hadm_id IS NOT NULL AND subject_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY hadm_id ORDER BY row_id NULLS LAST, admittime) = 1"""


def events_sql() -> str:
    """One SELECT of every timed event of one dataset (parameter `$dataset`), columns EVENT_COLUMNS.

    The subject is the stay's (raw.admissions), so an event row can never be attached to another patient than
    its admission's. Codes are trimmed; empty codes are not events."""
    return f"""
        WITH stays AS ({STAYS_SQL}),
        dx AS (
            SELECT s.subject_id, s.hadm_id, 'diagnosis' AS source, trim(d.icd9_code) AS code,
                   s.{CODED_AT_DISCHARGE} AS time
            FROM raw.diagnoses_icd d JOIN stays s USING (hadm_id)
            WHERE d.dataset = $dataset AND nullif(trim(d.icd9_code), '') IS NOT NULL
        ), px AS (
            SELECT s.subject_id, s.hadm_id, 'procedure' AS source, trim(p.icd9_code) AS code,
                   s.{CODED_AT_DISCHARGE} AS time
            FROM raw.procedures_icd p JOIN stays s USING (hadm_id)
            WHERE p.dataset = $dataset AND nullif(trim(p.icd9_code), '') IS NOT NULL
        ), rx AS (
            SELECT s.subject_id, s.hadm_id, 'drug' AS source, r.atc3 AS code,
                   {drug_time_sql('r.startdate', 's.admittime', 's.dischtime')} AS time
            FROM core.prescriptions_atc3 r JOIN stays s USING (hadm_id)
            WHERE r.dataset = $dataset AND NOT {drug_after_discharge_sql('r.startdate', 's.dischtime')}
        ), notes AS (
            SELECT n.subject_id, n.hadm_id, 'note' AS source, upper(trim(n.category)) AS code,
                   {note_time_sql('n.charttime', 'n.chartdate')} AS time
            FROM raw.noteevents n
            WHERE n.dataset = $dataset AND coalesce(trim(n.iserror), '') <> '1' AND n.subject_id IS NOT NULL
        )
        SELECT subject_id, hadm_id, source, code, CAST(time AS TIMESTAMP) AS time FROM dx
        UNION ALL SELECT subject_id, hadm_id, source, code, CAST(time AS TIMESTAMP) FROM px
        UNION ALL SELECT subject_id, hadm_id, source, code, CAST(time AS TIMESTAMP) FROM rx
        UNION ALL SELECT subject_id, hadm_id, source, CAST(code AS VARCHAR), CAST(time AS TIMESTAMP) FROM notes"""


def create_event_view(con: duckdb.DuckDBPyConnection, dataset: str, name: str = "_events") -> str:
    """(Re)create the temp table `name` holding every event of `dataset` with the time it becomes known.

    Columns: subject_id BIGINT, hadm_id BIGINT, source VARCHAR ('diagnosis' | 'procedure' | 'drug' | 'note'),
    code VARCHAR (ICD-9 code, ATC-3 code, note category), time TIMESTAMP (this module's rule). Materialised
    (a temp table, not a view) because the dataset is a bound parameter and builders read it several times.
    Returns `name`."""
    if not name.isidentifier():
        raise ValueError(f"event table name {name!r} is not a plain SQL identifier")
    # a plain identifier (checked above) quoted as such; no medtx.store import, so the task registry (which reads
    # this module's SQL helpers) stays loadable where DuckDB is absent (medtx.worker)
    ident_sql = f'"{name}"'
    con.execute(f"CREATE OR REPLACE TEMP TABLE {ident_sql} AS {events_sql()}", {"dataset": dataset})
    return name
