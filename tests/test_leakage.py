"""Tasks with a clock (issue 33): the event-time rule, the history relation builders read, and the leakage gate.

Real parts only: a synthetic cohort generated with the planted death code (V667 at discharge of dying stays),
ingested into a real DuckDB warehouse, codes mapped, samples built by the real builders, the gate run on them
and the real training entry point refusing a blocked task.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from medtx.codes import map_codes
from medtx.ingest import ingest_mimic3
from medtx.tasks.build import build_samples
from medtx.store.db import connect
from medtx.synth import generate_mimic3
from medtx.synth.death import LEAK_CODE
from medtx.synth.oracle import load_oracle
from medtx.tasks import get_task
from medtx.samples.clock import create_event_view
from medtx.tasks.leakage import LeakageError, require_pass, run_gate
from tests.conftest import DATA
from tests.fixtures_samples import insert_rows

PATIENTS = 1000
DATASET = f"synth_{PATIENTS}"
FRACTIONS = (0.5, 0.3, 0.2)
FUROSEMIDE = "00517570425"

_BUILT: dict[str, Path] = {}


@pytest.fixture(scope="module")
def leaky_db(tmp_path_factory) -> Path:
    """A warehouse with a synthetic cohort whose dying stays carry the planted discharge code; mortality and
    readmission built (split seed 2)."""
    if "leaky" not in _BUILT:
        root = tmp_path_factory.mktemp("leaky")
        cohort = root / DATASET
        generate_mimic3(cohort, PATIENTS, seed=3, plant_death_code=True)
        db = root / "warehouse.duckdb"
        ingest_mimic3(db, cohort, DATASET, root / "cache")
        con = connect(db)
        try:
            load_oracle(con, cohort, DATASET)  # the shortcut audit's reference
            map_codes(con, DATA, [DATASET])
            # Split seed 2: the single-token audit (AUROC >= 0.95 on validation) flags the planted code on some
            # splits only (issue 43: 68 of 200 random splits); with the one patient split per dataset seed 1 no
            # longer does (seeds 2, 3 do; 1, 4 do not). The cross-validated audit of issue 43 removes the dependence.
            build_samples(con, DATA, ["readmission", "mortality"], [DATASET], seed=2, fractions=FRACTIONS)
        finally:
            con.close()
        _BUILT["leaky"] = db
    return _BUILT["leaky"]


@pytest.fixture
def leaky_copy(leaky_db, tmp_path) -> Path:
    db = tmp_path / "w.duckdb"
    shutil.copy(leaky_db, db)
    return db


@pytest.fixture
def leaky(leaky_copy):
    con = connect(leaky_copy)
    yield con
    con.close()


def _gate(con, task: str = "mortality") -> tuple:
    return con.execute("SELECT status, split_overlap, late_codes, shortcuts, message FROM samples.leakage_gate "
                       "WHERE dataset = ? AND task = ?", [DATASET, task]).fetchall()[0]


def test_the_planted_code_is_in_the_cohort_and_tied_to_death(leaky):
    died, planted = leaky.execute(f"""
        SELECT count(*) FILTER (WHERE a.hospital_expire_flag = 1),
               count(*) FILTER (WHERE a.hospital_expire_flag = 1 AND d.hadm_id IS NOT NULL)
        FROM raw.admissions a LEFT JOIN (SELECT DISTINCT hadm_id FROM raw.diagnoses_icd WHERE icd9_code = '{LEAK_CODE}') d
        USING (hadm_id) WHERE a.dataset = ?""", [DATASET]).fetchall()[0]
    assert died > 50 and planted / died > 0.8  # 90% of dying stays carry it: a near-perfect label proxy


def test_mortality_at_48h_never_sees_the_planted_code_of_its_own_stay(leaky):
    rows = leaky.execute("SELECT hadm_id, conditions, procedures, label FROM samples.admission_outcome "
                         "WHERE dataset = ? AND task = 'mortality'", [DATASET]).fetchall()
    assert len(rows) > 500 and any(label for *_, label in rows)
    # the current stay (last history element) shows none of its own diagnoses or procedures: coded at discharge
    assert all(c[-1] == [] and p[-1] == [] for _, c, p, _ in rows)
    assert not any(LEAK_CODE in visit for _, c, _, _ in rows for visit in c[-1:])
    status, overlap, late, shortcuts, message = _gate(leaky)
    assert (status, overlap, late, shortcuts) == ("pass", 0, 0, 0), message


def test_a_builder_that_reads_discharge_codes_is_blocked_and_training_refused(leaky, leaky_copy):
    """The old definition's mistake, planted: each sample's current visit gets its stay's own (discharge-time)
    diagnoses. The gate recomputes the prediction time from raw.admissions and finds the codes known later."""
    leaky.execute(f"""
        UPDATE samples.admission_outcome s SET conditions = list_concat(s.conditions[1:len(s.conditions) - 1], [d.codes])
        FROM (SELECT hadm_id, list(DISTINCT trim(icd9_code)) AS codes FROM raw.diagnoses_icd
              WHERE dataset = '{DATASET}' GROUP BY 1) d
        WHERE s.hadm_id = d.hadm_id AND s.dataset = '{DATASET}' AND s.task = 'mortality'""")
    result = run_gate(leaky, get_task("mortality"), DATASET)
    assert result.status == "blocked" and result.late_codes > 100
    assert result.message.startswith(f"leakage gate BLOCKED mortality/{DATASET}: (b) ")
    assert "\n" not in result.message and "sample hadm_id" in result.message and "known only at" in result.message
    with pytest.raises(LeakageError, match=f"^leakage gate BLOCKED mortality/{DATASET}"):
        require_pass(leaky, get_task("mortality"), DATASET)
    # the real training entry point refuses before fitting anything, and records the run as failed
    from medtx.pipeline.steps import train_in_process

    db = leaky_copy
    leaky.close()
    with pytest.raises(LeakageError, match="BLOCKED mortality"):
        train_in_process(db, get_task("mortality"), "logreg", 0, dataset=DATASET)
    con = connect(db)
    try:
        runs = con.execute("SELECT status, error FROM ml.runs WHERE task = 'mortality'").fetchall()
    finally:
        con.close()
    assert [s for s, _ in runs] == ["failed"] and "leakage gate BLOCKED" in runs[0][1]
    # `medtx train` (the pipeline's package path) refuses it too: exit 2, one line
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["train", "--task", "mortality", "--model", "logreg", "--dataset", DATASET,
                                      "--db", str(db), "--device", "cpu"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith(f"train refused: leakage gate BLOCKED mortality/{DATASET}: (b)")


def test_the_shortcut_audit_blocks_the_planted_code_until_acknowledged_with_a_reason(leaky):
    """A retrospective variant (clock at discharge, no outcome bound declared, the stay's own codes as features)
    passes (a), (b) and (d), but the cross-validated audit finds the conditions give death away far beyond the
    oracle: the task is blocked until the config acknowledges it with a reason (more: tests/test_leakage_doors.py)."""
    retro = dataclasses.replace(get_task("mortality"), clock=dataclasses.replace(get_task("mortality").clock,
                                                                  prediction_time="dischtime", outcome_known=None))
    leaky.execute(f"""
        UPDATE samples.admission_outcome s SET prediction_time = a.dischtime FROM raw.admissions a
        WHERE a.hadm_id = s.hadm_id AND a.dataset = s.dataset AND s.dataset = '{DATASET}' AND s.task = 'mortality'""")
    leaky.execute(f"""
        UPDATE samples.admission_outcome s SET conditions = list_concat(s.conditions[1:len(s.conditions) - 1], [d.codes])
        FROM (SELECT hadm_id, list(DISTINCT trim(icd9_code)) AS codes FROM raw.diagnoses_icd
              WHERE dataset = '{DATASET}' GROUP BY 1) d
        WHERE s.hadm_id = d.hadm_id AND s.dataset = '{DATASET}' AND s.task = 'mortality'""")
    result = run_gate(leaky, retro, DATASET)
    assert (result.status, result.split_overlap, result.late_codes) == ("blocked", 0, 0), result.message
    flagged = {s.name: s.value for s in result.shortcuts}
    assert "conditions" in flagged and flagged["conditions"] >= 0.9
    assert result.message.startswith(f"leakage gate BLOCKED mortality/{DATASET}: (c) the features give the label "
                                     f"away: ") and "\n" not in result.message
    with pytest.raises(LeakageError, match="give the label away"):
        require_pass(leaky, get_task("mortality"), DATASET)
    stored = leaky.execute("SELECT feature, token, acknowledged FROM samples.leakage_shortcuts WHERE dataset = ? "
                           "AND task = 'mortality'", [DATASET]).fetchall()
    assert ("conditions", "*", False) in stored
    cleared = run_gate(leaky, retro, DATASET, acknowledge={name: "retrospective by design, checked" for name in flagged})
    assert cleared.status == "pass" and "conditions acknowledged: retrospective by design" in cleared.message
    assert _gate(leaky)[0] == "pass"


def test_a_patient_in_two_splits_is_refused(leaky):
    """The builder's word (a row's subject_id) disagrees with raw.admissions: one stay's row is filed under a
    patient of another split, so the real patient's samples sit in two splits."""
    a, split_a, hadm = leaky.execute(f"""
        SELECT r.subject_id, p.split, min(r.hadm_id) FROM samples.readmission r
        JOIN samples.splits p ON p.dataset = r.dataset AND p.task = 'readmission' AND p.subject_id = r.subject_id
        WHERE r.dataset = '{DATASET}' GROUP BY ALL HAVING count(*) >= 2 ORDER BY 1 LIMIT 1""").fetchall()[0]
    b = leaky.execute("SELECT min(subject_id) FROM samples.splits WHERE dataset = ? AND task = 'readmission' "
                      "AND split <> ?", [DATASET, split_a]).fetchall()[0][0]
    leaky.execute("UPDATE samples.readmission SET subject_id = ? WHERE dataset = ? AND hadm_id = ?",
                  [b, DATASET, hadm])
    # the record predates the change: it judged other samples (their fingerprint), so training refuses them
    with pytest.raises(LeakageError, match=r"^leakage gate: the samples of task 'readmission' on dataset "
                                           r"'synth_1000' are not those the gate judged \(fingerprint "):
        require_pass(leaky, get_task("readmission"), DATASET)
    result = run_gate(leaky, get_task("readmission"), DATASET)
    assert result.status == "blocked" and result.split_overlap == 1
    assert f"(a) 1 patient(s) in more than one split; first: patient {a} (raw.admissions) has samples in splits" \
        in result.message
    with pytest.raises(LeakageError, match=f"BLOCKED readmission/{DATASET}"):
        require_pass(leaky, get_task("readmission"), DATASET)


def test_training_without_a_gate_record_is_refused(leaky):
    leaky.execute("DELETE FROM samples.leakage_gate WHERE task = 'mortality'")
    with pytest.raises(LeakageError, match=r"no record for task 'mortality' on dataset 'synth_1000'; rebuild"):
        require_pass(leaky, get_task("mortality"), DATASET)


# ------------------------------------------------------------------------------------------ the clock


@pytest.fixture
def two_stays(tmp_path):
    """Patient 1: stay 10 (Jan 1-10) and stay 11 (Jan 20-25) whose prescriptions are dated Jan 2 (before its own
    admission: a shifted or mistyped date) and Jan 21. Patient 2: one stay, no later one."""
    con = connect(tmp_path / "warehouse.duckdb")
    insert_rows(con, "patients", [{"dataset": "c", "subject_id": s, "dob": "2050-01-01"} for s in (1, 2)])
    insert_rows(con, "admissions", [
        {"dataset": "c", "subject_id": s, "hadm_id": h, "admittime": a, "dischtime": d, "admission_type": "EMERGENCY",
         "hospital_expire_flag": 0}
        for s, h, a, d in ((1, 10, "2100-01-01 08:00", "2100-01-10 12:00"), (1, 11, "2100-01-20 09:00",
                                                                             "2100-01-25 12:00"),
                           (2, 20, "2101-01-01 08:00", "2101-01-05 08:00"))])
    insert_rows(con, "diagnoses_icd", [{"dataset": "c", "hadm_id": h, "seq_num": 1, "icd9_code": "4019"}
                                       for h in (10, 11, 20)])
    insert_rows(con, "prescriptions", [
        {"dataset": "c", "subject_id": 1, "hadm_id": 11, "ndc": FUROSEMIDE, "drug": "x", "startdate": "2100-01-02"},
        {"dataset": "c", "subject_id": 1, "hadm_id": 11, "ndc": "99999999999", "drug": "Omeprazole",
         "startdate": "2100-01-21"}])
    map_codes(con, DATA, ["c"])
    yield con
    con.close()


def test_the_event_times_follow_the_stated_rule(two_stays):
    create_event_view(two_stays, "c")
    rows = two_stays.sql("SELECT hadm_id, source, code, time::VARCHAR FROM _events ORDER BY hadm_id, time, code").fetchall()
    drug = dict(two_stays.sql("SELECT drug, atc3 FROM core.prescriptions_atc3").fetchall())
    assert rows == [
        (10, "diagnosis", "4019", "2100-01-10 12:00:00"),  # at the stay's discharge
        (11, "drug", drug["x"], "2100-01-20 09:00:00"),  # dated before its own admission: clamped to it
        (11, "drug", drug["Omeprazole"], "2100-01-21 23:59:59.999999"),  # a date: the end of that day
        (11, "diagnosis", "4019", "2100-01-25 12:00:00"),
        (20, "diagnosis", "4019", "2101-01-05 08:00:00"),
    ]


def test_a_prescription_of_a_later_stay_is_never_visible_to_an_earlier_sample(two_stays):
    build_samples(two_stays, DATA, ["readmission"], ["c"], seed=1, fractions=(0.34, 0.33, 0.33))
    rows = dict(two_stays.sql("SELECT hadm_id, drugs FROM samples.readmission ORDER BY hadm_id").fetchall())
    drug = dict(two_stays.sql("SELECT drug, atc3 FROM core.prescriptions_atc3").fetchall())
    assert rows[10] == [[]]  # stay 11's drugs (one dated Jan 2, before stay 10's discharge) are not stay 10's
    assert rows[11] == [[], sorted([drug["x"], drug["Omeprazole"]])]
    # and had a builder put them there, the gate would see the code known only at stay 11's admission
    two_stays.execute("UPDATE samples.readmission SET drugs = [[?]] WHERE hadm_id = 10", [drug["x"]])
    result = run_gate(two_stays, get_task("readmission"), "c")
    assert result.status == "blocked" and result.late_codes == 1
    assert f"sample hadm_id 10 (patient 1) holds drugs code '{drug['x']}' (drug), known only at 2100-01-20 09:00:00" \
        in result.message
