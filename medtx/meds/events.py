"""The event codes medtx writes when it exports a dataset as MEDS, as SQL over the warehouse.

Codes follow the MIMIC-IV MEDS ETL (MEDS-Transforms' MIMIC-IV example and its descendants), so a model or
tool trained on MIMIC-IV MEDS sees the same vocabulary shape; see docs/MEDS.md for the list and the reasons.
Time rule: MIMIC-III does not time-stamp diagnoses and procedures, so (as the MIMIC-IV ETL does for
diagnoses) they are placed at the admission's discharge time — they are only known once the stay is coded.
Prescriptions sit at their start date (the admission time when it is missing), discharge notes at their
chart time (else chart date).
"""

from __future__ import annotations

import pyarrow as pa

BIRTH = "MEDS_BIRTH"
DEATH = "MEDS_DEATH"
SEP = "//"

# Extra columns beside the five MEDS columns. hadm_id joins back to MIMIC; seq_num keeps the coder's order of
# diagnoses/procedures (medtx orders a visit's codes by it); drug, drug_name_generic and route are what the
# NDC -> ATC-3 mapping reads, so an imported copy maps exactly like the original.
EXTRA_COLUMNS: dict[str, pa.DataType] = {
    "hadm_id": pa.int64(),
    "seq_num": pa.int32(),
    "drug": pa.string(),
    "drug_name_generic": pa.string(),
    "route": pa.string(),
}
EXTRA_SQL_TYPES = {"hadm_id": "BIGINT", "seq_num": "INTEGER", "drug": "VARCHAR", "drug_name_generic": "VARCHAR",
                   "route": "VARCHAR"}

# The MEDS DataSchema column types (meds 0.4: text_value is large_string), extras after them.
DATA_ARROW_SCHEMA = pa.schema(
    [("subject_id", pa.int64()), ("time", pa.timestamp("us")), ("code", pa.string()),
     ("numeric_value", pa.float32()), ("text_value", pa.large_string())]
    + list(EXTRA_COLUMNS.items())
)


def _part_sql(expr: str) -> str:
    """A code segment: MIMIC free text (admission/discharge locations) upper-cased, '//' never inside one."""
    return f"replace(upper(trim(coalesce({expr}, 'UNKNOWN'))), '{SEP}', '/')"


def events_sql() -> str:
    """One SELECT of every event of dataset `$dataset`; `_ord` (event kind) and `_row` (source row_id) break
    ties within a time, so notes keep their chart order and diagnoses their seq_num order.

    Each branch: subject_id, time, code, numeric_value, text_value, the extra columns, _ord.
    """
    nul = {c: f"NULL::{t}" for c, t in EXTRA_SQL_TYPES.items()}

    # Every argument is a SQL expression written in this function (no value flows in: `$dataset` is bound).
    def row_sql(subject_sql, time_sql, code_sql, text_sql="NULL", ord_sql="0", rowid_sql="NULL", **extra_sql) -> str:
        cols_sql = {**nul, **extra_sql}
        extras_sql = ", ".join(f"{v} AS {k}" for k, v in cols_sql.items())
        return (f"SELECT {subject_sql} AS subject_id, CAST({time_sql} AS TIMESTAMP) AS time, {code_sql} AS code, "
                f"NULL::FLOAT AS numeric_value, {text_sql} AS text_value, {extras_sql}, {ord_sql} AS _ord, "
                f"CAST({rowid_sql} AS BIGINT) AS _row")

    # MIMIC writes '0' or nothing for "no NDC": such a row is named by its drug, as MIMIC-IV MEDS does.
    rx_code_sql = (f"CASE WHEN nullif(trim(r.ndc), '') IS NOT NULL AND trim(r.ndc) <> '0' "
                   f"THEN 'MEDICATION{SEP}NDC{SEP}' || trim(r.ndc) ELSE 'MEDICATION{SEP}START{SEP}' || {_part_sql('r.drug')} END")
    return f"""
    WITH adm AS (
        SELECT * FROM raw.admissions WHERE dataset = $dataset AND subject_id IS NOT NULL AND hadm_id IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY hadm_id ORDER BY row_id NULLS LAST, admittime) = 1
    ), pat AS (
        SELECT subject_id, arg_min(gender, row_id) AS gender, min(dob) AS dob, min(dod) AS dod
        FROM raw.patients WHERE dataset = $dataset AND subject_id IS NOT NULL GROUP BY 1
    ), died_in AS (   -- in-hospital deaths: the stay's death time (else its discharge)
        SELECT subject_id, hadm_id, coalesce(deathtime, dischtime) AS t FROM adm
        WHERE deathtime IS NOT NULL OR hospital_expire_flag = 1
    )
    {row_sql("subject_id", "NULL", f"'GENDER{SEP}' || upper(trim(gender))")} FROM pat WHERE nullif(trim(gender), '') IS NOT NULL
    UNION ALL {row_sql("subject_id", "dob", f"'{BIRTH}'")} FROM pat WHERE dob IS NOT NULL
    UNION ALL {row_sql("subject_id", "t", f"'{DEATH}'", hadm_id="hadm_id")} FROM died_in
    UNION ALL {row_sql("subject_id", "dod", f"'{DEATH}'")} FROM pat
        WHERE dod IS NOT NULL AND subject_id NOT IN (SELECT subject_id FROM died_in)
    UNION ALL {row_sql("subject_id", "admittime",
                   f"'HOSPITAL_ADMISSION{SEP}' || {_part_sql('admission_type')} || '{SEP}' || {_part_sql('admission_location')}",
                   hadm_id="hadm_id")} FROM adm
    UNION ALL {row_sql("subject_id", "dischtime", f"'HOSPITAL_DISCHARGE{SEP}' || {_part_sql('discharge_location')}",
                   ord_sql="9", hadm_id="hadm_id")} FROM adm
    UNION ALL {row_sql("d.subject_id", "adm.dischtime", f"'DIAGNOSIS{SEP}ICD{SEP}9{SEP}' || trim(d.icd9_code)", ord_sql="1",
                   hadm_id="d.hadm_id", seq_num="d.seq_num")}
        FROM raw.diagnoses_icd d JOIN adm USING (hadm_id)
        WHERE d.dataset = $dataset AND nullif(trim(d.icd9_code), '') IS NOT NULL
    UNION ALL {row_sql("p.subject_id", "adm.dischtime", f"'PROCEDURE{SEP}ICD{SEP}9{SEP}' || trim(p.icd9_code)", ord_sql="2",
                   hadm_id="p.hadm_id", seq_num="p.seq_num")}
        FROM raw.procedures_icd p JOIN adm USING (hadm_id)
        WHERE p.dataset = $dataset AND nullif(trim(p.icd9_code), '') IS NOT NULL
    UNION ALL {row_sql("adm.subject_id", "coalesce(r.startdate, adm.admittime)",
                   rx_code_sql,
                   ord_sql="3", hadm_id="r.hadm_id", drug="r.drug", drug_name_generic="r.drug_name_generic",
                   route="r.route", rowid_sql="r.row_id")}
        FROM raw.prescriptions r JOIN adm USING (hadm_id) WHERE r.dataset = $dataset
    UNION ALL {row_sql("adm.subject_id", "coalesce(n.charttime, n.chartdate)", f"'NOTE{SEP}DISCHARGE_SUMMARY'",
                   text_sql="n.text", ord_sql="4", rowid_sql="n.row_id", hadm_id="n.hadm_id")}
        FROM raw.noteevents n JOIN adm USING (hadm_id)
        WHERE n.dataset = $dataset AND lower(trim(n.category)) = 'discharge summary'
          AND coalesce(trim(n.iserror), '') <> '1' AND nullif(trim(n.text), '') IS NOT NULL"""
