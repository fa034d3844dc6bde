"""Plausibility checks at ingest (issue 34, case 17): rows that parse but cannot be true.

They run inside the write path's one transaction (medtx.ingest.writepath.RawWriter.replacing), over the dataset's
rows as the import left them — so every importer (CSV, MEDS) is checked by the same rules — and before the
row-count guard. Each rule names the raw table whose rows break it; per rule, the count and one example go to
`raw.ingest_checks` (migration 0016: replaced per dataset at each ingest) and the log. The policy decides:

- `warn` (default): keep the rows, report;
- `reject`: move the offending rows to `raw.ingest_rejects` (error_type `PLAUSIBILITY`, the row as JSON in
  raw_line) — then the row-count guard still applies to what is left;
- `fail`: one line naming the rule, the count and an example; nothing is changed.

Rules: the same subject_id (patients) or hadm_id (admissions) twice with different data; dischtime before
admittime; birth (dob) after the admission; a year outside 1750..2300 (MIMIC shifts dates into 2100-2200 and
the DOB of patients over 89 by 300 years, to ~1800-1910); an MTSamples note_id twice with different text.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import duckdb

from medtx.ingest.loader import IngestError
from medtx.store.db import quote_ident, quote_table, sql_literal

log = logging.getLogger("medtx.ingest")

POLICIES = ("warn", "reject", "fail")
YEARS = (1750, 2300)


class ImplausibleData(IngestError):
    """A plausibility rule found rows and the policy is `fail`; nothing was changed."""


@dataclass(frozen=True)
class Rule:
    name: str
    table: str  # the raw table whose rows break the rule
    says: str  # what is wrong, for the message
    where_sql: str  # condition over `t` (a row of `table` of dataset $d), code only
    example_sql: str  # text naming one offending row, code only


def _years_sql(*columns: str) -> str:
    """A year outside YEARS in any of `columns` (code constants) of `t`."""
    low, high = YEARS
    return " OR ".join(f"year(t.{quote_ident(c)}) NOT BETWEEN {int(low)} AND {int(high)}" for c in columns)


def _years_example_sql(key: str, *columns: str) -> str:
    parts_sql = " || ', ' || ".join(f"{sql_literal(c + ' ')} || coalesce(CAST(t.{quote_ident(c)} AS VARCHAR), '-')"
                                    for c in columns)
    return f"{sql_literal(key + ' ')} || t.{quote_ident(key)} || ': ' || {parts_sql}"


RULES: tuple[Rule, ...] = (
    Rule("duplicate_subject", "raw.patients", "the same subject_id twice with different data",
         "t.subject_id IN (SELECT subject_id FROM raw.patients WHERE dataset = $d GROUP BY 1 "
         "HAVING count(DISTINCT (gender, dob, dod)) > 1)",
         "'subject_id ' || t.subject_id"),
    Rule("duplicate_hadm", "raw.admissions", "the same hadm_id twice with different data",
         "t.hadm_id IN (SELECT hadm_id FROM raw.admissions WHERE dataset = $d GROUP BY 1 "
         "HAVING count(DISTINCT (subject_id, admittime, dischtime)) > 1)",
         "'hadm_id ' || t.hadm_id"),
    Rule("discharge_before_admission", "raw.admissions", "dischtime before admittime",
         "t.dischtime < t.admittime",
         "'hadm_id ' || t.hadm_id || ': admittime ' || t.admittime || ', dischtime ' || t.dischtime"),
    Rule("birth_after_admission", "raw.admissions", "the patient's dob after the admission",
         "EXISTS (SELECT 1 FROM raw.patients p WHERE p.dataset = $d AND p.subject_id = t.subject_id "
         "AND p.dob > t.admittime)",
         "'hadm_id ' || t.hadm_id || ' of subject_id ' || t.subject_id || ': admittime ' || t.admittime"),
    Rule("implausible_year", "raw.patients", f"a year outside {YEARS[0]}..{YEARS[1]}",
         _years_sql("dob", "dod"), _years_example_sql("subject_id", "dob", "dod")),
    Rule("implausible_year", "raw.admissions", f"a year outside {YEARS[0]}..{YEARS[1]}",
         _years_sql("admittime", "dischtime", "deathtime"),
         _years_example_sql("hadm_id", "admittime", "dischtime", "deathtime")),
    Rule("implausible_year", "raw.prescriptions", f"a year outside {YEARS[0]}..{YEARS[1]}",
         _years_sql("startdate", "enddate"), _years_example_sql("hadm_id", "startdate", "enddate")),
    Rule("duplicate_note", "raw.mtsamples", "the same note_id twice with different text",
         "t.note_id IN (SELECT note_id FROM raw.mtsamples GROUP BY 1 "
         "HAVING count(DISTINCT (description, transcription)) > 1)",
         "'note_id ' || t.note_id"),
)
_NO_DATASET = {"raw.mtsamples"}  # one corpus: checked when the mtsamples "dataset" is ingested
MTSAMPLES_DATASET = "mtsamples"


@dataclass(frozen=True)
class Finding:
    rule: str
    table: str
    rows: int
    example: str
    says: str


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"plausibility policy {policy!r}: allowed {', '.join(POLICIES)}")
    return policy


def _applies(rule: Rule, dataset: str) -> bool:
    return (rule.table in _NO_DATASET) == (dataset == MTSAMPLES_DATASET)


def _scope_sql(rule: Rule) -> str:
    return "TRUE" if rule.table in _NO_DATASET else "t.dataset = $d"


def _params(rule: Rule, dataset: str) -> dict[str, str]:
    """$d when the rule's SQL uses it (DuckDB refuses a named parameter the query lacks)."""
    return {"d": dataset} if rule.table not in _NO_DATASET or "$d" in rule.where_sql else {}


def check_plausibility(con: duckdb.DuckDBPyConnection, dataset: str, policy: str,
                       labels: Mapping[str, str] | None = None) -> list[Finding]:
    """Run every rule on `dataset`'s rows inside the caller's transaction; apply `policy`; record the findings
    in raw.ingest_checks (replacing the dataset's). Returns what was found."""
    check_policy(policy)
    labels = labels or {}
    findings: list[Finding] = []
    for rule in RULES:
        if not _applies(rule, dataset):
            continue
        rows = con.execute(
            f"SELECT count(*), min({rule.example_sql}) FROM {quote_table(rule.table)} t "
            f"WHERE {_scope_sql(rule)} AND ({rule.where_sql})", _params(rule, dataset)).fetchall()[0]
        if rows[0]:
            findings.append(Finding(rule.name, rule.table, rows[0], rows[1] or "", rule.says))
    if findings and policy == "fail":
        f = findings[0]
        label = labels.get(f.table) or labels.get("*") or dataset
        more = f"; {len(findings) - 1} other rule(s) also found rows" if len(findings) > 1 else ""
        raise ImplausibleData(
            f"{label}: {f.table} [{dataset}]: {f.rows:,} row(s) with {f.says} (rule {f.rule}; e.g. {f.example})"
            f"{more}; nothing was changed — plausibility policy 'fail' (pass --plausibility warn or reject)")
    if findings and policy == "reject":
        for rule in RULES:
            if _applies(rule, dataset) and any(f.rule == rule.name and f.table == rule.table for f in findings):
                _reject(con, rule, dataset, labels)
    now = datetime.now()
    con.execute("DELETE FROM raw.ingest_checks WHERE dataset = ?", [dataset])
    for f in findings:
        con.execute("INSERT INTO raw.ingest_checks VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [dataset, f.table, f.rule, f.rows, policy, f.example, now])
        log.warning("%s [%s]: %d row(s) with %s (rule %s, e.g. %s): %s", f.table, dataset, f.rows, f.says, f.rule,
                    f.example, "moved to raw.ingest_rejects" if policy == "reject" else "kept")
    return findings


def _reject(con: duckdb.DuckDBPyConnection, rule: Rule, dataset: str, labels: Mapping[str, str]) -> None:
    """Move the rule's rows of the dataset from its table to raw.ingest_rejects (the row as JSON)."""
    params = _params(rule, dataset)
    table_sql = quote_table(rule.table)
    label = labels.get(rule.table) or labels.get("*") or dataset
    con.execute(
        f"""INSERT INTO raw.ingest_rejects (dataset, table_name, file, column_name, error_type, error, raw_line,
                                            ingested_at)
            SELECT $dataset, $name, $file, NULL, 'PLAUSIBILITY', $error, CAST(to_json(t) AS VARCHAR), $now
            FROM {table_sql} t WHERE {_scope_sql(rule)} AND ({rule.where_sql})""",
        {**params, "dataset": dataset, "name": rule.table.split(".", 1)[1], "file": label,
         "error": f"{rule.name}: {rule.says}", "now": datetime.now()})
    con.execute(f"DELETE FROM {table_sql} WHERE rowid IN (SELECT t.rowid FROM {table_sql} t "
                f"WHERE {_scope_sql(rule)} AND ({rule.where_sql}))", params)
