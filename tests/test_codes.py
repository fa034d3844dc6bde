"""NDC normalisation, reference tables and prescriptions -> ATC-3 mapping with its coverage report."""

from __future__ import annotations

import re

import duckdb
import pytest

from medtx.codes import map_codes
from medtx.codes.mapping import ATC3_PATTERN, adm_route_class, adm_route_sql
from medtx.codes.ndc import ndc_sql, normalize_ndc
from medtx.store.db import connect
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


ROUTE_CASES = {"IV": "P", "iv drip ": "P", "IVPCA": "P", "SC": "P", "PO": "O", "PO/NG": "O", "G TUBE": "O",
               "NG": "O", "IH": "Inhal", "NEB": "Inhal", "PR": "R", "TD": "TD", "SL": "SL", "NU": "N", "VG": "V",
               "TP": None, "OU": None, "BOTH EYES": None, "DIALYS": None, None: None}


def test_adm_route_class_sql_agrees_with_python():
    assert {r: adm_route_class(r) for r in ROUTE_CASES} == ROUTE_CASES
    con = duckdb.connect()
    con.execute("CREATE TABLE t (v VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?)", [[v] for v in ROUTE_CASES])
    assert dict(con.sql(f"SELECT v, {adm_route_sql('v')} FROM t").fetchall()) == ROUTE_CASES


def test_one_atc3_per_prescription_by_documented_rules(tmp_db):
    """Each rule decides at least once, on real NDCs whose candidates come from the bundled maps."""
    con = connect(tmp_db)
    insert_rows(con, "admissions", [{"dataset": "r", "subject_id": 1, "hadm_id": 10}])
    rows = [  # (ndc, route, drug) -> expected (atc3, choice, n_candidates)
        (("00338355248", "IV", "Vancomycin"), ("J01X", "adm_r", 3)),       # J01X parenteral, A07A oral, S01A eye
        (("00338355248", "PO", "Vancomycin"), ("A07A", "adm_r", 3)),
        (("00338011704", "IV", "LR"), ("B05X", "support", 6)),             # B05X backed by 4 ATC-5 codes
        (("00338004903", "IV", "0.9% Sodium Chloride"), ("A12C", "alphabetical", 3)),  # A12C/B05C/B05X, 1 each
        (("00517570425", "IV", "Furosemide"), ("C03C", "only", 1)),
    ]
    insert_rows(con, "prescriptions", [{"dataset": "r", "subject_id": 1, "hadm_id": 10, "ndc": n, "route": r,
                                        "drug": d} for (n, r, d), _ in rows])
    map_codes(con, DATA, ["r"])
    got = con.sql("SELECT ndc, drug, atc3, choice, n_candidates, route FROM core.prescriptions_atc3").fetchall()
    assert len(got) == len(rows)  # one row per prescription row
    assert sorted((g[0], g[2], g[3], g[4]) for g in got) == sorted((n, *e) for (n, _, _), e in rows)
    # the alternatives stay visible: every candidate of the NDC is listed, the chosen one among them
    candidates = [a for (a,) in con.sql("SELECT atc3 FROM ref.ndc_atc3 WHERE ndc = '00338355248' ORDER BY 1")
                  .fetchall()]
    assert candidates == ["A07A", "J01X", "S01A"]


def test_demo_one_row_per_mapped_prescription(demo_db):
    con = connect(demo_db, read_only=True)
    mapped = con.execute("SELECT n_rows FROM core.mapping_coverage WHERE dataset = ? AND kind = 'route' "
                         "AND route = 'mapped'", [DEMO]).fetchall()[0][0]
    n, bad_choice, not_candidate = con.execute("""
        SELECT count(*),
               count(*) FILTER (WHERE n_candidates < 1 OR (choice = 'only') <> (n_candidates = 1)
                                OR choice NOT IN ('only', 'adm_r', 'support', 'alphabetical')),
               count(*) FILTER (WHERE route <> 'name' AND (ndc, atc3) NOT IN (SELECT (ndc, atc3) FROM ref.ndc_atc3))
        FROM core.prescriptions_atc3 WHERE dataset = ?""", [DEMO]).fetchall()[0]
    assert n == mapped and bad_choice == 0 and not_candidate == 0
    # most demo rows come from NDCs with several candidate classes: the rules matter
    ambiguous = con.execute("SELECT avg((n_candidates > 1)::INT) FROM core.prescriptions_atc3 WHERE dataset = ?",
                            [DEMO]).fetchall()[0][0]
    assert 0.3 < ambiguous < 0.7
