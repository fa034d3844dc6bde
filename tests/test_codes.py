"""NDC normalisation, reference tables and prescriptions -> ATC-3 mapping with its coverage report."""

from __future__ import annotations

import re

import duckdb
import pytest

from medtx.codes import map_codes
from medtx.codes.mapping import ATC3_PATTERN
from medtx.codes.ndc import ndc_sql, normalize_ndc
from medtx.db import connect
from tests.conftest import DATA
from tests.fixtures_samples import DEMO, demo_db, insert_rows  # noqa: F401 (fixtures)

NDC_CASES = {
    "00006494300": "00006494300", "0": None, "": None, None: None, "  ": None, "0-0-0": None,
    "1234-5678-90": "01234567890", "12345-678-90": "12345067890", "12345-6789-0": "12345678900",
    "6494300": "00006494300", "6494300.0": "00006494300", "abc": "abc", "123456789012": "123456789012",
}


@pytest.mark.parametrize(("raw", "expected"), NDC_CASES.items())
def test_normalize_ndc(raw, expected):
    assert normalize_ndc(raw) == expected


def test_ndc_sql_agrees_with_python():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (v VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?)", [[v] for v in NDC_CASES])
    for raw, sql_value in con.sql(f"SELECT v, {ndc_sql('v')} FROM t").fetchall():
        assert sql_value == normalize_ndc(raw), raw


def test_reference_tables(demo_db):
    con = connect(demo_db, read_only=True)
    counts = {t: con.sql(f"SELECT count(*) FROM ref.{t}").fetchall()[0][0]
              for t in ("icd9_diagnoses", "icd9_procedures", "atc", "ndc_atc3", "drug_name_atc3", "ddi_atc3")}
    assert counts["icd9_diagnoses"] == 14567 and counts["icd9_procedures"] == 3882
    assert all(n > 0 for n in counts.values()), counts
    levels = dict(con.sql("SELECT level, count(*) FROM ref.atc GROUP BY 1").fetchall())
    assert set(levels) == {1, 2, 3, 4, 5} and levels[1] == 14
    assert con.sql("SELECT count(*) FROM ref.ddi_atc3 WHERE NOT regexp_full_match(atc3_a, '[A-Z][0-9]{2}[A-Z]') "
                   "OR atc3_a >= atc3_b").fetchall()[0][0] == 0
    # precedence: an NDC never keeps both routes
    assert con.sql("SELECT count(*) FROM (SELECT ndc FROM ref.ndc_atc3 GROUP BY ndc "
                   "HAVING count(DISTINCT route) > 1)").fetchall()[0][0] == 0


def test_demo_coverage_reaches_80_percent(demo_db):
    con = connect(demo_db, read_only=True)
    routes = {r: (n_ndc, n, pct) for r, n_ndc, n, pct in con.execute(
        "SELECT route, n_ndc, n_rows, pct_rows FROM core.mapping_coverage WHERE dataset = ? AND kind = 'route'",
        [DEMO]).fetchall()}
    assert routes["mapped"][2] >= 0.80
    # the demo has 8,920 rows with a real NDC and 1,478 without (SOURCES.md)
    assert routes["mapped"][1] + routes["unmapped"][1] == 8920
    assert routes["no_ndc"][1] == 1478
    assert sum(routes[r][1] for r in ("rxcui", "ndc", "name")) == routes["mapped"][1]
    assert routes["rxcui"][1] == 7222  # NDC->RxCUI->ATC alone, as measured in SOURCES.md
    ranked = con.execute("SELECT rank, n_rows, drug FROM core.mapping_coverage WHERE dataset = ? "
                         "AND kind = 'unmapped_ndc' ORDER BY rank", [DEMO]).fetchall()
    assert [r[0] for r in ranked] == list(range(1, len(ranked) + 1))
    assert [r[1] for r in ranked] == sorted((r[1] for r in ranked), reverse=True)
    assert sum(r[1] for r in ranked) == routes["unmapped"][1] and all(r[2] for r in ranked)


def test_mapped_rows_are_atc3_and_traceable(demo_db):
    con = connect(demo_db, read_only=True)
    bad = con.sql("SELECT atc3 FROM core.prescriptions_atc3").fetchall()
    assert bad and all(re.match(ATC3_PATTERN, a) for (a,) in bad)
    orphan = con.sql("""SELECT count(*) FROM core.prescriptions_atc3 m LEFT JOIN raw.admissions a
                        ON a.dataset = m.dataset AND a.hadm_id = m.hadm_id WHERE a.hadm_id IS NULL""").fetchall()[0][0]
    assert orphan == 0


def test_unknown_and_malformed_ndcs_are_kept_and_counted(tmp_db):
    con = connect(tmp_db)
    insert_rows(con, "admissions", [{"dataset": "x", "subject_id": 1, "hadm_id": 10}])
    insert_rows(con, "prescriptions", [
        {"dataset": "x", "subject_id": 1, "hadm_id": 10, "ndc": "99999999999", "drug": "Mystery"},
        {"dataset": "x", "subject_id": 1, "hadm_id": 10, "ndc": "99999999999", "drug": "Mystery"},
        {"dataset": "x", "subject_id": 1, "hadm_id": 10, "ndc": "not-an-ndc", "drug": "Odd"},
        {"dataset": "x", "subject_id": 1, "hadm_id": 10, "ndc": "0", "drug": "Flush"},
        {"dataset": "x", "subject_id": 1, "hadm_id": 10, "ndc": "517-5704-25", "drug": "Furosemide"},
        {"dataset": "x", "subject_id": 1, "hadm_id": 10, "ndc": "12345678901", "drug": "Furosemide"},
    ])
    coverage = map_codes(con, DATA, ["x"])["x"]
    assert coverage["no_ndc"][1] == 1
    assert coverage["unmapped"][:2] == (2, 3)
    assert coverage["rxcui"][1] == 1  # the hyphenated furosemide NDC, normalised to 00517570425
    assert coverage["name"][1] == 1  # an unknown NDC rescued by its drug name
    unmapped = con.sql("SELECT ndc, n_rows FROM core.mapping_coverage WHERE kind = 'unmapped_ndc' ORDER BY rank"
                       ).fetchall()
    assert unmapped == [("99999999999", 2), ("not-an-ndc", 1)]
    # idempotent: a second run gives the same rows
    before = con.sql("SELECT count(*) FROM core.prescriptions_atc3").fetchall()
    map_codes(con, DATA, ["x"], reload_reference=False)
    assert con.sql("SELECT count(*) FROM core.prescriptions_atc3").fetchall() == before
