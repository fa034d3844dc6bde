"""Sample builders: PyHealth equivalence, crafted edge cases, splits, vocabularies, text tasks, CLI."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.codes import map_codes
from medtx.codes.mapping import ATC3_PATTERN
from medtx.store.db import connect
from medtx.samples.common import EmptyCohortError
from medtx.samples.vocab import load_vocab
from medtx.tasks.build import build_samples
from medtx.samples.reference import drug_rec_reference
from medtx.samples.splits import assign_splits, split_sizes
from tests.conftest import DATA
from tests.fixtures_samples import DEMO, demo_copy, demo_db, insert_rows  # noqa: F401 (fixtures)

COLS = ("subject_id", "hadm_id", "visit_index", "admittime", "conditions", "procedures", "drugs_hist", "drugs")


def _drug_rec_rows(con, dataset):
    rows = con.execute(f"SELECT {', '.join(COLS)} FROM samples.drug_rec WHERE dataset = ? ORDER BY subject_id, "
                       "visit_index", [dataset]).fetchall()
    return [dict(zip(COLS, r, strict=True)) for r in rows]


def _reference_rows(con, dataset):
    return [{c: s[c] for c in COLS} for s in drug_rec_reference(con, dataset)]


# ------------------------------------------------------------------------------------------ crafted cohort
# Patient 1: three visits, hadm_ids out of time order; visit 12 lacks procedures (skipped).
# Patient 2: two visits but one lacks drugs -> a single kept visit -> dropped.
# Patient 3: one visit only -> dropped. Patient 4: codes in no dictionary, two complete visits.
FUROSEMIDE, OMEPRAZOLE_NAME = "00517570425", "Omeprazole"
ADMISSIONS = [
    (1, 13, "2100-01-01", "2100-01-05", "EMERGENCY"), (1, 11, "2100-03-01", "2100-03-04", "EMERGENCY"),
    (1, 12, "2100-03-20", "2100-03-22", "ELECTIVE"), (1, 14, "2100-06-01", "2100-06-03", "URGENT"),
    (2, 21, "2101-01-01", "2101-01-02", "EMERGENCY"), (2, 22, "2101-01-10", "2101-01-12", "EMERGENCY"),
    (3, 31, "2102-01-01", "2102-01-02", "NEWBORN"),
    (4, 41, "2103-01-01", "2103-01-02", "EMERGENCY"), (4, 42, "2103-01-20", "2103-01-25", "EMERGENCY"),
]


@pytest.fixture(scope="module")
def crafted_db(tmp_path_factory):
    con = connect(tmp_path_factory.mktemp("crafted") / "warehouse.duckdb")
    insert_rows(con, "patients", [{"dataset": "c", "subject_id": s, "dob": "2050-01-01"} for s in (1, 2, 3)]
                + [{"dataset": "c", "subject_id": 4, "dob": "1800-01-01"}])  # shifted >89 DOB
    insert_rows(con, "admissions", [
        {"dataset": "c", "subject_id": s, "hadm_id": h, "admittime": a, "dischtime": d, "admission_type": t,
         "hospital_expire_flag": 1 if h == 14 else 0, "deathtime": "2100-06-03" if h == 14 else None}
        for s, h, a, d, t in ADMISSIONS])
    dx = {13: ["4019", "25000"], 11: ["4280", "4019"], 12: ["486"], 14: ["4280"], 21: ["486"], 22: ["486"],
          31: ["V3000"], 41: ["XYZ12"], 42: ["XYZ12", "4019"]}
    insert_rows(con, "diagnoses_icd", [{"dataset": "c", "hadm_id": h, "seq_num": i + 1, "icd9_code": c}
                                       for h, codes in dx.items() for i, c in enumerate(codes)])
    px = {13: ["3893"], 11: ["3893", "9904"], 14: ["9904"], 21: ["3893"], 22: ["3893"], 31: ["9955"],
          41: ["P0000"], 42: ["3893"]}
    insert_rows(con, "procedures_icd", [{"dataset": "c", "hadm_id": h, "seq_num": i + 1, "icd9_code": c}
                                        for h, codes in px.items() for i, c in enumerate(codes)])
    rx = {13: FUROSEMIDE, 11: "00536338101", 12: FUROSEMIDE, 14: FUROSEMIDE, 21: FUROSEMIDE, 31: FUROSEMIDE,
          41: FUROSEMIDE, 42: "00536338101"}
    insert_rows(con, "prescriptions", [{"dataset": "c", "hadm_id": h, "ndc": n, "drug": "x"} for h, n in rx.items()]
                + [{"dataset": "c", "hadm_id": 11, "ndc": "99999999999", "drug": OMEPRAZOLE_NAME},
                   {"dataset": "c", "hadm_id": 22, "ndc": "99999999998", "drug": "Unknown stuff"}])
    map_codes(con, DATA, ["c"])
    build_samples(con, DATA, ["drug_rec", "next_visit", "readmission"], ["c"])
    yield con
    con.close()


def test_crafted_drug_rec_semantics(crafted_db):
    rows = _drug_rec_rows(crafted_db, "c")
    assert [(r["subject_id"], r["hadm_id"]) for r in rows] == [(1, 13), (1, 11), (1, 14), (4, 41), (4, 42)]
    p1 = rows[:3]
    # chronological order (13 before 11), visit 12 skipped (no procedures), history accumulates
    assert p1[2]["conditions"] == [["4019", "25000"], ["4280", "4019"], ["4280"]]
    assert p1[2]["procedures"] == [["3893"], ["3893", "9904"], ["9904"]]
    # current drugs blanked from the history, earlier visits' drugs kept
    assert p1[0]["drugs_hist"] == [[]]
    assert p1[2]["drugs_hist"] == [p1[0]["drugs"], p1[1]["drugs"], []]
    assert p1[0]["drugs"] == ["C03C"] and "A06A" in p1[1]["drugs"]  # furosemide, bisacodyl
    assert "A02B" in p1[1]["drugs"]  # omeprazole by the drug-name fallback
    # codes in no dictionary are kept, and counted
    assert rows[3]["conditions"] == [["XYZ12"]] and rows[3]["procedures"] == [["P0000"]]
    unknown = crafted_db.sql("SELECT value FROM samples.task_summary WHERE dataset = 'c' AND task = 'drug_rec' "
                             "AND metric = 'conditions_codes_not_in_dictionary'").fetchall()[0][0]
    assert unknown == 1
    assert rows == _reference_rows(crafted_db, "c")


def test_crafted_readmission_rule(crafted_db):
    got = dict(crafted_db.sql("SELECT hadm_id, label FROM samples.readmission WHERE dataset = 'c'").fetchall())
    # 14 died in hospital, 31 is a newborn: excluded. 11 -> 12 is ELECTIVE (not counted), the next unplanned
    # admission 14 is > 30 days later. 41 -> 42 within 30 days; 21 -> 22 within 30 days.
    assert got == {13: False, 11: False, 12: False, 21: True, 22: False, 41: True, 42: False}
    hist = crafted_db.sql("SELECT conditions FROM samples.readmission WHERE hadm_id = 12").fetchall()[0][0]
    assert hist == [["4019", "25000"], ["4280", "4019"], ["486"]]


def test_a_stay_without_a_discharge_time_is_no_readmission_sample(tmp_path):
    """A stay with no DISCHTIME has no prediction time: it is history, never a sample (it used to become one with
    a NULL prediction time, and the leakage gate then blocked the whole task)."""
    con = connect(tmp_path / "w.duckdb")
    insert_rows(con, "patients", [{"dataset": "n", "subject_id": 5, "dob": "2050-01-01"}])
    insert_rows(con, "admissions", [
        {"dataset": "n", "subject_id": 5, "hadm_id": h, "admittime": a, "dischtime": d, "admission_type": "EMERGENCY",
         "hospital_expire_flag": 0} for h, a, d in ((51, "2100-01-01", None), (52, "2100-02-01", "2100-02-04"),
                                                    (53, "2100-02-20", "2100-02-22"))])
    insert_rows(con, "diagnoses_icd", [{"dataset": "n", "hadm_id": h, "seq_num": 1, "icd9_code": "4019"}
                                       for h in (51, 52, 53)])
    map_codes(con, DATA, ["n"])
    build_samples(con, DATA, ["readmission"], ["n"])
    rows = con.sql("SELECT hadm_id, label, prediction_time IS NOT NULL, len(conditions) FROM samples.readmission "
                   "WHERE dataset = 'n' ORDER BY hadm_id").fetchall()
    assert rows == [(52, True, True, 2), (53, False, True, 3)]  # 51 is history of both, never a sample
    con.close()


def test_crafted_next_visit(crafted_db):
    rows = crafted_db.sql("""SELECT hadm_id, next_hadm_id, visits, ages, codes, segments, ages_flat, positions, label
                             FROM samples.next_visit WHERE subject_id = 1 ORDER BY len(visits)""").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(13, 11), (11, 12), (12, 14)]
    h, nxt, visits, ages, codes, segments, ages_flat, positions, label = rows[1]
    assert visits == [["4019", "25000"], ["4280", "4019"]] and label == ["486"] and ages == [50, 50]
    assert codes == ["[CLS]", "4019", "25000", "[SEP]", "4280", "4019", "[SEP]"]
    assert segments == [0, 0, 0, 0, 1, 1, 1] and positions == [0, 0, 0, 0, 1, 1, 1]
    assert len(ages_flat) == len(codes)
    age_p4 = crafted_db.sql("SELECT ages FROM samples.next_visit WHERE subject_id = 4").fetchall()[0][0]
    assert age_p4 == [90]  # shifted DOB capped
    # single-visit patient 3 gives no sample; patient 2 has two visits with diagnoses
    subjects = {r[0] for r in crafted_db.sql("SELECT subject_id FROM samples.next_visit").fetchall()}
    assert subjects == {1, 2, 4}


def test_drug_rec_equals_reference_on_demo(demo_db):
    con = connect(demo_db, read_only=True)
    rows = _drug_rec_rows(con, DEMO)
    assert len(rows) > 20
    assert rows == _reference_rows(con, DEMO)


def test_drug_rec_labels_one_class_per_drug(demo_db):
    """One ATC-3 per prescribed drug: a visit never has more label classes than distinct mapped drugs."""
    con = connect(demo_db, read_only=True)
    over = con.execute("""SELECT count(*) FROM samples.drug_rec s JOIN (
            SELECT hadm_id, count(DISTINCT coalesce(ndc, drug)) AS n_drugs FROM core.prescriptions_atc3
            WHERE dataset = $d GROUP BY hadm_id) m USING (hadm_id)
        WHERE s.dataset = $d AND len(s.drugs) > m.n_drugs""", {"d": DEMO}).fetchall()[0][0]
    assert over == 0
    mean = con.execute("SELECT value FROM samples.task_summary WHERE dataset = ? AND task = 'drug_rec' "
                       "AND metric = 'mean_labels_per_visit'", [DEMO]).fetchall()[0][0]
    assert 15 < mean < 25  # 22.3 measured; 39 when every candidate class of an NDC was kept


def test_demo_samples_shapes(demo_db):
    con = connect(demo_db, read_only=True)
    labels = con.sql("SELECT unnest(drugs) FROM samples.drug_rec").fetchall()
    assert labels and all(re.match(ATC3_PATTERN, x) for (x,) in labels)
    assert con.sql("SELECT count(*) FROM samples.drug_rec WHERE drugs_hist[-1] <> [] OR len(drugs) = 0 "
                   "OR len(conditions) <> visit_index + 1").fetchall()[0][0] == 0
    bad = con.sql("""SELECT count(*) FROM samples.next_visit WHERE len(codes) <> len(segments)
                     OR len(codes) <> len(ages_flat) OR len(codes) <> len(positions) OR len(label) = 0""").fetchall()
    assert bad[0][0] == 0
    # every sample traces back to an admission of its patient
    for table in ("drug_rec", "next_visit", "readmission"):
        orphans = con.sql(f"""SELECT count(*) FROM samples.{table} s LEFT JOIN raw.admissions a
            ON a.dataset = s.dataset AND a.hadm_id = s.hadm_id AND a.subject_id = s.subject_id
            WHERE a.hadm_id IS NULL""").fetchall()[0][0]
        assert orphans == 0, table


def test_splits_patient_level_and_reproducible(demo_copy):
    con = connect(demo_copy)
    for task in ("drug_rec", "next_visit", "readmission"):
        leaked = con.sql(f"""SELECT count(*) FROM (SELECT s.subject_id FROM samples.{task} s JOIN samples.splits p
            ON p.dataset = s.dataset AND p.task = '{task}' AND p.subject_id = s.subject_id
            GROUP BY s.subject_id HAVING count(DISTINCT p.split) > 1)""").fetchall()[0][0]
        assert leaked == 0
        missing = con.sql(f"""SELECT count(*) FROM samples.{task} s ANTI JOIN samples.splits p
            ON p.dataset = s.dataset AND p.task = '{task}' AND p.subject_id = s.subject_id""").fetchall()[0][0]
        assert missing == 0
    before = con.sql("SELECT * FROM samples.splits ORDER BY ALL").fetchall()
    build_samples(con, DATA, ["drug_rec", "next_visit", "readmission", "specialty"], seed=42)
    assert con.sql("SELECT * FROM samples.splits ORDER BY ALL").fetchall() == before
    build_samples(con, DATA, ["readmission"], seed=7)
    after = con.sql("SELECT subject_id, split FROM samples.splits WHERE task = 'readmission' ORDER BY 1").fetchall()
    assert after != [(r[2], r[3]) for r in before if r[1] == "readmission"]


def test_split_sizes_and_assignment():
    assert split_sizes(100) == (70, 10, 20) and split_sizes(14) == (10, 1, 3) and split_sizes(2) == (2, 0, 0)
    assert assign_splits(range(50), 3) == assign_splits(reversed(range(50)), 3)


def test_vocab_from_training_split_only(demo_db):
    con = connect(demo_db, read_only=True)
    vocab = load_vocab(con, DEMO, "drug_rec", "conditions")
    assert vocab.tokens[:2] == ["<pad>", "<unk>"] and vocab.encode(["nope"]) == [1]
    train = {c for (c,) in con.sql("""SELECT DISTINCT unnest(flatten(conditions)) FROM samples.drug_rec s
        JOIN samples.splits p ON p.dataset = s.dataset AND p.task = 'drug_rec' AND p.subject_id = s.subject_id
        WHERE p.split = 'train'""").fetchall()}
    assert set(vocab.tokens[2:]) == train
    assert vocab.encode([vocab.tokens[5]]) == [5]
    codes = load_vocab(con, DEMO, "next_visit", "codes")
    assert codes.tokens[2:5] == ["[CLS]", "[SEP]", "[MASK]"]
    with pytest.raises(LookupError, match="build-samples"):
        load_vocab(con, DEMO, "drug_rec", "nothing")


def test_specialty_groups_never_cross_splits(demo_db):
    con = connect(demo_db, read_only=True)
    crossing = con.sql("""SELECT count(*) FROM (SELECT regexp_replace(lower(text), '[^a-z0-9]+', '', 'g') AS t
        FROM samples.specialty GROUP BY t HAVING count(DISTINCT split) > 1)""").fetchall()[0][0]
    assert crossing == 0
    n, groups, empty = con.sql("SELECT count(*), count(DISTINCT group_id), count(*) FILTER (WHERE trim(text) = '') "
                               "FROM samples.specialty").fetchall()[0]
    assert (n, groups, empty) == (4966, 2355, 0)
    figures = dict(con.sql("SELECT metric, value FROM samples.task_summary WHERE task = 'specialty'").fetchall())
    assert 0.3 < figures["label_noise_ceiling"] < 0.7 and figures["conflicting_groups"] > 0


def test_faq(demo_db):
    con = connect(demo_db, read_only=True)
    rows = con.sql("SELECT pair_id, question, answer, paraphrase, fold FROM samples.faq").fetchall()
    assert len(rows) == 98 and {r[4] for r in rows} == {0, 1, 2, 3, 4}
    assert not any("â€" in r[1] + r[2] for r in rows)
    assert all(r[3] and r[3] != r[1] for r in rows)


def test_empty_cohort_messages(tmp_db):
    con = connect(tmp_db)
    with pytest.raises(EmptyCohortError, match="raw.admissions is empty"):
        build_samples(con, DATA, ["drug_rec"])
    insert_rows(con, "admissions", [{"dataset": "solo", "subject_id": 1, "hadm_id": 1}])
    with pytest.raises(EmptyCohortError, match="2 or more visits"):
        build_samples(con, DATA, ["drug_rec"], ["solo"])
    with pytest.raises(EmptyCohortError, match="no rows in raw.admissions"):
        build_samples(con, DATA, ["next_visit"], ["absent"])
    # building everything skips what has no cohort instead of failing (the one stay has no times: no
    # readmission sample either, it would have no prediction time)
    assert build_samples(con, DATA, None, ["solo"]) == {("faq", "mental_health_faq"): 98}


def test_cli_build_samples(demo_copy):
    result = CliRunner().invoke(app, ["build-samples", "--task", "drug_rec", "--db", str(demo_copy)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(app, ["build-samples", "--task", "nope", "--db", str(demo_copy)])
    assert result.exit_code == 1 and "unknown task" in result.output
