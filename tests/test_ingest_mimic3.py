"""Ingest of MIMIC-III-format tables and MTSamples: the bundled data, crafted bad files, atomic failure."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from medtx.store.db import connect
from medtx.ingest import (
    MIMIC3_TABLES,
    IngestError,
    ShrinkGuard,
    dataset_name,
    ingest_mimic3,
    ingest_mimic3_table,
    ingest_mtsamples,
)
from medtx.ingest.schema import MTSAMPLES
from tests.conftest import DATA

DEMO = DATA / "mimic3_demo"
DEMO_ROWS = {"patients": 100, "admissions": 129, "diagnoses_icd": 1761, "procedures_icd": 506,
             "prescriptions": 10398, "noteevents": 0}
RX_HEADER = ("row_id,subject_id,hadm_id,icustay_id,startdate,enddate,drug_type,drug,drug_name_poe,drug_name_generic,"
             "formulary_drug_cd,gsn,ndc,prod_strength,dose_val_rx,dose_unit_rx,form_val_disp,form_unit_disp,route")


def q(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    con = connect(db, read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def warehouse_state(db: Path) -> dict[str, list[tuple]]:
    """Every row of every raw table: what 'exactly as it was' is checked against."""
    tables = [*[s.raw_table for s in MIMIC3_TABLES.values()], MTSAMPLES.raw_table, "raw.ingest_rejects",
              "raw.ingest_log"]
    return {t: sorted(q(db, f"SELECT * FROM {t}"), key=repr) for t in tables}


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("demo") / "w.duckdb"
    ingest_mimic3(db, DEMO)
    return db


def write_rx(folder: Path, body: str, name: str = "PRESCRIPTIONS.csv", header: str = RX_HEADER) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(header + "\n" + body)
    return folder


def rx_row(row_id: int, ndc: str = "00006494300", start: str = "2146-07-21 00:00:00", drug: str = "Bisacodyl") -> str:
    return (f"{row_id},42458,159647,,{start},2146-07-22,MAIN,{drug},{drug},{drug},BISA5,002947,{ndc},"
            "5 mg Tab,10,mg,2,TAB,PO")


# --- the bundled demo ---------------------------------------------------------------------------------------

def test_demo_exact_row_counts_and_log(demo_db):
    for table, n in DEMO_ROWS.items():
        assert q(demo_db, f"SELECT count(*) FROM raw.{table} WHERE dataset = 'mimic3_demo'")[0][0] == n
    log = q(demo_db, "SELECT table_name, rows_loaded, rows_rejected, status, length(file_sha256) FROM raw.ingest_log")
    assert sorted(log) == sorted((t, n, 0, "loaded", 64) for t, n in DEMO_ROWS.items())
    assert q(demo_db, "SELECT count(*) FROM raw.ingest_rejects")[0][0] == 0


def test_demo_types_and_codes_kept_as_text(demo_db):
    types = dict(q(demo_db, "SELECT column_name, data_type FROM information_schema.columns "
                            "WHERE table_schema = 'raw' AND table_name = 'prescriptions'"))
    assert types["subject_id"] == "BIGINT" and types["startdate"] == "TIMESTAMP" and types["ndc"] == "VARCHAR"
    # NDC: 11 characters with leading zeros intact; '0' (1,477 rows) and one empty value kept as-is.
    assert q(demo_db, "SELECT ndc FROM raw.prescriptions WHERE row_id = 32600")[0][0] == "00006494300"
    assert q(demo_db, "SELECT count(*) FROM raw.prescriptions WHERE ndc = '0'")[0][0] == 1477
    assert q(demo_db, "SELECT count(*) FROM raw.prescriptions WHERE ndc IS NULL")[0][0] == 1
    # ICD-9 codes with leading zeros (e.g. V-codes aside, '0389' septicemia) survive.
    assert q(demo_db, "SELECT count(*) FROM raw.diagnoses_icd WHERE icd9_code LIKE '0%'")[0][0] > 0
    assert str(q(demo_db, "SELECT admittime FROM raw.admissions WHERE hadm_id = 142345")[0][0]) == "2164-10-23 21:09:00"


def test_schema_module_matches_migration(demo_db):
    for spec in [*MIMIC3_TABLES.values(), MTSAMPLES]:
        schema, name = spec.raw_table.split(".")
        cols = q(demo_db, "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = ? "
                          "AND table_name = ? ORDER BY ordinal_position", [schema, name])
        expected = [(c.name, c.type) for c in spec.columns]
        assert cols == ([("dataset", "VARCHAR")] if spec.has_dataset else []) + expected


def test_idempotent_rerun_and_upper_case_headers_side_by_side(demo_db, tmp_path):
    db = tmp_path / "w.duckdb"
    ingest_mimic3(db, DEMO, tables=["patients", "prescriptions"])
    ingest_mimic3(db, DEMO, tables=["patients", "prescriptions"])  # same source again: no duplicates
    assert q(db, "SELECT count(*) FROM raw.prescriptions")[0][0] == 10398
    # Full MIMIC-III has upper-case headers and plain .csv files: same rows, another dataset, side by side.
    upper = tmp_path / "Full MIMIC-III"
    upper.mkdir()
    with gzip.open(DEMO / "PRESCRIPTIONS.csv.gz", "rt") as src:
        header, rest = src.read().split("\n", 1)
    (upper / "PRESCRIPTIONS.csv").write_text(header.upper() + "\n" + rest)
    result = ingest_mimic3_table(db, "prescriptions", upper)
    assert (result.dataset, result.rows_loaded, result.rows_rejected) == ("full_mimic_iii", 10398, 0)
    assert q(db, "SELECT dataset, count(*) FROM raw.prescriptions GROUP BY 1 ORDER BY 1") == [
        ("full_mimic_iii", 10398), ("mimic3_demo", 10398)]
    same = q(db, "SELECT count(*) FROM (SELECT * EXCLUDE dataset FROM raw.prescriptions WHERE dataset = 'mimic3_demo'"
                 " EXCEPT ALL SELECT * EXCLUDE dataset FROM raw.prescriptions WHERE dataset = 'full_mimic_iii')")
    assert same == [(0,)]
    assert q(db, "SELECT count(*) FROM raw.ingest_log WHERE table_name = 'prescriptions'")[0][0] == 3


def test_changed_source_replaces_only_that_dataset(tmp_path):
    db = tmp_path / "w.duckdb"
    ingest_mimic3_table(db, "prescriptions", DEMO)
    folder = write_rx(tmp_path / "mine", "\n".join(rx_row(i) for i in range(1, 4)) + "\n")
    ingest_mimic3_table(db, "prescriptions", folder, dataset="mine")
    write_rx(folder, rx_row(9) + "\n")  # the source changes: re-ingest replaces that dataset's rows
    # 3 -> 1 rows is a shrink past the guard (tests/test_ingest_guards.py): asked for explicitly here
    result = ingest_mimic3_table(db, "prescriptions", folder, dataset="mine", guard=ShrinkGuard(allow_shrink=True))
    assert result.rows_loaded == 1
    assert q(db, "SELECT dataset, count(*) FROM raw.prescriptions GROUP BY 1 ORDER BY 1") == [
        ("mimic3_demo", 10398), ("mine", 1)]
    shas = q(db, "SELECT DISTINCT file_sha256 FROM raw.ingest_log WHERE dataset = 'mine'")
    assert len(shas) == 2


def test_noteevents_absent_is_logged_and_skipped(tmp_path):
    folder = write_rx(tmp_path / "no_notes", rx_row(1) + "\n")
    db = tmp_path / "w.duckdb"
    result = ingest_mimic3_table(db, "noteevents", folder)
    assert (result.status, result.rows_loaded) == ("absent", 0)
    assert q(db, "SELECT table_name, status FROM raw.ingest_log") == [("noteevents", "absent")]
    with pytest.raises(IngestError, match="no ADMISSIONS.csv or ADMISSIONS.csv.gz found"):
        ingest_mimic3_table(db, "admissions", folder)


def test_mtsamples_bundled_and_kaggle_layout(tmp_path):
    db = tmp_path / "w.duckdb"
    result = ingest_mtsamples(db, DATA / "mtsamples" / "mtsamples.csv.gz")
    assert (result.rows_loaded, result.rows_rejected, result.dataset) == (4999, 0, "mtsamples")
    assert q(db, "SELECT count(DISTINCT medical_specialty), count(*) FILTER (transcription IS NULL) "
                 "FROM raw.mtsamples") == [(40, 33)]
    # Kaggle's original: unnamed 0-based index first, quoted multi-line transcription, leading spaces.
    kaggle = tmp_path / "mtsamples.csv"
    kaggle.write_text(',description,medical_specialty,sample_name,transcription,keywords\n'
                      '0, A note., Allergy / Immunology, Rhinitis,"line one\nline two",allergy\n'
                      '1, B., Bariatrics, Bypass,"x",\n')
    result = ingest_mtsamples(db, kaggle, guard=ShrinkGuard(allow_shrink=True))  # 4,999 -> 2 notes: asked for
    assert result.rows_loaded == 2
    assert q(db, "SELECT note_id, medical_specialty, transcription FROM raw.mtsamples ORDER BY 1") == [
        (1, " Allergy / Immunology", "line one\nline two"), (2, " Bariatrics", "x")]


# --- bad input ---------------------------------------------------------------------------------------------

def test_bad_rows_go_to_rejects_and_nothing_is_lost(tmp_path):
    rows = [
        rx_row(1, ndc="00002"),  # NDC with leading zeros (short code): kept as text
        rx_row(2, drug='"Multi\nline, quoted"'),  # quoted newline and comma: one record, loads
        rx_row(3, start="2146-13-45 25:00:00"),  # impossible timestamp -> CAST reject
        rx_row(4, start="2146-07-21"),  # date only: fine
        "5,42458,159647,,2146-07-21,2146-07-22,MAIN",  # too few columns
        rx_row(6) + ",EXTRA",  # too many columns
        "7,not_a_subject,159647,,2146-07-21,2146-07-22,MAIN,D,D,D,F,G,0,P,1,mg,1,TAB,PO",  # bad id
        rx_row(8),
    ]
    folder = write_rx(tmp_path / "bad", "\n".join(rows) + "\n")
    db = tmp_path / "w.duckdb"
    result = ingest_mimic3_table(db, "prescriptions", folder, dataset="bad")
    assert (result.rows_loaded, result.rows_rejected) == (4, 4)
    assert result.rows_loaded + result.rows_rejected == len(rows)  # nothing lost
    assert q(db, "SELECT row_id, ndc, drug FROM raw.prescriptions ORDER BY row_id") == [
        (1, "00002", "Bisacodyl"), (2, "00006494300", "Multi\nline, quoted"), (4, "00006494300", "Bisacodyl"),
        (8, "00006494300", "Bisacodyl")]
    rejects = q(db, "SELECT DISTINCT line, error_type, split_part(raw_line, ',', 1) FROM raw.ingest_rejects "
                    "WHERE dataset = 'bad' AND table_name = 'prescriptions' ORDER BY line")
    assert [(r[1], r[2]) for r in rejects] == [
        ("CAST", "3"), ("MISSING COLUMNS", "5"), ("TOO MANY COLUMNS", "6"), ("CAST", "7")]
    bad_ts = q(db, "SELECT column_name, file, error FROM raw.ingest_rejects WHERE raw_line LIKE '3,%'")[0]
    assert bad_ts[0] == "startdate" and bad_ts[1].endswith("PRESCRIPTIONS.csv") and "2146-13-45" in bad_ts[2]
    assert q(db, "SELECT rows_rejected FROM raw.ingest_log")[0][0] == 4
    # Re-ingest replaces the rejects too (no duplicates).
    ingest_mimic3_table(db, "prescriptions", folder, dataset="bad")
    assert q(db, "SELECT count(DISTINCT line), count(*) FROM raw.ingest_rejects")[0][0] == 4


def _corrupt_gzip(folder: Path) -> None:
    data = gzip.compress((RX_HEADER + "\n" + "\n".join(rx_row(i) for i in range(2000))).encode())
    (folder / "PRESCRIPTIONS.csv.gz").write_bytes(data[: len(data) // 2])  # truncated mid-stream


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda f: (f / "PRESCRIPTIONS.csv").write_text(""), "the file is empty"),
        (lambda f: (f / "PRESCRIPTIONS.csv.gz").write_bytes(b"\x1f\x8b\x08\x00garbage" * 10), "unreadable gzip"),
        (_corrupt_gzip, "cannot read the file: .*GZIP"),
        (lambda f: write_rx(f, rx_row(1) + "\n", header=RX_HEADER.replace(",ndc,", ",national_code,")),
         "missing required column.s. ndc"),
        (lambda f: shutil.copy(DEMO / "PATIENTS.csv.gz", f / "PRESCRIPTIONS.csv.gz"),
         "looks like PATIENTS, not PRESCRIPTIONS"),
    ],
    ids=["empty", "bad-gzip-header", "truncated-gzip", "missing-column", "wrong-table"],
)
def test_bad_file_fails_clearly_and_leaves_warehouse_as_it_was(demo_db, tmp_path, make, message):
    db = tmp_path / "w.duckdb"
    shutil.copy(demo_db, db)  # a warehouse holding the whole demo (a copy: the fixture is shared)
    before = warehouse_state(db)
    folder = tmp_path / "demo_copy"
    folder.mkdir()
    make(folder)
    with pytest.raises(IngestError, match=message) as err:
        ingest_mimic3_table(db, "prescriptions", folder, dataset="mimic3_demo")
    assert "PRESCRIPTIONS.csv" in str(err.value)  # the message names the file
    assert warehouse_state(db) == before


def test_dataset_names():
    assert dataset_name(DEMO) == "mimic3_demo"
    assert dataset_name("https://storage.googleapis.com/pyhealth/Synthetic_MIMIC-III/") == "synthetic_mimic_iii"
    assert dataset_name("https://h/x/Synthetic_MIMIC-III/PATIENTS.csv") == "synthetic_mimic_iii"
    with pytest.raises(ValueError, match="must match"):
        ingest_mimic3_table(Path("unused.duckdb"), "patients", DEMO, dataset="Bad-Name")
