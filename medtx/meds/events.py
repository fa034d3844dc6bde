"""The event codes medtx writes when it exports a dataset as MEDS, as SQL over the warehouse.

Codes follow the MIMIC-IV MEDS ETL (MEDS-Transforms' MIMIC-IV example and its descendants), so a model or
tool trained on MIMIC-IV MEDS sees the same vocabulary shape; see docs/MEDS.md for the list and the reasons.
Where MIMIC-III spells a value differently the MIMIC-IV word is written (DISCHARGE_LOCATIONS: `DEAD/EXPIRED` is
`DIED`, the code PyHealth's and ACES' MEDS mortality definitions look for).

Times follow the task clock (medtx.samples.clock, the one place stating when each MIMIC-III table's events become
known): diagnoses and procedures at the stay's discharge; a prescription at the end of its start date, clamped
into its stay (never before the admission, never after the discharge), and not exported at all when it is dated
after its stay's discharge (medtx drops it from every feature too); a note at its chart time, else the end
of its chart date. So a MEDS tool cutting data "up to and including" a task's prediction time sees what the
task's own features may see, and never a prescription of a later stay.

Birth: MIMIC-III shifts the birth date of patients older than 89 so that they appear about 300 years old at
their first admission. A birth date that makes a subject older than SHIFTED_AGE_YEARS at the first admission is
exported as the first admission minus CAPPED_AGE_YEARS (90): the youngest age the shift stands for, and the age
medtx's own samples cap at (medtx.samples.common.AGE_CAP). `AGE` events (numeric_value: age in years at the
admission, from that birth) sit at each admission time as `MEDTX//AGE_AT_ADMISSION`: not MEDS-Transforms' own
time-derived `AGE` code, which its standard stage adds beside it (one code, two meanings, otherwise).
"""

from __future__ import annotations

import pyarrow as pa

from medtx.store.db import sql_literal
from medtx.samples.clock import (
    CODED_AT_DISCHARGE, drug_after_discharge_sql, drug_time_sql, end_of_day_sql, note_time_sql,
)

BIRTH = "MEDS_BIRTH"
DEATH = "MEDS_DEATH"
AGE = "MEDTX//AGE_AT_ADMISSION"  # namespaced: MEDS-Transforms derives its own `AGE` from the birth
SEP = "//"
SHIFTED_AGE_YEARS = 150  # older than this at the first admission: MIMIC-III's shifted birth date (about 300)
CAPPED_AGE_YEARS = 90    # ... exported as this age at the first admission
# MIMIC-III discharge locations whose MIMIC-IV (MIMIC-IV MEDS ETL) spelling differs and means the same; others are
# written as MIMIC-III has them (no one-to-one MIMIC-IV word). An in-hospital death (hospital_expire_flag or
# deathtime) is always discharged to DIED, whatever the location column says.
DIED = "DIED"
DISCHARGE_LOCATIONS = {
    "DEAD/EXPIRED": DIED,
    "SNF": "SKILLED NURSING FACILITY",
    "REHAB/DISTINCT PART HOSP": "REHAB",
    "LONG TERM CARE HOSPITAL": "CHRONIC/LONG TERM ACUTE CARE",
    "DISCH-TRAN TO PSYCH HOSP": "PSYCH FACILITY",
    "SHORT TERM HOSPITAL": "ACUTE HOSPITAL",
    "LEFT AGAINST MEDICAL ADVI": "AGAINST ADVICE",
}

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


def _discharge_location_sql() -> str:
    """CASE over `adm` mapping MIMIC-III discharge locations to their MIMIC-IV spelling (DISCHARGE_LOCATIONS, a
    code constant); an in-hospital death is DIED."""
    whens_sql = " ".join(f"WHEN {sql_literal(k)} THEN {sql_literal(v)}" for k, v in DISCHARGE_LOCATIONS.items())
    return (f"CASE WHEN adm.hadm_id IN (SELECT hadm_id FROM died_in) THEN {sql_literal(DIED)} "
            f"ELSE (CASE {_part_sql('adm.discharge_location')} {whens_sql} "
            f"ELSE {_part_sql('adm.discharge_location')} END) END")


def events_sql() -> str:
    """One SELECT of every event of dataset `$dataset`; `_ord` (event kind) and `_row` (source row_id) break
    ties within a time, so notes keep their chart order and diagnoses their seq_num order.

    Each branch: subject_id, time, code, numeric_value, text_value, the extra columns, _ord.
    """
    nul = {c: f"NULL::{t}" for c, t in EXTRA_SQL_TYPES.items()}

    # Every argument is a SQL expression written in this function (no value flows in: `$dataset` is bound).
    def row_sql(subject_sql, time_sql, code_sql, text_sql="NULL", ord_sql="0", rowid_sql="NULL", numeric_sql="NULL",
                **extra_sql) -> str:
        cols_sql = {**nul, **extra_sql}
        extras_sql = ", ".join(f"{v} AS {k}" for k, v in cols_sql.items())
        return (f"SELECT {subject_sql} AS subject_id, CAST({time_sql} AS TIMESTAMP) AS time, {code_sql} AS code, "
                f"CAST({numeric_sql} AS FLOAT) AS numeric_value, {text_sql} AS text_value, {extras_sql}, "
                f"{ord_sql} AS _ord, CAST({rowid_sql} AS BIGINT) AS _row")

    # MIMIC writes '0' or nothing for "no NDC": such a row is named by its drug, as MIMIC-IV MEDS does.
    rx_code_sql = (f"CASE WHEN nullif(trim(r.ndc), '') IS NOT NULL AND trim(r.ndc) <> '0' "
                   f"THEN 'MEDICATION{SEP}NDC{SEP}' || trim(r.ndc) ELSE 'MEDICATION{SEP}START{SEP}' || {_part_sql('r.drug')} END")
    # Age in years (days / 365.25) at an admission, from the exported birth.
    age_sql = "date_diff('day', pat.birth, adm.admittime) / 365.25"
    return f"""
    WITH adm AS (
        SELECT * FROM raw.admissions WHERE dataset = $dataset AND subject_id IS NOT NULL AND hadm_id IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY hadm_id ORDER BY row_id NULLS LAST, admittime) = 1
    ), first_adm AS (
        SELECT subject_id, min(admittime) AS first_admit, max(dischtime) AS last_disch FROM adm GROUP BY 1
    ), pat AS (   -- birth: MIMIC-III's shifted birth dates of the over-89s moved to CAPPED_AGE_YEARS at the first admission
        SELECT p.*, CASE WHEN date_part('year', age(f.first_admit, p.dob)) > {int(SHIFTED_AGE_YEARS)}
                         THEN f.first_admit - INTERVAL {int(CAPPED_AGE_YEARS)} YEAR ELSE p.dob END AS birth,
               f.last_disch
        FROM (SELECT subject_id, arg_min(gender, row_id) AS gender, min(dob) AS dob, min(dod) AS dod
              FROM raw.patients WHERE dataset = $dataset AND subject_id IS NOT NULL GROUP BY 1) p
        LEFT JOIN first_adm f USING (subject_id)
    ), died_in AS (   -- in-hospital deaths: the stay's death time (else its discharge)
        SELECT subject_id, hadm_id, coalesce(deathtime, dischtime) AS t FROM adm
        WHERE deathtime IS NOT NULL OR hospital_expire_flag = 1
    )
    {row_sql("subject_id", "NULL", f"'GENDER{SEP}' || upper(trim(gender))")} FROM pat WHERE nullif(trim(gender), '') IS NOT NULL
    UNION ALL {row_sql("subject_id", "birth", f"'{BIRTH}'")} FROM pat WHERE birth IS NOT NULL
    UNION ALL {row_sql("subject_id", "t", f"'{DEATH}'", hadm_id="hadm_id")} FROM died_in
    -- a death outside hospital: MIMIC-III's dod is a date, known by the end of that day, and never before the
    -- subject's last discharge (a patient discharged alive died after it)
    UNION ALL {row_sql("subject_id", f"greatest({end_of_day_sql('dod')}, last_disch)", f"'{DEATH}'")} FROM pat
        WHERE dod IS NOT NULL AND subject_id NOT IN (SELECT subject_id FROM died_in)
    UNION ALL {row_sql("subject_id", "admittime",
                   f"'HOSPITAL_ADMISSION{SEP}' || {_part_sql('admission_type')} || '{SEP}' || {_part_sql('admission_location')}",
                   hadm_id="hadm_id")} FROM adm
    UNION ALL {row_sql("adm.subject_id", "adm.admittime", f"'{AGE}'", ord_sql="1", numeric_sql=age_sql,
                   hadm_id="adm.hadm_id")}
        FROM adm JOIN pat USING (subject_id) WHERE pat.birth IS NOT NULL AND adm.admittime IS NOT NULL
    UNION ALL {row_sql("adm.subject_id", "adm.dischtime", f"'HOSPITAL_DISCHARGE{SEP}' || {_discharge_location_sql()}",
                   ord_sql="9", hadm_id="adm.hadm_id")} FROM adm
    UNION ALL {row_sql("d.subject_id", f"adm.{CODED_AT_DISCHARGE}", f"'DIAGNOSIS{SEP}ICD{SEP}9{SEP}' || trim(d.icd9_code)",
                   ord_sql="2", hadm_id="d.hadm_id", seq_num="d.seq_num")}
        FROM raw.diagnoses_icd d JOIN adm USING (hadm_id)
        WHERE d.dataset = $dataset AND nullif(trim(d.icd9_code), '') IS NOT NULL
    UNION ALL {row_sql("p.subject_id", f"adm.{CODED_AT_DISCHARGE}", f"'PROCEDURE{SEP}ICD{SEP}9{SEP}' || trim(p.icd9_code)",
                   ord_sql="3", hadm_id="p.hadm_id", seq_num="p.seq_num")}
        FROM raw.procedures_icd p JOIN adm USING (hadm_id)
        WHERE p.dataset = $dataset AND nullif(trim(p.icd9_code), '') IS NOT NULL
    UNION ALL {row_sql("adm.subject_id", drug_time_sql("r.startdate", "adm.admittime", "adm.dischtime"),
                   rx_code_sql,
                   ord_sql="4", hadm_id="r.hadm_id", drug="r.drug", drug_name_generic="r.drug_name_generic",
                   route="r.route", rowid_sql="r.row_id")}
        FROM raw.prescriptions r JOIN adm USING (hadm_id)
        WHERE r.dataset = $dataset AND NOT {drug_after_discharge_sql('r.startdate', 'adm.dischtime')}
    UNION ALL {row_sql("adm.subject_id", note_time_sql("n.charttime", "n.chartdate"), f"'NOTE{SEP}DISCHARGE_SUMMARY'",
                   text_sql="n.text", ord_sql="5", rowid_sql="n.row_id", hadm_id="n.hadm_id")}
        FROM raw.noteevents n JOIN adm USING (hadm_id)
        WHERE n.dataset = $dataset AND lower(trim(n.category)) = 'discharge summary'
          AND coalesce(trim(n.iserror), '') <> '1' AND nullif(trim(n.text), '') IS NOT NULL"""
