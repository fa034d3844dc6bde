"""Set-based SQL that turns loaded MEDS events (temp table, see medtx.meds.ingest) into raw MIMIC-format rows.

Steps: `rule_case` (used while loading) tags each event with the mapping rule its code starts with (longest
prefix wins), `create_rules` exposes the rule's target and the code's remainder through a view; `assign_stays` builds the stays and gives stay-bound events without a hadm_id the stay whose
window holds them; `write_raw` replaces the dataset's rows of the raw tables (inside the caller's
transaction); `write_accounting` records mapped and unmapped codes per prefix in raw.meds_codes.
"""

from __future__ import annotations

import duckdb

from medtx.store.db import quote_table, sql_literal
from medtx.meds.mapping import CodeMapping

RAW_TABLES = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents")
# Targets that belong to a stay: without a hadm_id they are placed by time (death only when the mapping says so).
STAY_BOUND = ("discharges", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents")
# Which raw table a rule's rows end up in, for the accounting.
ACCOUNT_TABLE = {"admissions": "admissions", "discharges": "admissions", "gender": "patients",
                 "birth": "patients", "death": "patients", "derived": "derived (not loaded)"}


# raw.meds_codes.target_table of medications coded by name (a DrugRule `field: name`): what tells `medtx
# map-codes` to map this dataset's prescriptions without an NDC through the bundled drug names (medtx.codes.mapping)
BY_NAME = "prescriptions (by name)"
EID_BITS = 40  # _eid = shard << 40 | row in shard: unique, in file order, and it fits a BIGINT
MAPPED = "_meds_mapped"  # view: the events with their rule's prefix, target, remainder, field and category


def rule_case_sql(mapping: CodeMapping) -> tuple[str, dict[str, str]]:
    """SQL giving the index (in `mapping.rules()` order: longest prefix first) of the rule `code` matches, and
    the named parameters (`$rule_prefix_<i>`) that bind the mapping's prefixes into it."""
    rules = mapping.rules()
    whens = " ".join(f"WHEN starts_with(code, $rule_prefix_{int(i)}) THEN {int(i)}" for i in range(len(rules)))
    return f"CASE {whens} END", {f"rule_prefix_{i}": p for i, (p, _, _) in enumerate(rules)}


def create_rules(con: duckdb.DuckDBPyConnection, events: str, mapping: CodeMapping) -> None:
    """The rules as a small table, and the view `_meds_mapped` joining each event to its rule."""
    con.execute("""CREATE OR REPLACE TEMP TABLE _meds_rules
                   (_rule INTEGER, _prefix VARCHAR, _target VARCHAR, _field VARCHAR, _category VARCHAR)""")
    rows = [(i, p, t, o.get("field"), o.get("category")) for i, (p, t, o) in enumerate(mapping.rules())]
    if rows:
        con.executemany("INSERT INTO _meds_rules VALUES (?, ?, ?, ?, ?)", rows)
    con.execute(f"""
        CREATE OR REPLACE TEMP VIEW {MAPPED} AS
        SELECT e.*, r._prefix, r._target, substr(e.code, length(r._prefix) + 1) AS _rest, r._field, r._category
        FROM {quote_table(events)} e LEFT JOIN _meds_rules r USING (_rule)""")


def _part_sql(i: int) -> str:
    """Segment i (1-based) of the code after its prefix; medtx's export writes UNKNOWN for a missing part."""
    return f"nullif(nullif(split_part(_rest, '//', {int(i)}), ''), 'UNKNOWN')"


def assign_stays(con: duckdb.DuckDBPyConnection, events: str, mapping: CodeMapping) -> None:
    """Create `_meds_stays` (one row per hadm_id) and fill the hadm_id of stay-bound events lacking one.

    An admission event without hadm_id gets a negative one (never clashing with a source id). A discharge
    without hadm_id closes the latest stay admitted at or before it; any other stay-bound event goes to the
    latest stay whose window (admission day .. discharge) holds its time, else keeps no stay.
    """
    con.execute(f"""
        UPDATE {quote_table(events)} SET hadm_id = -k.n FROM (
            SELECT _eid, row_number() OVER (ORDER BY subject_id, time, _eid) AS n
            FROM {MAPPED} WHERE _target = 'admissions' AND hadm_id IS NULL) k
        WHERE {quote_table(events)}._eid = k._eid""")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _meds_stays AS
        SELECT subject_id, hadm_id, arg_min(time, time) AS admittime, arg_min({_part_sql(1)}, time) AS admission_type,
               arg_min({_part_sql(2)}, time) AS admission_location, NULL::TIMESTAMP AS dischtime
        FROM {MAPPED} WHERE _target = 'admissions' GROUP BY subject_id, hadm_id""")
    _fill(con, events, ["discharges"], "s.admittime", "TRUE")
    con.execute(f"""
        UPDATE _meds_stays SET dischtime = d.t FROM (
            SELECT hadm_id, min(time) AS t FROM {MAPPED} WHERE _target = 'discharges' GROUP BY 1) d
        WHERE _meds_stays.hadm_id = d.hadm_id""")
    bound = [t for t in STAY_BOUND if t != "discharges"] + (["death"] if mapping.death_in_stay_by_time else [])
    _fill(con, events, bound, "date_trunc('day', s.admittime)", "(s.dischtime IS NULL OR e.time <= s.dischtime)")


def _fill(con, events: str, targets: list[str], start_sql: str, keep_sql: str) -> None:
    """hadm_id of the events of rule targets `targets` lacking one := the latest stay of the subject starting at
    or before them. `start_sql` / `keep_sql`: code-written expressions over the stay `s` and event `e`."""
    con.execute(f"""
        UPDATE {quote_table(events)} SET hadm_id = f.hadm_id FROM (
            SELECT e._eid, s.hadm_id
            FROM (SELECT _eid, subject_id, time FROM {MAPPED}
                  WHERE list_contains($targets, _target) AND hadm_id IS NULL AND time IS NOT NULL) e
            ASOF JOIN (SELECT *, {start_sql} AS _start FROM _meds_stays s) s
              ON e.subject_id = s.subject_id AND e.time >= s._start
            WHERE {keep_sql}) f
        WHERE {quote_table(events)}._eid = f._eid""", {"targets": targets})


def write_raw(con: duckdb.DuckDBPyConnection, dataset: str, mapping: CodeMapping) -> dict[str, int]:
    """Replace `dataset`'s rows of every raw MIMIC table from the events; returns rows per table.
    Event rows keep their `_eid` as row_id (unique, in file order: notes keep their order that way)."""
    # Built from code only: every value (dataset, died locations) is a bound parameter.
    selects_sql = {
        "patients": f"""
            SELECT subject_id, row_number() OVER (ORDER BY subject_id) AS row_id,
                   max(_rest) FILTER (WHERE _target = 'gender') AS gender,
                   min(time) FILTER (WHERE _target = 'birth') AS dob,
                   min(time) FILTER (WHERE _target = 'death') AS dod,
                   CAST(min(time) FILTER (WHERE _target = 'death') IS NOT NULL AS INTEGER) AS expire_flag
            FROM {MAPPED} GROUP BY subject_id""",
        "admissions": f"""
            SELECT s.subject_id, row_number() OVER (ORDER BY s.subject_id, s.admittime, s.hadm_id) AS row_id,
                   s.hadm_id, s.admittime, s.dischtime, d.deathtime, s.admission_type, s.admission_location,
                   g.discharge_location,
                   CAST(d.deathtime IS NOT NULL OR list_contains($died::VARCHAR[], upper(g.discharge_location)) AS INTEGER)
                       AS hospital_expire_flag
            FROM _meds_stays s
            LEFT JOIN (SELECT hadm_id, min(time) AS deathtime FROM {MAPPED}
                       WHERE _target = 'death' AND hadm_id IS NOT NULL GROUP BY 1) d USING (hadm_id)
            LEFT JOIN (SELECT hadm_id, arg_min(nullif(nullif(_rest, ''), 'UNKNOWN'), time) AS discharge_location
                       FROM {MAPPED} WHERE _target = 'discharges' GROUP BY 1) g USING (hadm_id)""",
        "diagnoses_icd": _code_rows_sql("diagnoses_icd"),
        "procedures_icd": _code_rows_sql("procedures_icd"),
        "prescriptions": f"""
            SELECT subject_id, _eid AS row_id, hadm_id, time AS startdate,
                   CASE WHEN _field IN ('drug', 'name') THEN coalesce(drug, _rest) ELSE drug END AS drug,
                   CASE WHEN _field = 'name' THEN coalesce(drug_name_generic, _rest) ELSE drug_name_generic END
                       AS drug_name_generic,
                   CASE WHEN _field = 'ndc' THEN _rest ELSE ndc END AS ndc, route
            FROM {MAPPED} WHERE _target = 'prescriptions'""",
        "noteevents": f"""
            SELECT subject_id, _eid AS row_id, hadm_id, time AS chartdate,
                   _category AS category, text_value AS text
            FROM {MAPPED} WHERE _target = 'noteevents' AND text_value IS NOT NULL""",
    }
    died = [x.upper() for x in mapping.died_discharge_locations]
    rows = {}
    for table in RAW_TABLES:
        con.execute(f"DELETE FROM {quote_table('raw.' + table)} WHERE dataset = ?", [dataset])
        con.execute("DELETE FROM raw.ingest_rejects WHERE dataset = ? AND table_name = ?", [dataset, table])
        params = {"d": dataset, **({"died": died} if table == "admissions" else {})}
        select_sql = selects_sql[table]
        rows[table] = con.execute(
            f"INSERT INTO {quote_table('raw.' + table)} BY NAME SELECT $d AS dataset, * FROM ({select_sql})", params
        ).fetchall()[0][0]
    return rows


def _code_rows_sql(target: str) -> str:
    """The rows of one code table; `target` is one of the code's own RAW_TABLES names."""
    return f"""
        SELECT subject_id, _eid AS row_id, hadm_id, seq_num,
               _rest AS icd9_code
        FROM {MAPPED} WHERE _target = {sql_literal(target)}"""


def write_accounting(con: duckdb.DuckDBPyConnection, dataset: str) -> tuple[int, int]:
    """Replace the dataset's raw.meds_codes; returns (mapped event rows, unmapped event rows).

    A note event without text and a mapped event is still 'mapped' (its rule matched); unmapped rows are
    grouped by their code's first `//` segment so a reader sees which vocabularies were left out."""
    con.execute("DELETE FROM raw.meds_codes WHERE dataset = ?", [dataset])
    con.execute(f"""
        INSERT INTO raw.meds_codes
        SELECT $d, coalesce(_prefix, split_part(code, '//', 1) || CASE WHEN contains(code, '//') THEN '//' ELSE '' END),
               CASE WHEN _target = 'prescriptions' AND _field = 'name' THEN {sql_literal(BY_NAME)}
                    {_account_cases_sql()} ELSE _target END, count(DISTINCT code), count(*)
        FROM {MAPPED} GROUP BY ALL ORDER BY 5 DESC""", {"d": dataset})
    return con.execute("SELECT coalesce(sum(n_rows) FILTER (WHERE target_table IS NOT NULL), 0), "
                       "coalesce(sum(n_rows) FILTER (WHERE target_table IS NULL), 0) "
                       "FROM raw.meds_codes WHERE dataset = ?", [dataset]).fetchall()[0]


def _account_cases_sql() -> str:
    """`WHEN _target = target THEN raw table` for a searched CASE, from the code constant ACCOUNT_TABLE."""
    return " ".join(f"WHEN _target = {sql_literal(k)} THEN {sql_literal(v)}" for k, v in ACCOUNT_TABLE.items())
