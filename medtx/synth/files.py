"""The files of a generated cohort: MIMIC-III table headers, and deterministic append-only CSV.gz writers
(gzip mtime 0, no file name: the same rows give byte-identical files; a file appears under its final name only
when generation completes)."""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path
from types import TracebackType

import polars as pl

# Headers as in the full MIMIC-III v1.4 release (upper case); the demo has the same columns in lower case.
COLUMNS: dict[str, list[str]] = {
    "PATIENTS": ["ROW_ID", "SUBJECT_ID", "GENDER", "DOB", "DOD", "DOD_HOSP", "DOD_SSN", "EXPIRE_FLAG"],
    "ADMISSIONS": ["ROW_ID", "SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ADMISSION_TYPE",
                   "ADMISSION_LOCATION", "DISCHARGE_LOCATION", "INSURANCE", "LANGUAGE", "RELIGION",
                   "MARITAL_STATUS", "ETHNICITY", "EDREGTIME", "EDOUTTIME", "DIAGNOSIS", "HOSPITAL_EXPIRE_FLAG",
                   "HAS_CHARTEVENTS_DATA"],
    "DIAGNOSES_ICD": ["ROW_ID", "SUBJECT_ID", "HADM_ID", "SEQ_NUM", "ICD9_CODE"],
    "PROCEDURES_ICD": ["ROW_ID", "SUBJECT_ID", "HADM_ID", "SEQ_NUM", "ICD9_CODE"],
    "PRESCRIPTIONS": ["ROW_ID", "SUBJECT_ID", "HADM_ID", "ICUSTAY_ID", "STARTDATE", "ENDDATE", "DRUG_TYPE", "DRUG",
                      "DRUG_NAME_POE", "DRUG_NAME_GENERIC", "FORMULARY_DRUG_CD", "GSN", "NDC", "PROD_STRENGTH",
                      "DOSE_VAL_RX", "DOSE_UNIT_RX", "FORM_VAL_DISP", "FORM_UNIT_DISP", "ROUTE"],
    "NOTEEVENTS": ["ROW_ID", "SUBJECT_ID", "HADM_ID", "CHARTDATE", "CHARTTIME", "STORETIME", "CATEGORY",
                   "DESCRIPTION", "CGID", "ISERROR", "TEXT"],
    "ORACLE_DRUG_REC": ["hadm_id", "atc3", "prob"],
    "ORACLE_NEXT_VISIT": ["hadm_id", "icd9_code", "prob"],
    "ORACLE_READMISSION": ["hadm_id", "prob"],
    "ORACLE_MORTALITY": ["hadm_id", "prob"],
}
MIMIC_TABLES = ("PATIENTS", "ADMISSIONS", "DIAGNOSES_ICD", "PROCEDURES_ICD", "PRESCRIPTIONS", "NOTEEVENTS")
ORACLE_TABLES = ("ORACLE_DRUG_REC", "ORACLE_NEXT_VISIT", "ORACLE_READMISSION", "ORACLE_MORTALITY")


class GzipCsv:
    """Append-only CSV.gz writer: header once, then chunk frames; deterministic bytes (mtime 0, no name)."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path, self.columns, self.rows = path, columns, 0
        self._tmp = path.with_name(path.name + ".tmp")
        self._raw = open(self._tmp, "wb")
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, mtime=0, compresslevel=1)
        self._gz.write((",".join(columns) + "\n").encode())

    def write(self, df: pl.DataFrame) -> None:
        """Append rows; `df` must hold the columns in order (names may differ in case)."""
        if df.height == 0:
            return
        buf = io.BytesIO()
        df.write_csv(buf, include_header=False, datetime_format="%Y-%m-%d %H:%M:%S", float_precision=5)
        self._gz.write(buf.getvalue())
        self.rows += df.height

    def close(self, commit: bool) -> None:
        self._gz.close()
        self._raw.close()
        if commit:
            os.replace(self._tmp, self.path)
        else:
            self._tmp.unlink(missing_ok=True)


class Writers:
    """One GzipCsv per output table; files appear under their final names only if generation completes."""

    def __init__(self, out_dir: Path, tables: tuple[str, ...]) -> None:
        self.files = {t: GzipCsv(out_dir / f"{t}.csv.gz", COLUMNS[t]) for t in tables}

    def __enter__(self) -> Writers:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for w in self.files.values():
            w.close(commit=exc_type is None)


def with_row_id(df: pl.DataFrame, writer: GzipCsv) -> pl.DataFrame:
    """Prepend ROW_ID continuing the file's count, so ids are unique across chunks."""
    return df.with_row_index("row_id", offset=writer.rows + 1)
