"""Reference tables (`ref.*`) from the bundled dictionaries and mapping files in data/.

Everything is read with DuckDB `read_csv` (codes as VARCHAR, `NA` = null) and rewritten in one transaction,
so a reload is idempotent and a failure leaves the previous tables in place.
"""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb

from medtx.codes.ndc import drug_name_key_sql, ndc_sql
from medtx.store.db import quote_table, sql_literal, transaction

log = logging.getLogger("medtx.codes")

# Names shared by more than this many ATC-3 classes ("combinations", "various") say nothing about the drug.
MAX_ATC3_PER_NAME = 3

REF_TABLES = (
    "icd9_diagnoses", "icd9_procedures", "atc", "ndc_rxcui", "rxcui_atc", "ndc_atc",
    "ndc_atc3", "drug_name_atc3", "ddi_atc3",
)
WRITES = tuple(f"ref.{t}" for t in REF_TABLES)  # lineage: the reference step writes these, reads only files


def reference_files(data_dir: Path) -> dict[str, Path]:
    """Where each bundled reference file lives under `data_dir`."""
    maps = data_dir / "drug_mappings"
    return {
        "icd9_diagnoses": data_dir / "mimic3_demo" / "D_ICD_DIAGNOSES.csv.gz",
        "icd9_procedures": data_dir / "mimic3_demo" / "D_ICD_PROCEDURES.csv.gz",
        "atc": data_dir / "atc" / "WHO_ATC-DDD_2026-04-25.csv.gz",
        "ndc_rxcui": maps / "gamenet" / "ndc2rxcui.csv.gz",
        "rxcui_atc": maps / "fabkury_ndc_map" / "derived_rxcui_to_atc.csv.gz",
        "ndc_atc": maps / "fabkury_ndc_map" / "derived_ndc11_to_atc.csv.gz",
        "cid_atc": maps / "gamenet" / "drug-atc.long.csv",
        "ddi_cid": maps / "pyhealth_examples" / "drug-DDI-TOP40.csv",
    }


def _csv_sql(path: Path) -> str:
    """A `read_csv` call that keeps every code as text."""
    return f"read_csv({sql_literal(path.as_posix())}, all_varchar = true, header = true, nullstr = 'NA')"


def who_adm_r_sql(column: str) -> str:
    """WHO DDD administration route (`adm_r`) -> its class: O, P, R, N, SL, TD, V or Inhal (else NULL).

    The inhalation variants (`Inhal.powder`, `Inhal.aerosol`, ...) are one class; implants are parenteral.
    The rare free-text routes (ointment, urethral, chewing gum, ...) get no class: they never decide a choice."""
    return f"""(CASE
        WHEN {column} ILIKE 'inhal%' THEN 'Inhal'
        WHEN {column} ILIKE '%implant%' THEN 'P'
        WHEN {column} IN ('O', 'P', 'R', 'N', 'SL', 'TD', 'V') THEN {column}
    END)"""


def _routes_agg_sql(column_sql: str) -> str:
    """Aggregate: the sorted union of the route lists in `column_sql` (NULL when none is known)."""
    return f"list_sort(list_distinct(flatten(list({column_sql}) FILTER (WHERE {column_sql} IS NOT NULL))))"


def _reference_sql(files: dict[str, Path]) -> dict[str, str]:
    """SELECT statement per ref table (column names as in the table), in dependency order."""
    atc3_ok_sql = "regexp_full_match(atc3, '[A-Z][0-9]{2}[A-Z]')"
    return {
        "icd9_diagnoses": f"SELECT trim(icd9_code) AS icd9_code, any_value(short_title) AS short_title, "
        f"any_value(long_title) AS long_title "
        f"FROM {_csv_sql(files['icd9_diagnoses'])} WHERE icd9_code IS NOT NULL GROUP BY 1",
        "icd9_procedures": f"SELECT trim(icd9_code) AS icd9_code, any_value(short_title) AS short_title, "
        f"any_value(long_title) AS long_title "
        f"FROM {_csv_sql(files['icd9_procedures'])} WHERE icd9_code IS NOT NULL GROUP BY 1",
        # WHO lists level-5 codes once per DDD/route: keep one name per code and the set of its routes.
        "atc": f"SELECT atc_code, min(atc_name) AS atc_name, CASE length(atc_code) WHEN 1 THEN 1 WHEN 3 THEN 2 "
        f"WHEN 4 THEN 3 WHEN 5 THEN 4 WHEN 7 THEN 5 END AS level, "
        f"list_sort(list(DISTINCT adm_class) FILTER (WHERE adm_class IS NOT NULL)) AS adm_r "
        f"FROM (SELECT *, {who_adm_r_sql('adm_r')} AS adm_class FROM {_csv_sql(files['atc'])}) "
        f"WHERE length(atc_code) IN (1, 3, 4, 5, 7) AND atc_name IS NOT NULL GROUP BY atc_code",
        # The GAMENet dict has a stray 'idx' key and 20 empty RxCUIs.
        "ndc_rxcui": f"SELECT DISTINCT {ndc_sql('ndc')} AS ndc, trim(rxcui) AS rxcui "
        f"FROM {_csv_sql(files['ndc_rxcui'])} "
        f"WHERE regexp_full_match(trim(ndc), '\\d{{11}}') AND nullif(trim(rxcui), '') IS NOT NULL",
        "rxcui_atc": f"SELECT DISTINCT trim(rxcui) AS rxcui, atc3, atc4, nullif(atc5, '') AS atc5 "
        f"FROM {_csv_sql(files['rxcui_atc'])} WHERE {atc3_ok_sql}",
        # Already normalised to 11 digits by its derivation (SOURCES.md): check, do not recompute.
        "ndc_atc": f"SELECT DISTINCT ndc11 AS ndc, atc3, atc4, nullif(atc5, '') AS atc5 "
        f"FROM {_csv_sql(files['ndc_atc'])} "
        f"WHERE {atc3_ok_sql} AND regexp_full_match(ndc11, '\\d{{11}}') AND ndc11 <> '00000000000'",
        # Route precedence: NDC->RxCUI->ATC first; the direct NDC->ATC map only for NDCs it leaves unmapped.
        # Every ATC-3 of the winning route is a candidate; support and WHO routes let the mapping pick one.
        "ndc_atc3": f"""
            WITH who AS (SELECT atc_code, adm_r FROM ref.atc WHERE level = 5),
            by_rxcui AS (
                SELECT n.ndc, r.atc3, 'rxcui' AS route, count(DISTINCT coalesce(r.atc5, r.atc4)) AS support,
                       {_routes_agg_sql('w.adm_r')} AS adm_r
                FROM ref.ndc_rxcui n JOIN ref.rxcui_atc r USING (rxcui) LEFT JOIN who w ON w.atc_code = r.atc5
                GROUP BY n.ndc, r.atc3
            ), by_ndc AS (
                SELECT a.ndc, a.atc3, 'ndc' AS route, count(DISTINCT coalesce(a.atc5, a.atc4)) AS support,
                       {_routes_agg_sql('w.adm_r')} AS adm_r
                FROM ref.ndc_atc a LEFT JOIN who w ON w.atc_code = a.atc5
                WHERE a.ndc NOT IN (SELECT ndc FROM by_rxcui)
                GROUP BY a.ndc, a.atc3
            )
            SELECT * FROM by_rxcui UNION ALL SELECT * FROM by_ndc""",
        "drug_name_atc3": f"""
            WITH names AS (
                SELECT {drug_name_key_sql('atc_name')} AS drug_name, left(atc_code, 4) AS atc3,
                       count(DISTINCT atc_code) AS support, {_routes_agg_sql('adm_r')} AS adm_r
                FROM ref.atc WHERE level = 5 GROUP BY ALL
            )
            SELECT drug_name, atc3, support, adm_r FROM names
            WHERE drug_name IS NOT NULL
              AND drug_name IN (SELECT drug_name FROM names GROUP BY 1 HAVING count(*) <= {MAX_ATC3_PER_NAME})""",
        "ddi_atc3": f"""
            WITH cid AS (
                SELECT DISTINCT trim(stitch_cid) AS cid, left(trim(atc5), 4) AS atc3 FROM {_csv_sql(files['cid_atc'])}
                WHERE regexp_full_match(left(trim(atc5), 4), '[A-Z][0-9]{{2}}[A-Z]')
            ), pairs AS (
                SELECT a.atc3 AS x, b.atc3 AS y
                FROM {_csv_sql(files['ddi_cid'])} p
                JOIN cid a ON a.cid = trim(p."STITCH 1") JOIN cid b ON b.cid = trim(p."STITCH 2")
            )
            SELECT DISTINCT least(x, y) AS atc3_a, greatest(x, y) AS atc3_b FROM pairs WHERE x <> y""",
    }


def load_reference_tables(con: duckdb.DuckDBPyConnection, data_dir: Path) -> dict[str, int]:
    """(Re)build every `ref.*` table from `data_dir`; returns row counts per table."""
    files = reference_files(data_dir)
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"reference files missing: {', '.join(missing)}")
    with transaction(con):
        for table, select_sql in _reference_sql(files).items():
            con.execute(f"DELETE FROM {quote_table('ref.' + table)}")
            con.execute(f"INSERT INTO {quote_table('ref.' + table)} BY NAME {select_sql}")
    counts = {t: con.sql(f"SELECT count(*) FROM {quote_table('ref.' + t)}").fetchall()[0][0] for t in REF_TABLES}
    log.info("reference tables loaded: %s", counts)
    return counts


def reference_loaded(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the drug mapping tables hold data (they are the ones map_codes needs)."""
    return con.sql("SELECT count(*) FROM ref.ndc_atc3").fetchall()[0][0] > 0
