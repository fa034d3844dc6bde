"""A planted subgroup shift (issue 36): one group's 30-day readmission risk follows shifted log-odds.

`RiskShift("sex", "female", 1.0)` adds 1.0 to the log-odds of an early (< 30 day) readmission for every stay of a
female patient; `("age_band", ">=80", -0.8)` lowers it for stays at age 80 and over. The groups are those of the
evaluation (medtx.evaluation.groups: sex from the patient, age band at the admission), so the subgroup analysis
looks for the shift where it was planted. The readmission oracle (ORACLE_READMISSION) is computed from the
shifted probability, so the oracle knows the shift; a model reading codes alone does not (the codes do not
depend on the group), which is what makes the gap visible: its calibration-in-the-large differs between groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medtx.evaluation.groups import AGE_BANDS, age_band

ATTRIBUTES = {"sex": ("female", "male"), "age_band": tuple(b[2] for b in AGE_BANDS)}


@dataclass(frozen=True)
class RiskShift:
    attribute: str
    group: str
    log_odds: float

    def __post_init__(self) -> None:
        if self.attribute not in ATTRIBUTES:
            raise ValueError(f"risk shift: attribute must be one of {sorted(ATTRIBUTES)}, got {self.attribute!r}")
        if self.group not in ATTRIBUTES[self.attribute]:
            raise ValueError(f"risk shift: {self.attribute} group must be one of {ATTRIBUTES[self.attribute]}, "
                             f"got {self.group!r}")
        if not np.isfinite(self.log_odds) or abs(self.log_odds) > 5:
            raise ValueError(f"risk shift: log-odds must be finite and within [-5, 5], got {self.log_odds}")

    @classmethod
    def parse(cls, text: str) -> RiskShift:
        """'sex=female:1.0' or 'age_band=>=80:-0.8'."""
        attribute, sep, rest = text.partition("=")
        group, sep2, value = rest.rpartition(":")
        if not sep or not sep2:
            raise ValueError(f"risk shift {text!r}: expected ATTRIBUTE=GROUP:LOG_ODDS, e.g. sex=female:1.0")
        try:
            log_odds = float(value)
        except ValueError:
            raise ValueError(f"risk shift {text!r}: log-odds {value!r} is not a number") from None
        return cls(attribute.strip(), group.strip(), log_odds)

    def members(self, female: np.ndarray, age: np.ndarray) -> np.ndarray:
        """Which stays belong to the shifted group (patient sex; age in years at the admission)."""
        if self.attribute == "sex":
            return np.asarray(female, dtype=bool) == (self.group == "female")
        return age_band(age) == self.group

    def apply(self, prob: np.ndarray, female: np.ndarray, age: np.ndarray) -> np.ndarray:
        """The shifted probability: log-odds + `log_odds` for members, unchanged for the others."""
        p = np.clip(np.asarray(prob, dtype=np.float64), 1e-12, 1 - 1e-12)
        logit = np.log(p) - np.log1p(-p) + self.log_odds * self.members(female, age)
        return 1.0 / (1.0 + np.exp(-logit))

    def describe(self) -> str:
        return f"{self.attribute}={self.group}:{self.log_odds:+g}"
