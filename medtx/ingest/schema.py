"""Column specs of the raw tables: the single place that says which columns a source file must have,
which it may have, and the DuckDB type each is read as.

Names are the lower-case MIMIC-III names; a source header in any case maps onto them. Types follow the
MIMIC-III Postgres schema, except that ids are BIGINT, every date/time is TIMESTAMP (MIMIC stores
date-only values such as DOB as midnight timestamps) and every code (ICD-9, NDC, GSN) is VARCHAR so leading
zeros survive. `warehouse/migrations/0002_raw.sql` declares the same columns; a test checks they agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    required: bool = False  # a file without it is refused; optional columns absent from a file load as NULL
    multiline: bool = False  # free text that may hold line breaks; in any other column a line break is a
    # merged record (a quote opened in one record and closed in a later one), and the ingest fails


@dataclass(frozen=True)
class TableSpec:
    name: str  # lower-case MIMIC table name, e.g. "prescriptions"
    raw_table: str  # warehouse table, e.g. "raw.prescriptions"
    columns: tuple[Column, ...]
    has_dataset: bool = True  # MIMIC tables carry `dataset` first; raw.mtsamples has none

    @property
    def file_stem(self) -> str:
        """File name stem in MIMIC-III releases: PATIENTS, ADMISSIONS, ..."""
        return self.name.upper()

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.required)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)


def _cols(spec: str, required: set[str], multiline: frozenset[str] = frozenset()) -> tuple[Column, ...]:
    """'name TYPE, name TYPE' -> Columns; keeps the specs below readable as one line per table."""
    out = []
    for item in spec.split(","):
        name, type_ = item.split()
        out.append(Column(name, type_, name in required, name in multiline))
    return tuple(out)


# Required = what later stages (and PyHealth's MIMIC3Dataset) actually read; everything else is optional so
# trimmed exports such as PyHealth's synthetic MIMIC-III still load.
PATIENTS = TableSpec(
    "patients",
    "raw.patients",
    _cols(
        "row_id BIGINT, subject_id BIGINT, gender VARCHAR, dob TIMESTAMP, dod TIMESTAMP, dod_hosp TIMESTAMP,"
        " dod_ssn TIMESTAMP, expire_flag INTEGER",
        {"subject_id", "gender", "dob"},
    ),
)
ADMISSIONS = TableSpec(
    "admissions",
    "raw.admissions",
    _cols(
        "row_id BIGINT, subject_id BIGINT, hadm_id BIGINT, admittime TIMESTAMP, dischtime TIMESTAMP,"
        " deathtime TIMESTAMP, admission_type VARCHAR, admission_location VARCHAR, discharge_location VARCHAR,"
        " insurance VARCHAR, language VARCHAR, religion VARCHAR, marital_status VARCHAR, ethnicity VARCHAR,"
        " edregtime TIMESTAMP, edouttime TIMESTAMP, diagnosis VARCHAR, hospital_expire_flag INTEGER,"
        " has_chartevents_data INTEGER",
        {"subject_id", "hadm_id", "admittime", "dischtime"},
    ),
)
DIAGNOSES_ICD = TableSpec(
    "diagnoses_icd",
    "raw.diagnoses_icd",
    _cols(
        "row_id BIGINT, subject_id BIGINT, hadm_id BIGINT, seq_num INTEGER, icd9_code VARCHAR",
        {"subject_id", "hadm_id", "icd9_code"},
    ),
)
PROCEDURES_ICD = TableSpec(
    "procedures_icd",
    "raw.procedures_icd",
    _cols(
        "row_id BIGINT, subject_id BIGINT, hadm_id BIGINT, seq_num INTEGER, icd9_code VARCHAR",
        {"subject_id", "hadm_id", "icd9_code"},
    ),
)
PRESCRIPTIONS = TableSpec(
    "prescriptions",
    "raw.prescriptions",
    _cols(
        "row_id BIGINT, subject_id BIGINT, hadm_id BIGINT, icustay_id BIGINT, startdate TIMESTAMP,"
        " enddate TIMESTAMP, drug_type VARCHAR, drug VARCHAR, drug_name_poe VARCHAR, drug_name_generic VARCHAR,"
        " formulary_drug_cd VARCHAR, gsn VARCHAR, ndc VARCHAR, prod_strength VARCHAR, dose_val_rx VARCHAR,"
        " dose_unit_rx VARCHAR, form_val_disp VARCHAR, form_unit_disp VARCHAR, route VARCHAR",
        {"subject_id", "hadm_id", "startdate", "ndc"},
    ),
)
NOTEEVENTS = TableSpec(
    "noteevents",
    "raw.noteevents",
    _cols(
        "row_id BIGINT, subject_id BIGINT, hadm_id BIGINT, chartdate TIMESTAMP, charttime TIMESTAMP,"
        " storetime TIMESTAMP, category VARCHAR, description VARCHAR, cgid BIGINT, iserror VARCHAR, text VARCHAR",
        {"subject_id", "hadm_id", "category", "text"},
        frozenset({"description", "text"}),
    ),
)
MTSAMPLES = TableSpec(
    "mtsamples",
    "raw.mtsamples",
    _cols(
        "note_id BIGINT, description VARCHAR, medical_specialty VARCHAR, sample_name VARCHAR,"
        " transcription VARCHAR, keywords VARCHAR",
        {"note_id", "medical_specialty", "transcription"},
        frozenset({"description", "sample_name", "transcription", "keywords"}),
    ),
    has_dataset=False,
)

# Load order: patients before the tables that reference them (no FK in raw, but logs read naturally).
MIMIC3_TABLES: dict[str, TableSpec] = {
    t.name: t for t in (PATIENTS, ADMISSIONS, DIAGNOSES_ICD, PROCEDURES_ICD, PRESCRIPTIONS, NOTEEVENTS)
}
# Tables a MIMIC-III source must have; NOTEEVENTS is skipped (and logged) when absent.
CORE_MIMIC3_TABLES: tuple[str, ...] = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions")
OPTIONAL_MIMIC3_TABLES: tuple[str, ...] = ("noteevents",)


def guess_table(header: list[str], candidates: dict[str, TableSpec]) -> str | None:
    """The table whose required columns a header has, best match first; used to say "this looks like X"."""
    names = set(header)
    matches = [t for t in candidates.values() if set(t.required) <= names]
    # The most specific spec wins (diagnoses vs procedures are identical: then the name can't tell).
    matches.sort(key=lambda t: -len(t.required))
    return matches[0].name if matches else None
