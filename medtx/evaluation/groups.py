"""The patient subgroups every binary and multi-label EHR run is evaluated on: names and groupings, in ONE place.

Each attribute is read from the warehouse for the admission a test sample describes (samples are admissions:
`ml.predictions.hadm_id`), so a patient whose age band or insurance changed between stays counts in each group
for the stays concerned; the bootstrap still resamples patients (medtx.evaluation.subgroups).

| attribute | groups | from |
|---|---|---|
| `sex` | `female`, `male`, `unknown` | `raw.patients.gender` ('F' / 'M') |
| `age_band` | `<50`, `50-64`, `65-79`, `>=80`, `unknown` | years from `raw.patients.dob` to `raw.admissions.admittime`; MIMIC-III shifts ages over 89 to about 300, which lands in `>=80` |
| `ethnicity` | `white`, `black`, `hispanic`, `asian`, `other`, `unknown` | `raw.admissions.ethnicity`, by its leading word (`ETHNICITY_GROUPS`) |
| `insurance` | `medicare`, `medicaid`, `private`, `government`, `self_pay`, `unknown` | `raw.admissions.insurance` |
| `admission_type` | `emergency`, `urgent`, `elective`, `newborn`, `unknown` | `raw.admissions.admission_type` |

`unknown` collects missing and undeclared values ('UNKNOWN/NOT SPECIFIED', 'UNABLE TO OBTAIN', 'PATIENT DECLINED
TO ANSWER', NULL); it is reported as a group but never enters a between-group gap (it is no population).
Any other value of insurance or admission type falls into `other` rather than being dropped.
"""

from __future__ import annotations

import duckdb
import numpy as np
import polars as pl

ATTRIBUTES = ("sex", "age_band", "ethnicity", "insurance", "admission_type")
AGE_BANDS = ((0.0, 50.0, "<50"), (50.0, 65.0, "50-64"), (65.0, 80.0, "65-79"), (80.0, float("inf"), ">=80"))
UNKNOWN = "unknown"
# MIMIC-III ETHNICITY values -> group, by prefix (first match wins; upper-cased value).
ETHNICITY_GROUPS = (
    ("UNKNOWN", UNKNOWN), ("UNABLE TO OBTAIN", UNKNOWN), ("PATIENT DECLINED", UNKNOWN),
    ("WHITE", "white"), ("BLACK", "black"), ("HISPANIC", "hispanic"), ("SOUTH AMERICAN", "hispanic"),
    ("ASIAN", "asian"),
)
INSURANCE_GROUPS = {"MEDICARE": "medicare", "MEDICAID": "medicaid", "PRIVATE": "private",
                    "GOVERNMENT": "government", "SELF PAY": "self_pay"}
ADMISSION_TYPE_GROUPS = {"EMERGENCY": "emergency", "URGENT": "urgent", "ELECTIVE": "elective", "NEWBORN": "newborn"}
# Order of groups in tables and plots.
GROUP_ORDER = {
    "sex": ("female", "male", UNKNOWN),
    "age_band": (*(b[2] for b in AGE_BANDS), UNKNOWN),
    "ethnicity": ("white", "black", "hispanic", "asian", "other", UNKNOWN),
    "insurance": (*INSURANCE_GROUPS.values(), "other", UNKNOWN),
    "admission_type": (*ADMISSION_TYPE_GROUPS.values(), "other", UNKNOWN),
}
READS = ("raw.patients", "raw.admissions")
YEAR_SECONDS = 365.25 * 86_400

DEMOGRAPHICS_SQL = """
    SELECT a.hadm_id, p.gender,
           (epoch(a.admittime) - epoch(p.dob)) / $year AS age,
           a.ethnicity, a.insurance, a.admission_type
    FROM raw.admissions a LEFT JOIN raw.patients p ON p.dataset = a.dataset AND p.subject_id = a.subject_id
    WHERE a.dataset = $dataset AND a.hadm_id IN (SELECT unnest($hadm))"""


def age_band(age: np.ndarray) -> np.ndarray:
    """Age in years -> band label ('unknown' where NaN or negative)."""
    age = np.asarray(age, dtype=np.float64)
    out = np.full(age.shape, UNKNOWN, dtype=object)
    for lo, hi, name in AGE_BANDS:
        out[(age >= lo) & (age < hi)] = name
    return out


def ethnicity_group(values: np.ndarray) -> np.ndarray:
    out = np.full(len(values), "other", dtype=object)
    upper = np.array([str(v).strip().upper() if v is not None else "" for v in values], dtype=object)
    done = np.zeros(len(values), dtype=bool)
    for prefix, group in ETHNICITY_GROUPS:
        hit = ~done & np.array([u.startswith(prefix) for u in upper], dtype=bool)
        out[hit], done = group, done | hit
    out[upper == ""] = UNKNOWN
    return out


def _mapped(values: np.ndarray, table: dict[str, str]) -> np.ndarray:
    out = np.array([table.get(str(v).strip().upper(), "other") if v is not None and str(v).strip() else UNKNOWN
                    for v in values], dtype=object)
    return out


def group_frame(frame: pl.DataFrame) -> pl.DataFrame:
    """(hadm_id, gender, age, ethnicity, insurance, admission_type) rows -> hadm_id + one group column per
    attribute."""
    gender = frame["gender"].to_numpy()
    sex = np.array([{"F": "female", "M": "male"}.get(str(g).strip().upper(), UNKNOWN) if g is not None else UNKNOWN
                    for g in gender], dtype=object)
    age = frame["age"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    return pl.DataFrame({
        "hadm_id": frame["hadm_id"].cast(pl.Int64),
        "sex": sex.astype(str), "age_band": age_band(age).astype(str),
        "ethnicity": ethnicity_group(frame["ethnicity"].to_numpy()).astype(str),
        "insurance": _mapped(frame["insurance"].to_numpy(), INSURANCE_GROUPS).astype(str),
        "admission_type": _mapped(frame["admission_type"].to_numpy(), ADMISSION_TYPE_GROUPS).astype(str),
    })


def sample_groups(con: duckdb.DuckDBPyConnection, dataset: str | None, hadm_ids: np.ndarray) -> dict[str, np.ndarray]:
    """{attribute: group label per sample}, aligned with `hadm_ids` (one per test sample). An admission missing
    from raw.admissions is `unknown` on every attribute."""
    hadm = np.asarray(hadm_ids, dtype=np.int64)
    rows = con.sql(DEMOGRAPHICS_SQL, params={"year": YEAR_SECONDS, "dataset": dataset,
                                             "hadm": [int(h) for h in np.unique(hadm)]}).pl()
    groups = group_frame(rows) if rows.height else pl.DataFrame(
        {"hadm_id": pl.Series([], dtype=pl.Int64), **{a: pl.Series([], dtype=pl.String) for a in ATTRIBUTES}})
    joined = pl.DataFrame({"hadm_id": hadm}).join(groups.unique("hadm_id"), on="hadm_id", how="left",
                                                  maintain_order="left")
    return {a: joined[a].fill_null(UNKNOWN).to_numpy().astype(object) for a in ATTRIBUTES}
