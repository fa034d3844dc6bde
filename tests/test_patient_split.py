"""One patient split per dataset (issue 43): every EHR task, every build and the MEDS export put a patient in the
same split; a split drawn per admission or per task is caught; a prescription dated after discharge is dropped.

Real parts only: the bundled demo and a synthetic cohort ingested into real DuckDB warehouses, samples built by
the real builders, the real MEDS export read back from its parquet files, the real leakage gate.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from medtx.codes import map_codes
from medtx.ingest import ingest_mimic3
from medtx.meds import ExportError, export_meds
from medtx.meds.export import TO_MEDS_SPLIT
from medtx.samples.clock import create_event_view
from medtx.samples.splits import assign_splits, write_splits
from medtx.store.db import connect
from medtx.synth import generate_mimic3
from medtx.tasks import get_task
from medtx.tasks.build import build_samples
from medtx.tasks.leakage import run_gate
from tests.conftest import DATA
from tests.fixtures_samples import DEMO, demo_db, insert_rows  # noqa: F401  (session fixture)

EHR = ("drug_rec", "next_visit", "readmission", "mortality")
LABELS = ["readmission", "mortality"]
SYNTH = "synth_300"
FUROSEMIDE, PANTOPRAZOLE, HEPARIN = "00517570425", "00008084199", "63323026201"  # ATC-3 C03C, A02B, B01A


def _one_split_everywhere(con, dataset: str, out: Path) -> dict[int, str]:
    """Assert that the dataset's patient split covers every patient, that every task's split and the export's
    subject_splits, per-task splits and label folders agree with it; returns it."""
    patients = {r[0] for r in con.execute(
        "SELECT subject_id FROM raw.patients WHERE dataset = $d UNION SELECT subject_id FROM raw.admissions "
        "WHERE dataset = $d", {"d": dataset}).fetchall()}
    split = dict(con.execute("SELECT subject_id, split FROM samples.patient_splits WHERE dataset = ?",
                             [dataset]).fetchall())
    assert set(split) == patients
    for task in EHR:
        rows = dict(con.execute("SELECT subject_id, split FROM samples.splits WHERE dataset = ? AND task = ?",
                                [dataset, task]).fetchall())
        assert len(rows) >= 3 and {rows[p] for p in rows} == {"train", "val", "test"}, task  # every split used
        assert {p: split[p] for p in rows} == rows, task
    meds = {v: k for k, v in TO_MEDS_SPLIT.items()}
    given = dict(pl.read_parquet(out / "metadata" / "subject_splits.parquet").iter_rows())
    assert {p: meds[s] for p, s in given.items()} == {p: split[p] for p in given}
    assert len(given) >= len(patients) - 5  # patients without any event are not exported
    per_task = pl.read_parquet(out / "metadata" / "medtx_task_splits.parquet")
    assert set(per_task["task"]) == set(EHR)
    assert all(meds[s] == split[p] for p, _, s in per_task.iter_rows())
    for task in LABELS:  # a label sits in the folder of medtx's own split of its patient, for every task
        for folder in ("train", "tuning", "held_out"):
            files = list((out / "labels" / task / folder).glob("*.parquet"))
            subjects = set(pl.read_parquet(files)["subject_id"]) if files else set()
            assert subjects and all(split[p] == meds[folder] for p in subjects), (task, folder)
    return split


def test_every_task_and_the_meds_export_share_one_split_on_the_demo(demo_db, tmp_path):  # noqa: F811
    db = tmp_path / "demo.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        result = export_meds(con, DEMO, tmp_path / "meds", labels=LABELS)
        split = _one_split_everywhere(con, DEMO, result.out)
        assert len(split) == 100
        # the same draw whatever is built, in whatever order: drug_rec alone redraws the same rows
        before = con.sql("SELECT * FROM samples.patient_splits ORDER BY ALL").fetchall()
        build_samples(con, DATA, ["drug_rec"], [DEMO])
        assert con.sql("SELECT * FROM samples.patient_splits ORDER BY ALL").fetchall() == before
        # an old per-task draw (what medtx did before): the export refuses those labels, naming the task
        units = [r[0] for r in con.sql("SELECT DISTINCT subject_id FROM samples.admission_outcome").fetchall()]
        write_splits(con, DEMO, "mortality", units, seed=42)
        with pytest.raises(ExportError, match=r"--labels mortality: \d+ subject\(s\) sit in another split in task "
                                              r"'mortality' than in subject_splits.parquet .*medtx build-samples"):
            export_meds(con, DEMO, tmp_path / "meds", labels=["mortality"], overwrite=True)
    finally:
        con.close()


@pytest.fixture(scope="module")
def synth_db(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("one-split")
    generate_mimic3(root / SYNTH, 300, seed=11)
    db = root / "warehouse.duckdb"
    ingest_mimic3(db, root / SYNTH, SYNTH, root / "cache")
    con = connect(db)
    try:
        map_codes(con, DATA, [SYNTH])
        build_samples(con, DATA, list(EHR), [SYNTH], seed=5)
    finally:
        con.close()
    return db


def test_every_task_and_the_meds_export_share_one_split_on_a_synthetic_cohort(synth_db, tmp_path):
    db = tmp_path / "w.duckdb"
    shutil.copy(synth_db, db)
    con = connect(db)
    try:
        result = export_meds(con, SYNTH, tmp_path / "meds", labels=LABELS)
        split = _one_split_everywhere(con, SYNTH, result.out)
        assert len(split) == 300
        assert con.sql("SELECT DISTINCT seed FROM samples.patient_splits").fetchall() == [(5,)]
        # each task draws nothing of its own: the old per-task draws put ~40% of shared patients apart
        per_task = {t: assign_splits([p for (p,) in con.execute(
            "SELECT subject_id FROM samples.splits WHERE dataset = ? AND task = ?", [SYNTH, t]).fetchall()], 5)
            for t in ("readmission", "mortality")}
        shared = per_task["readmission"].keys() & per_task["mortality"].keys()
        apart = sum(per_task["readmission"][p] != per_task["mortality"][p] for p in shared)
        assert len(shared) > 150 and apart > len(shared) // 5
    finally:
        con.close()


def test_a_split_drawn_per_admission_is_blocked_by_the_gate(synth_db, tmp_path):
    """A builder that split admissions, not patients (its rows' subject_id is the hadm_id): patients with two
    stays land in two splits, and the gate blocks the task naming one."""
    db = tmp_path / "w.duckdb"
    shutil.copy(synth_db, db)
    con = connect(db)
    try:
        assert run_gate(con, get_task("readmission"), SYNTH).status == "pass"
        con.execute("UPDATE samples.readmission SET subject_id = hadm_id WHERE dataset = ?", [SYNTH])
        stays = [r[0] for r in con.execute("SELECT hadm_id FROM samples.readmission WHERE dataset = ?",
                                           [SYNTH]).fetchall()]
        write_splits(con, SYNTH, "readmission", stays, seed=5)  # drawn per admission
        result = run_gate(con, get_task("readmission"), SYNTH)
        assert result.status == "blocked" and result.split_overlap > 10
        assert "patient(s) in more than one split; first: patient" in result.message
    finally:
        con.close()


@pytest.fixture
def late_rx(tmp_path):
    """Patient 1: stay 10 (Jan 1 08:00 - Jan 10 12:00) with three prescriptions: started Jan 5, on the discharge day
    (Jan 10) and two days after the discharge (Jan 12); stay 11 in March. Patient 2, 3: one stay each."""
    con = connect(tmp_path / "warehouse.duckdb")
    insert_rows(con, "patients", [{"dataset": "c", "subject_id": s, "dob": "2050-01-01", "gender": "F"}
                                  for s in (1, 2, 3)])
    insert_rows(con, "admissions", [
        {"dataset": "c", "subject_id": s, "hadm_id": h, "admittime": a, "dischtime": d, "admission_type": "EMERGENCY",
         "hospital_expire_flag": 0}
        for s, h, a, d in ((1, 10, "2100-01-01 08:00", "2100-01-10 12:00"), (1, 11, "2100-03-01 09:00",
                                                                             "2100-03-05 12:00"),
                           (2, 20, "2101-01-01 08:00", "2101-01-05 08:00"),
                           (3, 30, "2101-02-01 08:00", "2101-02-05 08:00"))])
    insert_rows(con, "diagnoses_icd", [{"dataset": "c", "subject_id": h // 10, "hadm_id": h, "seq_num": 1,
                                        "icd9_code": "4019"} for h in (10, 11, 20, 30)])
    insert_rows(con, "prescriptions", [
        {"dataset": "c", "subject_id": 1, "hadm_id": 10, "ndc": ndc, "drug": drug, "startdate": day}
        for ndc, drug, day in ((FUROSEMIDE, "Furosemide", "2100-01-05"), (PANTOPRAZOLE, "Pantoprazole", "2100-01-10"),
                               (HEPARIN, "Heparin", "2100-01-12"))])
    map_codes(con, DATA, ["c"])
    yield con
    con.close()


def test_a_prescription_dated_after_discharge_is_dropped_not_clamped(late_rx, tmp_path):
    atc = dict(late_rx.sql("SELECT drug, atc3 FROM core.prescriptions_atc3").fetchall())
    assert set(atc) == {"Furosemide", "Pantoprazole", "Heparin"} and len(set(atc.values())) == 3
    create_event_view(late_rx, "c")
    drugs = late_rx.sql("SELECT code, time::VARCHAR FROM _events WHERE source = 'drug' ORDER BY time").fetchall()
    assert drugs == [(atc["Furosemide"], "2100-01-05 23:59:59.999999"),
                     (atc["Pantoprazole"], "2100-01-10 12:00:00")]  # the discharge day's: clamped to the discharge
    build_samples(late_rx, DATA, ["readmission"], ["c"], seed=1)
    rows = dict(late_rx.sql("SELECT hadm_id, drugs FROM samples.readmission ORDER BY hadm_id").fetchall())
    assert rows[10] == [sorted([atc["Furosemide"], atc["Pantoprazole"]])]
    assert rows[11] == [sorted([atc["Furosemide"], atc["Pantoprazole"]]), []]
    assert late_rx.sql("SELECT value FROM samples.task_summary WHERE task = 'readmission' "
                       "AND metric = 'prescriptions_after_discharge'").fetchall() == [(1.0,)]
    # had a builder kept it at the discharge (the old clamp), the gate would block it: no event explains it
    late_rx.execute("UPDATE samples.readmission SET drugs = [list_append(drugs[1], ?)] WHERE hadm_id = 10",
                    [atc["Heparin"]])
    result = run_gate(late_rx, get_task("readmission"), "c")
    assert result.status == "blocked" and result.late_codes == 1
    # the MEDS export does not hold it either
    out = export_meds(late_rx, "c", tmp_path / "meds").out
    events = pl.read_parquet(out / "data" / "**" / "*.parquet")
    assert sorted(events.filter(pl.col("code").str.starts_with("MEDICATION//"))["drug"]) == ["Furosemide",
                                                                                           "Pantoprazole"]


def _per_task_draw(con, dataset: str, task: str) -> tuple[int, str, str]:
    """Replace the task's split by a draw of its own over its patients (what medtx did before the one split),
    with the dataset's seed; returns the first patient it moves: (patient, its new split, the dataset's)."""
    split = dict(con.execute("SELECT subject_id, split FROM samples.patient_splits WHERE dataset = ?",
                             [dataset]).fetchall())
    seed = con.execute("SELECT min(seed) FROM samples.patient_splits WHERE dataset = ?", [dataset]).fetchall()[0][0]
    patients = [r[0] for r in con.execute("SELECT subject_id FROM samples.splits WHERE dataset = ? AND task = ?",
                                          [dataset, task]).fetchall()]
    own = write_splits(con, dataset, task, patients, seed=seed)
    moved = sorted(p for p in own if own[p] != split[p])
    assert moved, task  # the per-task draw differs from the dataset's
    return moved[0], own[moved[0]], split[moved[0]]


@pytest.mark.parametrize("where", ["demo", "synthetic"])
def test_a_split_drawn_per_task_is_blocked_naming_the_task_and_the_first_patient(where, demo_db, synth_db,  # noqa: F811
                                                                                   tmp_path):
    """Each EHR task's stored split, drawn by the task itself (no patient in two splits, so check (a)'s overlap
    cannot see it), is blocked by the gate in one line naming the task and the first patient off the dataset's
    patient split; the honest builds pass."""
    source, dataset = (demo_db, DEMO) if where == "demo" else (synth_db, SYNTH)
    db = tmp_path / "w.duckdb"
    shutil.copy(source, db)
    con = connect(db)
    try:
        for name in EHR:
            task = get_task(name)
            honest = run_gate(con, task, dataset)
            assert honest.status == "pass" and honest.split_off == 0, honest.message
            patient, own, theirs = _per_task_draw(con, dataset, name)
            result = run_gate(con, task, dataset)
            assert result.status == "blocked" and result.split_overlap == 0 and result.split_off > 0, name
            assert "\n" not in result.message and result.message.startswith(f"leakage gate BLOCKED {name}/{dataset}")
            assert (f"off the dataset's patient split; first: patient {patient} is {own} in task {name} but "
                    f"{theirs} in the dataset's patient split") in result.message, result.message
            assert con.execute("SELECT status, split_off FROM samples.leakage_gate WHERE dataset = ? AND task = ?",
                               [dataset, name]).fetchall() == [("blocked", result.split_off)]
    finally:
        con.close()


def test_a_split_drawn_per_admission_is_blocked_on_the_demo(demo_db, tmp_path):  # noqa: F811
    """The demo's readmission split drawn per admission (rows keyed by hadm_id): blocked, naming the task and the
    first patient whose stays are not in the dataset's patient split."""
    db = tmp_path / "w.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        con.execute("UPDATE samples.readmission SET subject_id = hadm_id WHERE dataset = ?", [DEMO])
        stays = [r[0] for r in con.execute("SELECT hadm_id FROM samples.readmission WHERE dataset = ?",
                                           [DEMO]).fetchall()]
        write_splits(con, DEMO, "readmission", stays, seed=42)
        first = con.execute(  # the first patient one of whose stays sits in another split than the patient's
            """SELECT min(a.subject_id) FROM samples.readmission r JOIN raw.admissions a USING (dataset, hadm_id)
               JOIN samples.splits s ON s.dataset = r.dataset AND s.task = 'readmission' AND s.subject_id = r.hadm_id
               JOIN samples.patient_splits p ON p.dataset = r.dataset AND p.subject_id = a.subject_id
               WHERE r.dataset = ? AND s.split <> p.split""", [DEMO]).fetchall()[0][0]
        result = run_gate(con, get_task("readmission"), DEMO)
        assert result.status == "blocked" and result.split_off > 0
        assert f"off the dataset's patient split; first: patient {first} is " in result.message, result.message
        assert "\n" not in result.message
    finally:
        con.close()
