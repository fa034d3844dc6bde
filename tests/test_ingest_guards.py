"""Issue 12, cases 1-3, through the real `medtx ingest` CLI on a real DuckDB file, bad inputs built here
from the bundled data: a failed ingest changes no table of any dataset (one unit per dataset), row-count
guards, and honest reject accounting (swallowed records fail, the whole raw line is kept)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.store.db import connect
from tests.conftest import DATA

DEMO = DATA / "mimic3_demo"
MTSAMPLES = DATA / "mtsamples" / "mtsamples.csv.gz"
TABLES = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents")
DEMO_ROWS = {"patients": 100, "admissions": 129, "diagnoses_icd": 1761, "procedures_icd": 506,
             "prescriptions": 10398, "noteevents": 0}


def counts(db: Path) -> dict[str, int]:
    """Rows of every raw table per dataset, plus the rejects and the ingest log: the whole raw state."""
    con = connect(db, read_only=True)
    try:
        out = {}
        for t in TABLES:
            for dataset, n in con.execute(f"SELECT dataset, count(*) FROM raw.{t} GROUP BY 1").fetchall():
                out[f"{t}[{dataset}]"] = n
        out["mtsamples"] = con.sql("SELECT count(*) FROM raw.mtsamples").fetchall()[0][0]
        out["ingest_rejects"] = con.sql("SELECT count(*) FROM raw.ingest_rejects").fetchall()[0][0]
        out["ingest_log"] = con.sql("SELECT count(*) FROM raw.ingest_log").fetchall()[0][0]
        return out
    finally:
        con.close()


def run(*args: str):
    result = CliRunner().invoke(app, ["ingest", *args])
    return result.exit_code, " ".join(result.output.split())  # rich wraps long lines: compare unwrapped


def demo_lines(table: str) -> list[str]:
    return gzip.open(DEMO / f"{table.upper()}.csv.gz", "rt").read().splitlines()


def cohort(folder: Path, **replace: list[str]) -> Path:
    """A copy of the demo (tables as .csv.gz) with some tables' lines replaced."""
    folder.mkdir(parents=True, exist_ok=True)
    for table in TABLES:
        target = folder / f"{table.upper()}.csv.gz"
        if table in replace:
            with gzip.open(target, "wt") as fh:
                fh.write("\n".join(replace[table]) + "\n")
        else:
            shutil.copy(DEMO / target.name, target)
    return folder


@pytest.fixture(scope="module")
def base_db(tmp_path_factory) -> Path:
    """Two datasets (the demo as `cohort` and as `other`) and MTSamples, ingested by the CLI."""
    folder = tmp_path_factory.mktemp("base")
    db = folder / "w.duckdb"
    for name in ("cohort", "other"):
        assert run("mimic3", "--db", str(db), "--source", str(DEMO), "--dataset", name)[0] == 0
    assert run("mtsamples", "--db", str(db))[0] == 0
    return db


@pytest.fixture
def db(base_db: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "w.duckdb"
    shutil.copy(base_db, copy)
    return copy


BASE = {**{f"{t}[{d}]": n for d in ("cohort", "other") for t, n in DEMO_ROWS.items() if n},
        "mtsamples": 4999, "ingest_rejects": 0, "ingest_log": 13}


def test_base_state(db: Path) -> None:
    assert counts(db) == BASE


# ------------------------------------------------------------------ case 1: one dataset is one unit


def test_failing_last_table_changes_no_table_of_the_dataset(db: Path, tmp_path: Path) -> None:
    # New patients/admissions/diagnoses (10% fewer rows: within the guard), then PRESCRIPTIONS cut in half
    # as bytes (a truncated gzip): before, the first four tables were replaced and prescriptions kept old.
    fewer = {t: demo_lines(t)[: int(len(demo_lines(t)) * 0.9)] for t in ("patients", "admissions", "diagnoses_icd")}
    folder = cohort(tmp_path / "cohort", **fewer)
    rx = (DEMO / "PRESCRIPTIONS.csv.gz").read_bytes()
    (folder / "PRESCRIPTIONS.csv.gz").write_bytes(rx[: len(rx) // 2])
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort")
    assert code == 2
    assert "PRESCRIPTIONS.csv.gz: cannot read the file" in out
    assert counts(db) == BASE  # every table of every dataset as before, nothing logged
    # the same folder with a whole PRESCRIPTIONS goes in as one unit
    shutil.copy(DEMO / "PRESCRIPTIONS.csv.gz", folder)
    assert run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort")[0] == 0
    after = counts(db)
    assert [after[f"{t}[cohort]"] for t in fewer] == [len(fewer[t]) - 1 for t in fewer] == [89, 116, 1584]
    assert after["prescriptions[cohort]"] == 10398
    assert {k: v for k, v in after.items() if "[other]" in k} == {k: v for k, v in BASE.items() if "[other]" in k}
    assert after["ingest_log"] == BASE["ingest_log"] + 6


# ------------------------------------------------------------------ case 2: row-count guards


def test_header_only_file_is_refused_unless_allow_shrink(db: Path, tmp_path: Path) -> None:
    folder = cohort(tmp_path / "cohort", patients=demo_lines("patients")[:1])
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort")
    assert code == 2
    assert (f"{folder}/PATIENTS.csv.gz: raw.patients [cohort] would shrink from 100 to 0 rows (more than 50% "
            "fewer); nothing was changed — pass --allow-shrink") in out
    assert counts(db) == BASE
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort", "--allow-shrink")
    assert code == 0, out
    after = counts(db)
    assert "patients[cohort]" not in after and after["patients[other]"] == 100
    assert after["ingest_log"] == BASE["ingest_log"] + 6


def test_mtsamples_header_only_and_max_shrink(db: Path, tmp_path: Path) -> None:
    lines = gzip.open(MTSAMPLES, "rt", newline="").read().split("\n")
    header_only = tmp_path / "header.csv"
    header_only.write_text(lines[0] + "\n")
    code, out = run("mtsamples", "--db", str(db), "--source", str(header_only))
    assert code == 2 and "header.csv: raw.mtsamples [mtsamples] would shrink from 4,999 to 0 rows" in out
    assert counts(db) == BASE
    # 10% fewer notes: accepted by the default 50% guard, refused by --max-shrink 0.05
    fewer = tmp_path / "fewer.csv"
    notes = gzip.open(MTSAMPLES, "rt", newline="").read()
    fewer.write_text(notes[: notes.index("\n4500,")] + "\n", newline="")
    code, out = run("mtsamples", "--db", str(db), "--source", str(fewer), "--max-shrink", "0.05")
    assert code == 2 and "would shrink from 4,999 to 4,499 rows (more than 5% fewer)" in out
    assert counts(db) == BASE
    assert run("mtsamples", "--db", str(db), "--source", str(fewer))[0] == 0
    assert counts(db) == {**BASE, "mtsamples": 4499, "ingest_log": BASE["ingest_log"] + 1}


def test_mtsamples_cut_mid_quote_is_refused(db: Path, tmp_path: Path) -> None:
    notes = gzip.open(MTSAMPLES, "rt", newline="").read()
    cut = tmp_path / "cut.csv.gz"
    at = notes.index("\n871,")
    at = notes.index(',"', at) + 40  # inside note 871's first quoted field
    with gzip.open(cut, "wt", newline="") as fh:
        fh.write(notes[:at])
    code, out = run("mtsamples", "--db", str(db), "--source", str(cut))
    # issue 34: a cut file is refused for being cut (no line end at its end), before any row-count guard
    assert code == 2 and "cut.csv.gz: the file ends in the middle of line" in out, out
    assert counts(db) == BASE


# ------------------------------------------------------------------ case 3: honest reject accounting


def test_unterminated_quote_swallowing_rows_fails_naming_the_line(db: Path, tmp_path: Path) -> None:
    rx = demo_lines("prescriptions")
    fields = rx[50].split(",")
    fields[8] = '"' + fields[8]  # drug_name_poe opens a quote it never closes
    rx[50] = ",".join(fields)
    folder = cohort(tmp_path / "cohort", prescriptions=rx)
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort", "--allow-shrink")
    assert code == 2
    assert f"{folder}/PRESCRIPTIONS.csv.gz: " in out
    assert "data line(s) are neither a parsed row nor a rejected record" in out
    assert "the rejected record starting on line 51 (byte" in out
    lost = int(out.split(f"{folder}/PRESCRIPTIONS.csv.gz: ")[1].split(" ")[0].replace(",", ""))
    assert lost > 100  # DuckDB reported one reject for all of them
    assert counts(db) == BASE


def test_mtsamples_unterminated_quote_mid_file_fails(db: Path, tmp_path: Path) -> None:
    notes = gzip.open(MTSAMPLES, "rt", newline="").read()
    start = notes.index("\n2000,")
    end = notes.index("\n2001,")
    row = notes[start:end]
    broken = tmp_path / "broken.csv"
    broken.write_text(notes[:start] + row[: row.rindex('"')] + notes[end:], newline="")  # drop a closing quote
    code, out = run("mtsamples", "--db", str(db), "--source", str(broken), "--allow-shrink")
    assert code == 2 and "broken.csv: " in out and "swallowed them" in out
    assert counts(db) == BASE


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_rejects_keep_the_whole_raw_line_and_its_position(db: Path, tmp_path: Path, eol: str) -> None:
    rx = demo_lines("prescriptions")
    fields = rx[10].split(",")
    fields[1] = "not-a-number"  # subject_id: a cast error, one reject, one physical line
    fields[7] = "x" * 20_000  # longer than DuckDB's 10,000-character csv_line
    rx[10] = ",".join(fields)
    folder = cohort(tmp_path / "cohort")
    with gzip.open(folder / "PRESCRIPTIONS.csv.gz", "wt", newline="") as fh:
        fh.write(eol.join(rx) + eol)
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort")
    assert code == 0, out
    with connect(db, read_only=True) as con:
        got = con.sql("SELECT table_name, line, physical_line, record_byte_position, length(raw_line), raw_line"
                      " FROM raw.ingest_rejects").fetchall()
    offset = len(eol.join(rx[:10]).encode()) + len(eol)
    assert [g[:5] for g in got] == [("prescriptions", 11, 11, offset, len(rx[10]))]
    assert got[0][5] == rx[10]
    assert counts(db) == {**BASE, "prescriptions[cohort]": 10397, "ingest_rejects": 1,
                          "ingest_log": BASE["ingest_log"] + 6}
