"""Static tokens: the one allow-list of admission and patient columns a task may turn into tokens, with their
time rules.

A static token is not an event: it reads `<PREFIX>//<value>` (`AGE//60-69`, `SEX//F`) and comes from one column
of raw.admissions or raw.patients, known at a stated time. This module is the only place that says which columns
may become static tokens and when each is known; a task names the prefixes it uses (`Task.clock.static_tokens`), its
builder takes the token list from `static_tokens_sql` (it never writes its own), and the leakage gate
(medtx.tasks.leakage) recomputes every static token of every sample from here: a token whose prefix is not
declared here has no time rule and blocks the task, and so does a token known only after the sample's prediction
time (a discharge-time column in a task that predicts before discharge).

| prefix               | column(s)                                      | known at                                        |
|----------------------|------------------------------------------------|-------------------------------------------------|
| `AGE`                | raw.patients.dob, raw.admissions.admittime     | admittime (age at admission, 10-year band)      |
| `SEX`                | raw.patients.gender                            | admittime                                       |
| `ADMISSION_TYPE`     | raw.admissions.admission_type                  | admittime                                       |
| `ADMISSION_LOCATION` | raw.admissions.admission_location              | admittime                                       |
| `INSURANCE`          | raw.admissions.insurance                       | admittime                                       |
| `DISCHARGE_LOCATION` | raw.admissions.discharge_location              | dischtime (only known at discharge)             |
| `LOS`                | raw.admissions.dischtime - admittime (days)    | dischtime (length of stay: known at discharge)  |
| `EXPIRE_FLAG`        | raw.admissions.hospital_expire_flag            | dischtime (the in-hospital outcome)             |
| `DIED`               | raw.admissions.deathtime                       | deathtime, else dischtime                       |

The discharge-time rows are declared so that a task predicting at discharge may use them honestly, and so that
the gate can name the column when a task predicting earlier holds them. Age is the age at admission (whole
years, capped at medtx.samples.common.AGE_CAP), as medtx.samples.common.create_visits computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SEPARATOR = "//"
AGE_CAP = 90  # medtx.samples.common.AGE_CAP (not imported: that module imports DuckDB)


@dataclass(frozen=True)
class StaticColumn:
    prefix: str  # the token's prefix: tokens read '<prefix>//<value>'
    column: str  # the source column(s), for messages and docs
    known_sql: str  # SQL over one admission (STATIC_SOURCE_SQL's columns): when the value is known
    known: str  # the same, in words
    value_sql: str  # SQL over STATIC_SOURCE_SQL's columns: the token's value (never NULL)


def _text(column: str) -> str:
    return f"coalesce(nullif(upper(trim({column})), ''), 'UNKNOWN')"


STATIC_COLUMNS: tuple[StaticColumn, ...] = (
    StaticColumn("AGE", "raw.patients.dob", "admittime", "at admission",
                 "CASE WHEN age IS NULL THEN 'UNKNOWN' ELSE (age // 10 * 10) || '-' || (age // 10 * 10 + 9) END"),
    StaticColumn("SEX", "raw.patients.gender", "admittime", "at admission",
                 "CASE WHEN gender IN ('F', 'M') THEN gender ELSE 'UNKNOWN' END"),
    StaticColumn("ADMISSION_TYPE", "raw.admissions.admission_type", "admittime", "at admission",
                 _text("admission_type")),
    StaticColumn("ADMISSION_LOCATION", "raw.admissions.admission_location", "admittime", "at admission",
                 _text("admission_location")),
    StaticColumn("INSURANCE", "raw.admissions.insurance", "admittime", "at admission", _text("insurance")),
    StaticColumn("DISCHARGE_LOCATION", "raw.admissions.discharge_location", "dischtime", "only at discharge",
                 _text("discharge_location")),
    StaticColumn("LOS", "raw.admissions.dischtime (length of stay)", "dischtime", "only at discharge",
                 "coalesce(CAST(date_diff('day', admittime, dischtime) AS VARCHAR), 'UNKNOWN')"),
    StaticColumn("EXPIRE_FLAG", "raw.admissions.hospital_expire_flag", "dischtime", "only at discharge",
                 "coalesce(CAST(hospital_expire_flag AS VARCHAR), 'UNKNOWN')"),
    StaticColumn("DIED", "raw.admissions.deathtime", "coalesce(deathtime, dischtime)", "at death, else discharge",
                 "CASE WHEN deathtime IS NULL THEN 'NO' ELSE 'YES' END"),
)
BY_PREFIX = {c.prefix: c for c in STATIC_COLUMNS}

# One row per admission of `$dataset` with every column a static token may read (the first raw row per hadm_id,
# as medtx.samples.common.create_visits; the patient's first gender row by row_id and earliest dob).
STATIC_SOURCE_SQL = f"""
    WITH adm AS (
        SELECT subject_id, hadm_id, admittime, dischtime, deathtime, admission_type, admission_location,
               discharge_location, insurance, hospital_expire_flag
        FROM raw.admissions
        WHERE dataset = $dataset AND hadm_id IS NOT NULL AND subject_id IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY hadm_id ORDER BY row_id NULLS LAST, admittime) = 1
    ), pat AS (
        SELECT subject_id, min(dob) AS dob, upper(trim(first(gender ORDER BY row_id NULLS LAST))) AS gender
        FROM raw.patients WHERE dataset = $dataset GROUP BY 1
    )
    SELECT adm.*, pat.gender,
           CAST(least({AGE_CAP}, greatest(0, date_part('year', age(adm.admittime, pat.dob)))) AS INTEGER) AS age
    FROM adm LEFT JOIN pat USING (subject_id)"""


class StaticTokenError(ValueError):
    """A task names a static token prefix that has no time rule here (one line: task, prefix, allowed ones)."""


def check_prefixes(task: str, prefixes: Sequence[str]) -> None:
    """Refuse a prefix without a time rule, naming the task, the prefix and the declared columns."""
    for prefix in prefixes:
        if prefix not in BY_PREFIX:
            allowed = ", ".join(f"{c.prefix} ({c.column})" for c in STATIC_COLUMNS)
            raise StaticTokenError(f"task {task!r}: static token prefix {prefix!r} comes from no column with a time "
                                   f"rule (medtx/samples/static.py declares: {allowed})")


def _text_sql(text: str) -> str:
    """A SQL string literal of a declared prefix (code constants; quotes doubled all the same)."""
    return "'" + text.replace("'", "''") + "'"


def static_tokens_sql(task: str, prefixes: Sequence[str]) -> str:
    """SQL: `hadm_id, static` for every admission of `$dataset`, `static` one visit of the named tokens in the
    given order (VARCHAR[][]). Refuses (StaticTokenError) a prefix without a time rule."""
    check_prefixes(task, prefixes)
    tokens_sql = ", ".join(f"{_text_sql(p + SEPARATOR)} || ({BY_PREFIX[p].value_sql})" for p in prefixes)
    return f"SELECT hadm_id, [[{tokens_sql}]] AS static FROM ({STATIC_SOURCE_SQL})"


def static_truth_sql() -> str:
    """SQL: `hadm_id, prefix, token, known` for every admission of `$dataset` and every declared column: what each
    static token of that admission is, and when it is known (the gate compares sample tokens with it)."""
    parts = [f"SELECT hadm_id, {_text_sql(c.prefix)} AS prefix, {_text_sql(c.prefix + SEPARATOR)} || ({c.value_sql}) AS token, "
             f"CAST(({c.known_sql}) AS TIMESTAMP) AS known FROM src" for c in STATIC_COLUMNS]
    return f"WITH src AS ({STATIC_SOURCE_SQL}) " + " UNION ALL ".join(parts)
