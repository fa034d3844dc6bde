"""A plain per-patient Python reference of `samples.drug_rec`, written from PyHealth's
`drug_recommendation_mimic3_fn` (MISSION.md section 2), to prove the set-based builder equivalent and to
measure its speed-up. Deliberately simple and slow: dicts and loops, no SQL beyond fetching raw rows.

Shared conventions with the builder (the definition leaves them open): codes are trimmed and deduplicated
keeping the order of their first `seq_num` (ties by code); ATC-3 labels are sorted; visits are ordered by
admittime (missing last), then hadm_id; one admission per hadm_id (the first by row_id). The drugs of a
visit are the distinct ATC-3 of its rows in core.prescriptions_atc3, which holds ONE class per prescription
row (medtx.codes.mapping), so a visit never has more label classes than mapped drugs. A prescription dated after
its stay's discharge (its start day begins after `dischtime`) is not one of the stay's drugs (medtx.samples.clock)
- a departure from PyHealth, which keeps it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

import duckdb


def _codes_by_visit(rows: list[tuple[int, int | None, str | None]]) -> dict[int, list[str]]:
    """(hadm_id, seq_num, code) rows -> hadm_id -> distinct codes by first seq_num, then code."""
    first: dict[int, dict[str, float]] = defaultdict(dict)
    for hadm_id, seq_num, code in rows:
        if hadm_id is None or code is None or not code.strip():
            continue
        code = code.strip()
        seq = float("inf") if seq_num is None else seq_num
        first[hadm_id][code] = min(first[hadm_id].get(code, seq), seq)
    return {h: sorted(c, key=lambda code: (c[code], code)) for h, c in first.items()}


def drug_recommendation_fn(visits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One patient's visits (ordered) -> samples, exactly as PyHealth's task function does it."""
    samples = []
    for visit in visits:
        conditions, procedures, drugs = visit["conditions"], visit["procedures"], visit["drugs"]
        # exclude: visits without condition, procedure, or drug code
        if len(conditions) * len(procedures) * len(drugs) == 0:
            continue
        samples.append({
            "subject_id": visit["subject_id"], "hadm_id": visit["hadm_id"], "admittime": visit["admittime"],
            "conditions": conditions, "procedures": procedures, "drugs": drugs, "drugs_hist": drugs,
        })
    # exclude: patients with less than 2 visits
    if len(samples) < 2:
        return []
    # add history
    samples[0]["conditions"] = [samples[0]["conditions"]]
    samples[0]["procedures"] = [samples[0]["procedures"]]
    samples[0]["drugs_hist"] = [samples[0]["drugs_hist"]]
    for i in range(1, len(samples)):
        samples[i]["conditions"] = samples[i - 1]["conditions"] + [samples[i]["conditions"]]
        samples[i]["procedures"] = samples[i - 1]["procedures"] + [samples[i]["procedures"]]
        samples[i]["drugs_hist"] = samples[i - 1]["drugs_hist"] + [samples[i]["drugs_hist"]]
    # remove the target drug from the history
    for i in range(len(samples)):
        samples[i]["drugs_hist"][i] = []
        samples[i]["visit_index"] = i
    return samples


def drug_rec_reference(con: duckdb.DuckDBPyConnection, dataset: str) -> list[dict[str, Any]]:
    """All drug_rec samples of a dataset, patient by patient, from raw.* and core.prescriptions_atc3."""
    p = [dataset]
    admissions = con.execute(
        "SELECT row_id, subject_id, hadm_id, admittime, dischtime FROM raw.admissions WHERE dataset = ?", p
    ).fetchall()
    diagnoses = _codes_by_visit(con.execute(
        "SELECT hadm_id, seq_num, icd9_code FROM raw.diagnoses_icd WHERE dataset = ?", p).fetchall())
    procedures = _codes_by_visit(con.execute(
        "SELECT hadm_id, seq_num, icd9_code FROM raw.procedures_icd WHERE dataset = ?", p).fetchall())
    first_row: dict[int, tuple] = {}
    for row_id, subject_id, hadm_id, admittime, dischtime in admissions:
        if subject_id is None or hadm_id is None:
            continue
        key = (float("inf") if row_id is None else row_id, admittime or datetime.max)
        if hadm_id not in first_row or key < first_row[hadm_id][0]:
            first_row[hadm_id] = (key, subject_id, admittime, dischtime)
    drugs: dict[int, set[str]] = defaultdict(set)
    for hadm_id, atc3, startdate in con.execute(
        "SELECT hadm_id, atc3, startdate FROM core.prescriptions_atc3 WHERE dataset = ?", p
    ).fetchall():
        dischtime = first_row[hadm_id][3] if hadm_id in first_row else None
        start_day = None if startdate is None else datetime(startdate.year, startdate.month, startdate.day)
        if start_day is not None and dischtime is not None and start_day > dischtime:
            continue  # dated after its stay's discharge: dropped (medtx.samples.clock)
        drugs[hadm_id].add(atc3)

    patients: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for hadm_id, (_, subject_id, admittime, _) in first_row.items():
        patients[subject_id].append({
            "subject_id": subject_id, "hadm_id": hadm_id, "admittime": admittime,
            "conditions": diagnoses.get(hadm_id, []), "procedures": procedures.get(hadm_id, []),
            "drugs": sorted(drugs.get(hadm_id, set())),
        })
    samples = []
    for subject_id in sorted(patients):
        visits = sorted(patients[subject_id], key=lambda v: (v["admittime"] is None, v["admittime"] or datetime.min,
                                                             v["hadm_id"]))
        samples.extend(drug_recommendation_fn(visits))
    return samples
