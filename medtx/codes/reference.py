"""Reference tables (`ref.*`) from the bundled dictionaries and mapping files in data/.

Everything is read with DuckDB `read_csv` (codes as VARCHAR, `NA` = null) and rewritten in one transaction,
so a reload is idempotent and a failure leaves the previous tables in place.
"""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb

from medtx.codes.ndc import drug_name_key_sql, ndc_sql
from medtx.db import transaction

log = logging.getLogger("medtx.codes")

# Names shared by more than this many ATC-3 classes ("combinations", "various") say nothing about the drug.
MAX_ATC3_PER_NAME = 3

REF_TABLES = (
    "icd9_diagnoses", "icd9_procedures", "atc", "ndc_rxcui", "rxcui_atc", "ndc_atc",
    "ndc_atc3", "drug_name_atc3", "ddi_atc3",
)


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


def _csv(path: Path) -> str:
    """A `read_csv` call that keeps every code as text."""
    return f"read_csv('{path.as_posix()}', all_varchar = true, header = true, nullstr = 'NA')"


def _reference_sql(files: dict[str, Path]) -> dict[str, str]:
    """SELECT statement per ref table, in dependency order."""
    atc3_ok = "regexp_full_match(atc3, '[A-Z][0-9]{2}[A-Z]')"
    return {
        "icd9_diagnoses": f"SELECT trim(icd9_code), any_value(short_title), any_value(long_title) "
        f"FROM {_csv(files['icd9_diagnoses'])} WHERE icd9_code IS NOT NULL GROUP BY 1",
        "icd9_procedures": f"SELECT trim(icd9_code), any_value(short_title), any_value(long_title) "
        f"FROM {_csv(files['icd9_procedures'])} WHERE icd9_code IS NOT NULL GROUP BY 1",
        # WHO lists level-5 codes once per DDD/route: keep one name per code.
        "atc": f"SELECT atc_code, min(atc_name), CASE length(atc_code) WHEN 1 THEN 1 WHEN 3 THEN 2 WHEN 4 THEN 3 "
        f"WHEN 5 THEN 4 WHEN 7 THEN 5 END FROM {_csv(files['atc'])} "
        f"WHERE length(atc_code) IN (1, 3, 4, 5, 7) AND atc_name IS NOT NULL GROUP BY atc_code",
        # The GAMENet dict has a stray 'idx' key and 20 empty RxCUIs.
        "ndc_rxcui": f"SELECT DISTINCT {ndc_sql('ndc')} AS ndc, trim(rxcui) FROM {_csv(files['ndc_rxcui'])} "
        f"WHERE regexp_full_match(trim(ndc), '\\d{{11}}') AND nullif(trim(rxcui), '') IS NOT NULL",
        "rxcui_atc": f"SELECT DISTINCT trim(rxcui), atc3, atc4, nullif(atc5, '') FROM {_csv(files['rxcui_atc'])} "
        f"WHERE {atc3_ok}",
        # Already normalised to 11 digits by its derivation (SOURCES.md): check, do not recompute.
        "ndc_atc": f"SELECT DISTINCT ndc11, atc3, atc4, nullif(atc5, '') FROM {_csv(files['ndc_atc'])} "
        f"WHERE {atc3_ok} AND regexp_full_match(ndc11, '\\d{{11}}') AND ndc11 <> '00000000000'",
        # Route precedence: NDC->RxCUI->ATC first; the direct NDC->ATC map only for NDCs it leaves unmapped.
        "ndc_atc3": """
            WITH by_rxcui AS (
                SELECT DISTINCT n.ndc, r.atc3, 'rxcui' AS route
                FROM ref.ndc_rxcui n JOIN ref.rxcui_atc r USING (rxcui)
            ), by_ndc AS (
                SELECT DISTINCT ndc, atc3, 'ndc' AS route FROM ref.ndc_atc
                WHERE ndc NOT IN (SELECT ndc FROM by_rxcui)
            )
            SELECT * FROM by_rxcui UNION ALL SELECT * FROM by_ndc""",
        "drug_name_atc3": f"""
            WITH names AS (
                SELECT DISTINCT {drug_name_key_sql('atc_name')} AS drug_name, left(atc_code, 4) AS atc3
                FROM ref.atc WHERE level = 5
            )
            SELECT drug_name, atc3 FROM names
            WHERE drug_name IS NOT NULL
              AND drug_name IN (SELECT drug_name FROM names GROUP BY 1 HAVING count(*) <= {MAX_ATC3_PER_NAME})""",
        "ddi_atc3": f"""
            WITH cid AS (
                SELECT DISTINCT trim(stitch_cid) AS cid, left(trim(atc5), 4) AS atc3 FROM {_csv(files['cid_atc'])}
                WHERE regexp_full_match(left(trim(atc5), 4), '[A-Z][0-9]{{2}}[A-Z]')
            ), pairs AS (
                SELECT a.atc3 AS x, b.atc3 AS y
                FROM {_csv(files['ddi_cid'])} p
                JOIN cid a ON a.cid = trim(p."STITCH 1") JOIN cid b ON b.cid = trim(p."STITCH 2")
            )
            SELECT DISTINCT least(x, y), greatest(x, y) FROM pairs WHERE x <> y""",
    }


def load_reference_tables(con: duckdb.DuckDBPyConnection, data_dir: Path) -> dict[str, int]:
    """(Re)build every `ref.*` table from `data_dir`; returns row counts per table."""
    files = reference_files(data_dir)
    missing = [str(p) for p in files.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"reference files missing: {', '.join(missing)}")
    with transaction(con):
        for table, select in _reference_sql(files).items():
            con.execute(f"DELETE FROM ref.{table}")
            con.execute(f"INSERT INTO ref.{table} {select}")
    counts = {t: con.sql(f"SELECT count(*) FROM ref.{t}").fetchall()[0][0] for t in REF_TABLES}
    log.info("reference tables loaded: %s", counts)
    return counts


def reference_loaded(con: duckdb.DuckDBPyConnection) -> bool:
    """True when the drug mapping tables hold data (they are the ones map_codes needs)."""
    return con.sql("SELECT count(*) FROM ref.ndc_atc3").fetchall()[0][0] > 0
