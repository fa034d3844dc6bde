"""Task `mortality`: in-hospital death, predicted 48 hours after admission from what is known then.

The definition of the MIMIC benchmarks (Harutyunyan et al. 2019) and MEDS-DEV's in-hospital mortality task, on the
tables medtx loads (no vitals or labs), declared through medtx.tasks.outcome (one row per admission):
- prediction time = admittime + 48 hours;
- cohort: the admission has a hospital_expire_flag and its times; it lasts more than 48 hours (its discharge is
  never visible at the prediction time, as the ACES config and PyHealth's "longer than 48 h"); the patient is alive
  at the prediction time. Each exclusion is counted in the summary (`excluded_*`), never guessed;
- label = hospital_expire_flag = 1 (death before discharge);
- features = what the clock shows at 48 h: the codes of earlier admissions (coded at their discharge; this stay's
  own, assigned at its discharge, are never visible), earlier drugs and this stay's drugs whose start day ended by
  then; `static` = `AGE//<decade>`, `SEX//<F|M|UNKNOWN>`, `ADMISSION_TYPE//<type>` (medtx.samples.static).
"""

from medtx.tasks.base import Clock
from medtx.tasks.outcome import Exclusion, admission_outcome

TASK = admission_outcome(
    name="mortality",
    label="hospital_expire_flag = 1",
    label_name="in_hospital_death",
    clock=Clock(
        prediction_time="admittime + INTERVAL 48 HOUR",
        words="48 hours after admission (MIMIC benchmark, Harutyunyan et al. 2019)",
        outcome="in-hospital death (hospital_expire_flag), known at death or discharge",
        outcome_known="least(dischtime, coalesce(deathtime, dischtime))",
        observation_window=("earlier admissions (their codes, known at their discharge) and this stay's drugs whose "
                            "start day ended within its first 48 hours; age, sex and admission type"),
    ),
    exclusions=(
        Exclusion("without_flag", "hospital_expire_flag IS NULL"),
        Exclusion("without_times", "admittime IS NULL OR dischtime IS NULL"),
        Exclusion("under_48h", "dischtime <= {t}"),
        Exclusion("died_by_48h", "deathtime IS NOT NULL AND deathtime <= {t}"),
    ),
    empty_cohort="admission of at least 48 hours with the patient alive at 48 hours and a hospital_expire_flag",
    description="in-hospital death (binary) at 48 h after admission, from earlier admissions, early drugs and "
                "demographics",
    order=40,
)
