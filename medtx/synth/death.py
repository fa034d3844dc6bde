"""In-hospital death of the synthetic cohort: a known, timed risk, its oracle, and an optional planted leak.

Death happens only at a patient's last admission (as before: the visit count is drawn up front), now with a
probability that depends on what is known when the stay begins:

    logit P(death | last admission) = BASE_LOGIT + AGE_LOGIT_PER_DECADE * (age - AGE_CENTRE) / 10
                                      + TYPE_LOGIT[admission type] + RISK_CODE_LOGIT * (#RISK_CODES in earlier stays)

(age in years at admission, capped at 90; earlier stays' diagnoses, which a model sees at their discharge). So a
model at 48 hours after admission can learn it from age, admission type and the history, and the oracle is exact:

    P(death | what is known at 48 h) = P(this is the last admission | admission number) * P(death | last admission)

(the visit count is independent of everything else, and the stay's length is drawn independently of death, so
"lasted 48 h" changes nothing). The oracle file ORACLE_MORTALITY holds it for every admission.

The planted leak (`medtx synth mimic3 --plant-death-code`): a discharge-time diagnosis tied to death, as real
MIMIC-III has (V66.7, "encounter for palliative care", coded at discharge of many dying stays): LEAK_SHARE_DIED
of the stays that end in death and LEAK_SHARE_ALIVE of the others get LEAK_CODE as their last diagnosis. Drawn
from its own random stream after everything else, so the rest of the cohort is byte-identical with or without it.
Its purpose: a task that reads a stay's own discharge codes finds it (the leakage gate's shortcut audit must flag
it), a task with a clock never sees it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

# Congestive heart failure, atrial fibrillation, acute kidney failure, acute respiratory failure, septicemia,
# severe sepsis, septic shock, aspiration pneumonitis: common MIMIC-III codes that predict in-hospital death.
RISK_CODES = ("4280", "42731", "5849", "51881", "0389", "99592", "78552", "5070")
RISK_CODE_LOGIT = 0.9
AGE_CENTRE = 65.0
AGE_CAP = 90.0
AGE_LOGIT_PER_DECADE = 0.6
TYPE_LOGIT = {"EMERGENCY": 0.3, "URGENT": 0.3, "ELECTIVE": -1.5, "NEWBORN": -2.0}
BASE_LOGIT = -2.9  # about the fitted share of deaths at last admissions (0.146) over synth_2000's last admissions

LEAK_CODE = "V667"
LEAK_SHARE_DIED = 0.9
LEAK_SHARE_ALIVE = 0.005
LEAK_STREAM = 33  # the planted code's random stream: default_rng([seed, chunk, LEAK_STREAM])


class DeathModel:
    """P(in-hospital death | last admission, age, admission type, earlier stays' diagnoses), vectorised."""

    def __init__(self, dx_codes: list[str], admission_types: list[str]) -> None:
        index = {c: i for i, c in enumerate(dx_codes)}
        self.risk = np.asarray([index[c] for c in RISK_CODES if c in index], dtype=np.int64)
        self.type_logit = np.asarray([TYPE_LOGIT.get(t, 0.0) for t in admission_types])

    def prob(self, age_years: np.ndarray, earlier_dx: np.ndarray, admission_type: np.ndarray) -> np.ndarray:
        """Per admission: `age_years` at admission, `earlier_dx` (admissions x codes, any earlier stay),
        `admission_type` (indices into the generator's admission types)."""
        age = np.minimum(np.asarray(age_years, dtype=float), AGE_CAP)
        logit = (BASE_LOGIT + AGE_LOGIT_PER_DECADE * (age - AGE_CENTRE) / 10.0 + self.type_logit[admission_type]
                 + RISK_CODE_LOGIT * earlier_dx[:, self.risk].sum(axis=1))
        return 1.0 / (1.0 + np.exp(-logit))


def plant_death_code(rng: np.random.Generator, admissions: pl.DataFrame, diagnoses: pl.DataFrame) -> pl.DataFrame:
    """DIAGNOSES_ICD rows of one chunk plus LEAK_CODE as the last diagnosis of the drawn stays (module doc)."""
    died = admissions["hospital_expire_flag"].to_numpy() == 1
    drawn = rng.random(admissions.height) < np.where(died, LEAK_SHARE_DIED, LEAK_SHARE_ALIVE)
    chosen = admissions.filter(pl.Series(drawn)).select("subject_id", "hadm_id")
    last_seq = diagnoses.group_by("hadm_id").agg(pl.col("seq_num").max().alias("last"))
    planted = (chosen.join(last_seq, on="hadm_id", how="left")
               .select(pl.col("subject_id"), pl.col("hadm_id"),
                       (pl.col("last").fill_null(0) + 1).cast(diagnoses.schema["seq_num"]).alias("seq_num"),
                       pl.lit(LEAK_CODE, dtype=diagnoses.schema["icd9_code"]).alias("icd9_code")))
    return pl.concat([diagnoses, planted.select(diagnoses.columns).cast(diagnoses.schema)])
