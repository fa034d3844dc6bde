"""The YAML mapping from MEDS code prefixes to medtx's raw MIMIC-format tables.

Shipped defaults (package data, `medtx/meds/codes/`): `medtx.yaml` (what `medtx export meds` writes) and
`mimic4.yaml` (the MIMIC-IV MEDS ETL, ICD-9 and ICD-10). A user's file has the same keys; see docs/MEDS.md.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

SHIPPED = ("medtx", "mimic4")


class MappingError(ValueError):
    """A mapping file that cannot be used; the message names the file and the key."""


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefix: str

    @field_validator("prefix")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("prefix must not be empty")
        return value


class CodeRule(_Rule):
    """Diagnoses / procedures: the code after the prefix is the stored ICD code."""


class DrugRule(_Rule):
    # which raw.prescriptions column the code after the prefix fills: `ndc`; `drug` (a name kept as text, e.g.
    # medtx's own export of a prescription without an NDC); `name` (a drug name the source codes medications
    # by, e.g. MIMIC-IV MEDS: `medtx map-codes` maps it to ATC-3 through the bundled drug names)
    field: Literal["ndc", "drug", "name"]


class NoteRule(_Rule):
    category: str = "Discharge summary"


class CodeMapping(BaseModel):
    """Prefix rules per raw table. A code matches a rule when it starts with the rule's prefix."""

    model_config = ConfigDict(extra="forbid")
    name: str
    admission: str
    discharge: str
    gender: str = "GENDER//"
    birth: str = "MEDS_BIRTH"
    death: str = "MEDS_DEATH"
    death_in_stay_by_time: bool = False
    died_discharge_locations: list[str] = []
    diagnoses: list[CodeRule] = []
    procedures: list[CodeRule] = []
    prescriptions: list[DrugRule] = []
    notes: list[NoteRule] = []
    # codes derived from other events (an age from the birth): read as mapped, loaded nowhere (medtx derives them
    # again from what it loads)
    derived: list[str] = []

    def rules(self) -> list[tuple[str, str, dict]]:
        """(prefix, target table, options) for every rule, in match order (longest prefix first)."""
        rows = [(self.admission, "admissions", {}), (self.discharge, "discharges", {}),
                (self.gender, "gender", {}), (self.birth, "birth", {}), (self.death, "death", {})]
        rows += [(r.prefix, "diagnoses_icd", {}) for r in self.diagnoses]
        rows += [(r.prefix, "procedures_icd", {}) for r in self.procedures]
        rows += [(r.prefix, "prescriptions", {"field": r.field}) for r in self.prescriptions]
        rows += [(r.prefix, "noteevents", {"category": r.category}) for r in self.notes]
        rows += [(prefix, "derived", {}) for prefix in self.derived]
        return sorted(rows, key=lambda r: -len(r[0]))


def load_mapping(source: str | Path | None = None) -> CodeMapping:
    """A shipped mapping by name (`medtx`, `mimic4`; default `medtx`) or a YAML file path."""
    name = str(source) if source is not None else "medtx"
    if name in SHIPPED:
        text = resources.files("medtx.meds").joinpath("codes", f"{name}.yaml").read_text()
        label = f"medtx/meds/codes/{name}.yaml"
    else:
        path = Path(name)
        if not path.is_file():
            raise MappingError(f"{path}: code mapping file not found (or use one of {', '.join(SHIPPED)})")
        text, label = path.read_text(), str(path)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MappingError(f"{label}: not valid YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(raw, dict):
        raise MappingError(f"{label}: expected a mapping of keys (name, admission, diagnoses, ...)")
    try:
        return CodeMapping.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise MappingError(f"{label}: key {key!r}: {err['msg']}") from exc
