"""Prescriptions -> ATC-3 (`core.prescriptions_atc3`) and what the mapping lost (`core.mapping_coverage`).

Each prescription row is mapped by the first route that knows it:
1. its NDC through `ref.ndc_atc3` (NDC->RxCUI->ATC, else direct NDC->ATC; see 0003_ref_core.sql),
2. for rows whose NDC is in neither map: its drug name against WHO ATC level-5 names (`ref.drug_name_atc3`),
   trying the full normalised generic name, the full drug name, then the first word of each.
Rows without an NDC are not name-mapped: PyHealth's drug codes are NDCs, so a row without one is not a drug
code there either (IV fluids and flushes, mostly). They are counted as `no_ndc` in the coverage table.
A mapped row keeps every ATC-3 of its route (combination products), one output row each.
"""

from __future__ import annotations

import logging

import duckdb

from medtx.codes.ndc import drug_name_key_sql, ndc_sql
from medtx.db import transaction

log = logging.getLogger("medtx.codes")

ATC3_PATTERN = "^[A-Z][0-9]{2}[A-Z]$"


def _rx_sql(dataset_param: str = "$dataset") -> str:
    """Prescription rows of one dataset with normalised NDC and a row key."""
    # A row missing its subject_id takes it from its admission; rows that still lack one are unusable.
    return f"""
        WITH adm AS (
            SELECT hadm_id, any_value(subject_id) AS adm_subject FROM raw.admissions
            WHERE dataset = {dataset_param} GROUP BY hadm_id
        )
        SELECT row_number() OVER () AS rx_key, coalesce(p.subject_id, adm.adm_subject) AS subject_id, p.hadm_id,
               startdate, drug, drug_name_generic, {ndc_sql('ndc')} AS ndc
        FROM raw.prescriptions p LEFT JOIN adm USING (hadm_id)
        WHERE p.dataset = {dataset_param} AND p.hadm_id IS NOT NULL
          AND coalesce(p.subject_id, adm.adm_subject) IS NOT NULL"""


_NAME_MATCH_SQL = f"""
    WITH names AS (
        SELECT DISTINCT drug_name_generic, drug,
               {drug_name_key_sql('drug_name_generic')} AS k1, {drug_name_key_sql('drug')} AS k2
        FROM _map_rx_unmapped
    ), cand AS (
        SELECT drug_name_generic, drug, key, prio FROM names,
            (VALUES (1), (2), (3), (4)) p(prio),
            LATERAL (SELECT CASE prio WHEN 1 THEN k1 WHEN 2 THEN k2
                                      WHEN 3 THEN split_part(k1, ' ', 1) ELSE split_part(k2, ' ', 1) END AS key)
    ), best AS (
        SELECT c.drug_name_generic, c.drug, arg_min(c.key, c.prio) AS key
        FROM cand c WHERE c.key IN (SELECT drug_name FROM ref.drug_name_atc3)
        GROUP BY ALL
    )
    SELECT b.drug_name_generic, b.drug, r.atc3 FROM best b JOIN ref.drug_name_atc3 r ON r.drug_name = b.key"""


def map_prescriptions(con: duckdb.DuckDBPyConnection, dataset: str) -> int:
    """Rewrite `core.prescriptions_atc3` and `core.mapping_coverage` for one dataset; returns mapped rows."""
    params = {"dataset": dataset}
    con.execute(f"CREATE OR REPLACE TEMP TABLE _map_rx AS {_rx_sql()}", params)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _map_rx_by_ndc AS
        SELECT rx.rx_key, m.atc3, m.route FROM _map_rx rx JOIN ref.ndc_atc3 m USING (ndc)""")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _map_rx_unmapped AS
        SELECT * FROM _map_rx rx WHERE ndc IS NOT NULL AND rx_key NOT IN (SELECT rx_key FROM _map_rx_by_ndc)""")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _map_name_atc3 AS {_NAME_MATCH_SQL}")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _map_rx_atc3 AS
        SELECT rx_key, atc3, route FROM _map_rx_by_ndc
        UNION ALL
        SELECT u.rx_key, n.atc3, 'name' FROM _map_rx_unmapped u JOIN _map_name_atc3 n
            ON n.drug_name_generic IS NOT DISTINCT FROM u.drug_name_generic AND n.drug IS NOT DISTINCT FROM u.drug""")
    with transaction(con):
        con.execute("DELETE FROM core.prescriptions_atc3 WHERE dataset = $dataset", params)
        con.execute("""
            INSERT INTO core.prescriptions_atc3
            SELECT $dataset, rx.subject_id, rx.hadm_id, rx.startdate, rx.ndc, rx.drug, m.atc3, m.route
            FROM _map_rx rx JOIN _map_rx_atc3 m USING (rx_key)""", params)
        con.execute("DELETE FROM core.mapping_coverage WHERE dataset = $dataset", params)
        con.execute(_COVERAGE_SQL, params)
    mapped = con.execute(
        "SELECT count(*) FROM core.prescriptions_atc3 WHERE dataset = $dataset", params
    ).fetchall()[0][0]
    for table in ("_map_rx", "_map_rx_by_ndc", "_map_rx_unmapped", "_map_name_atc3", "_map_rx_atc3"):
        con.execute(f"DROP TABLE IF EXISTS {table}")
    return mapped


_COVERAGE_SQL = """
    INSERT INTO core.mapping_coverage
    WITH row_route AS (   -- one route per prescription row (rxcui and ndc never mix for one NDC)
        SELECT rx.rx_key, rx.ndc, rx.drug, coalesce(any_value(m.route), 'unmapped') AS route
        FROM _map_rx rx LEFT JOIN _map_rx_atc3 m USING (rx_key) GROUP BY rx.rx_key, rx.ndc, rx.drug
    ), with_ndc AS (SELECT * FROM row_route WHERE ndc IS NOT NULL),
    total AS (SELECT greatest(count(*), 1) AS n FROM with_ndc),
    by_route AS (
        SELECT route, count(DISTINCT ndc) AS n_ndc, count(*) AS n_rows FROM with_ndc GROUP BY route
        UNION ALL
        SELECT 'mapped', count(DISTINCT ndc), count(*) FROM with_ndc WHERE route <> 'unmapped'
    ), unmapped AS (
        SELECT ndc, count(*) AS n_rows,
               string_agg(DISTINCT drug, ' | ' ORDER BY drug) AS drug
        FROM with_ndc WHERE route = 'unmapped' GROUP BY ndc
    )
    SELECT $dataset, 'route', route, NULL, NULL, n_ndc, n_rows, n_rows / (SELECT n FROM total), NULL FROM by_route
    UNION ALL
    SELECT $dataset, 'route', 'no_ndc', NULL, NULL, 0, count(*) FILTER (WHERE ndc IS NULL),
           count(*) FILTER (WHERE ndc IS NULL) / greatest(count(*), 1), NULL FROM row_route
    UNION ALL
    SELECT $dataset, 'unmapped_ndc', 'unmapped', ndc, drug, 1, n_rows, n_rows / (SELECT n FROM total),
           row_number() OVER (ORDER BY n_rows DESC, ndc) FROM unmapped"""


def coverage_summary(con: duckdb.DuckDBPyConnection, dataset: str) -> dict[str, tuple[int, int, float]]:
    """route -> (distinct NDCs, rows, share of rows carrying an NDC), from `core.mapping_coverage`."""
    rows = con.execute(
        "SELECT route, n_ndc, n_rows, pct_rows FROM core.mapping_coverage WHERE dataset = $dataset AND kind = 'route'",
        {"dataset": dataset},
    ).fetchall()
    return {route: (n_ndc, n_rows, pct) for route, n_ndc, n_rows, pct in rows}
