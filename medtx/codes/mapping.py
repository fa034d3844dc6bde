"""Prescriptions -> ONE ATC-3 each (`core.prescriptions_atc3`) and what the mapping lost (`core.mapping_coverage`).

Candidates. Each prescription row is looked up by the first route that knows it:
1. its NDC through `ref.ndc_atc3` (NDC->RxCUI->ATC, else direct NDC->ATC; see 0003_ref_core.sql),
2. for rows whose NDC is in neither map: its drug name against WHO ATC level-5 names (`ref.drug_name_atc3`),
   trying the full normalised generic name, the full drug name, then the first word of each.
Rows without an NDC are not name-mapped: PyHealth's drug codes are NDCs, so a row without one is not a drug
code there either (IV fluids and flushes, mostly). They are counted as `no_ndc` in the coverage table. Except in
a dataset that codes medications by name (a MEDS import whose rule says `field: name`, e.g. MIMIC-IV MEDS,
`coded_by_name`): its rows without an NDC take the name route too, counted as `name_no_ndc` when mapped.

Choice. Kury's map is ingredient-level, so one NDC often has several ATC-3 candidates (lidocaine: 7, saline: 3).
Like GAMENet/SafeDrug, medtx keeps ONE class per drug: among the candidates of the winning route it takes
1. `adm_r`: the one whose WHO ATC-5 administration routes include the prescription's route class (IV -> P,
   PO -> O, ...; see ADM_ROUTE_CLASSES), so IV vancomycin is J01X and oral vancomycin A07A. Only a match
   counts: WHO assigns DDDs to few routes per substance, so a missing route is no evidence against a class
   (IV calcium gluconate is A12A although WHO gives A12AA03 an oral DDD only);
2. `support`: else the one backed by the most distinct ATC-5 codes (ingredient rows) of that NDC or name;
3. `alphabetical`: else the alphabetically first ATC-3.
So the ATC-3 is a function of (NDC or drug name, route class). Each output row records `n_candidates` and which
rule decided (`only` when there was one candidate); every candidate stays listed in `ref.ndc_atc3`.

Speed: the rules run on the distinct (ndc, drug, generic name, route) keys of the dataset (hundreds to tens of
thousands), not on its millions of rows; the rows are joined to their key's choice once, and the coverage
report is summed from the keys' row counts.
"""

from __future__ import annotations

import logging

import duckdb

from medtx.codes.ndc import drug_name_key_sql, ndc_sql
from medtx.store.db import quote_ident, transaction

log = logging.getLogger("medtx.codes")

ATC3_PATTERN = "^[A-Z][0-9]{2}[A-Z]$"

# MIMIC PRESCRIPTIONS.route (upper-cased, trimmed) -> WHO adm_r class: exact values, then prefixes.
# Eye/ear/skin routes have no WHO DDD route, so they never decide (they fall through to support).
ADM_ROUTE_CLASSES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Inhal": (("IH", "NEB", "INH"), ("INHAL", "NEB")),
    "O": (("PO", "ORAL", "NG", "OG", "NJ", "GT", "JT", "PEG", "PO/NG", "PO/OG", "NG/OG", "PO/PEG"),
          ("PO ", "ORAL", "ENTERAL", "G TUBE", "J TUBE", "NG ", "PO/")),
    "P": (("SC", "SQ", "SUBCUT", "IM", "ID", "IT", "IO", "EPIDURAL", "INTRAVENOUS", "INTRAMUSCULAR",
           "SUBCUTANEOUS"), ("IV", "SUBCUT")),
    "R": (("PR", "RECTAL"), ()),
    "N": (("NU", "NAS", "NASAL"), ()),
    "SL": (("SL", "BUCCAL"), ()),
    "TD": (("TD", "TRANSDERMAL"), ()),
    "V": (("VG", "VAG", "VAGINAL"), ()),
}


def adm_route_class(route: str | None) -> str | None:
    """The WHO administration route class of a MIMIC prescription route, or None."""
    if route is None:
        return None
    r = route.strip().upper()
    for cls, (exact, prefixes) in ADM_ROUTE_CLASSES.items():
        if r in exact or r.startswith(prefixes):
            return cls
    return None


def adm_route_sql(column: str) -> str:
    """`adm_route_class` as a DuckDB SQL expression over `column`."""
    r = f"upper(trim({column}))"
    whens = []
    for cls, (exact, prefixes) in ADM_ROUTE_CLASSES.items():
        tests = [f"{r} IN ({', '.join(repr(e) for e in exact)})"] + [f"starts_with({r}, '{p}')" for p in prefixes]
        whens.append(f"WHEN {' OR '.join(tests)} THEN '{cls}'")
    return f"(CASE {' '.join(whens)} END)"


# One row per distinct (raw ndc, drug, drug_name_generic, route) of the usable prescription rows.
# A row missing its subject_id takes it from its admission; rows that still lack one are unusable.
# Lineage (the pipeline's cache key and the lineage test read these): what the queries below read and write.
READS = ("raw.prescriptions", "raw.admissions", "ref.ndc_atc3", "ref.drug_name_atc3", "raw.meds_codes")
BY_NAME = "prescriptions (by name)"  # raw.meds_codes.target_table of name-coded medications (medtx.meds.tables)
WRITES = ("core.prescriptions_atc3", "core.mapping_coverage")

_KEYS_SQL = f"""
    WITH adm AS (
        SELECT hadm_id, any_value(subject_id) AS adm_subject FROM raw.admissions
        WHERE dataset = $dataset AND subject_id IS NOT NULL GROUP BY hadm_id
    ), keys AS (
        SELECT p.ndc AS ndc_raw, p.drug, p.drug_name_generic, p.route AS rx_route, count(*) AS n_rows
        FROM raw.prescriptions p
        WHERE p.dataset = $dataset AND p.hadm_id IS NOT NULL
          AND (p.subject_id IS NOT NULL OR p.hadm_id IN (SELECT hadm_id FROM adm))
        GROUP BY ALL
    )
    SELECT row_number() OVER () AS key_id, *, {ndc_sql('ndc_raw')} AS ndc, {adm_route_sql('rx_route')} AS adm_class
    FROM keys"""

# Keys whose NDC is in no NDC map -> candidates by drug name (best name key per key, all its ATC-3).
_NAME_CANDIDATES_SQL = f"""
    WITH names AS (
        SELECT key_id, {drug_name_key_sql('drug_name_generic')} AS k1, {drug_name_key_sql('drug')} AS k2
        FROM _map_keys
        WHERE (ndc IS NOT NULL AND ndc NOT IN (SELECT ndc FROM ref.ndc_atc3)) OR (ndc IS NULL AND $by_name)
    ), cand AS (
        SELECT key_id, key, prio FROM names,
            (VALUES (1), (2), (3), (4)) p(prio),
            LATERAL (SELECT CASE prio WHEN 1 THEN k1 WHEN 2 THEN k2
                                      WHEN 3 THEN split_part(k1, ' ', 1) ELSE split_part(k2, ' ', 1) END AS key)
    ), best AS (
        SELECT key_id, arg_min(key, prio) AS key
        FROM cand WHERE key IN (SELECT drug_name FROM ref.drug_name_atc3)
        GROUP BY key_id
    )
    SELECT b.key_id, r.atc3, 'name' AS route, r.support, r.adm_r
    FROM best b JOIN ref.drug_name_atc3 r ON r.drug_name = b.key"""

# Per key: every candidate ranked by the documented rules; the first one wins.
_CHOICE_SQL = f"""
    WITH cand AS (
        SELECT k.key_id, c.atc3, c.route, c.support, c.adm_r FROM _map_keys k JOIN ref.ndc_atc3 c USING (ndc)
        UNION ALL
        SELECT * FROM ({_NAME_CANDIDATES_SQL})
    ), ranked AS (
        SELECT c.*, coalesce(list_contains(c.adm_r, k.adm_class), false) AS route_match
        FROM cand c JOIN _map_keys k USING (key_id)
    ), ordered AS (
        SELECT *, row_number() OVER w AS pos, count(*) OVER (PARTITION BY key_id) AS n_candidates,
               lead(route_match) OVER w AS next_match, lead(support) OVER w AS next_support
        FROM ranked
        WINDOW w AS (PARTITION BY key_id ORDER BY route_match DESC, support DESC, atc3)
    )
    SELECT key_id, atc3, route, CAST(n_candidates AS INTEGER) AS n_candidates,
           CASE WHEN n_candidates = 1 THEN 'only'
                WHEN route_match AND NOT next_match THEN 'adm_r'
                WHEN support > next_support THEN 'support'
                ELSE 'alphabetical' END AS choice
    FROM ordered WHERE pos = 1"""

_INSERT_SQL = """
    INSERT INTO core.prescriptions_atc3 BY NAME
    WITH adm AS (
        SELECT hadm_id, any_value(subject_id) AS adm_subject FROM raw.admissions
        WHERE dataset = $dataset AND subject_id IS NOT NULL GROUP BY hadm_id
    ), chosen AS (
        SELECT k.*, c.atc3, c.route, c.n_candidates, c.choice FROM _map_keys k JOIN _map_choice c USING (key_id)
    )
    SELECT $dataset AS dataset, coalesce(p.subject_id, adm.adm_subject) AS subject_id, p.hadm_id, p.startdate,
           c.ndc, p.drug, c.atc3, c.route, c.n_candidates, c.choice
    FROM raw.prescriptions p
    JOIN chosen c ON c.ndc_raw IS NOT DISTINCT FROM p.ndc AND c.drug IS NOT DISTINCT FROM p.drug
        AND c.drug_name_generic IS NOT DISTINCT FROM p.drug_name_generic AND c.rx_route IS NOT DISTINCT FROM p.route
    LEFT JOIN adm USING (hadm_id)
    WHERE p.dataset = $dataset AND p.hadm_id IS NOT NULL AND coalesce(p.subject_id, adm.adm_subject) IS NOT NULL"""

# Coverage from the keys: one route per key (its choice's route, else 'unmapped'), rows summed.
_COVERAGE_SQL = """
    INSERT INTO core.mapping_coverage
    WITH keyed AS (
        SELECT k.ndc, k.drug, k.n_rows, coalesce(c.route, 'unmapped') AS route
        FROM _map_keys k LEFT JOIN _map_choice c USING (key_id)
    ), with_ndc AS (SELECT * FROM keyed WHERE ndc IS NOT NULL),
    total AS (SELECT greatest(coalesce(sum(n_rows), 0), 1) AS n FROM with_ndc),
    by_route AS (
        SELECT route, count(DISTINCT ndc) AS n_ndc, sum(n_rows) AS n_rows FROM with_ndc GROUP BY route
        UNION ALL
        SELECT 'mapped', count(DISTINCT ndc), coalesce(sum(n_rows), 0) FROM with_ndc WHERE route <> 'unmapped'
    ), unmapped AS (
        SELECT ndc, sum(n_rows) AS n_rows, string_agg(DISTINCT drug, ' | ' ORDER BY drug) AS drug
        FROM with_ndc WHERE route = 'unmapped' GROUP BY ndc
    )
    SELECT $dataset, 'route', route, NULL, NULL, n_ndc, n_rows, n_rows / (SELECT n FROM total), NULL FROM by_route
    UNION ALL
    SELECT $dataset, 'route', 'no_ndc', NULL, NULL, 0, coalesce(sum(n_rows) FILTER (WHERE ndc IS NULL), 0),
           coalesce(sum(n_rows) FILTER (WHERE ndc IS NULL), 0) / greatest(coalesce(sum(n_rows), 0), 1), NULL
    FROM keyed
    UNION ALL  -- a dataset coding medications by name: the rows without an NDC the drug names mapped
    SELECT $dataset, 'route', 'name_no_ndc', NULL, NULL, 0,
           coalesce(sum(n_rows) FILTER (WHERE ndc IS NULL AND route <> 'unmapped'), 0),
           coalesce(sum(n_rows) FILTER (WHERE ndc IS NULL AND route <> 'unmapped'), 0)
               / greatest(coalesce(sum(n_rows) FILTER (WHERE ndc IS NULL), 0), 1), NULL
    FROM keyed HAVING $by_name
    UNION ALL
    SELECT $dataset, 'unmapped_ndc', 'unmapped', ndc, drug, 1, n_rows, n_rows / (SELECT n FROM total),
           row_number() OVER (ORDER BY n_rows DESC, ndc) FROM unmapped"""


def map_prescriptions(con: duckdb.DuckDBPyConnection, dataset: str) -> int:
    """Rewrite `core.prescriptions_atc3` and `core.mapping_coverage` for one dataset; returns mapped rows
    (one per mapped prescription row)."""
    params = {"dataset": dataset}
    by_name = coded_by_name(con, dataset)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _map_keys AS {_KEYS_SQL}", params)
    con.execute(f"CREATE OR REPLACE TEMP TABLE _map_choice AS {_CHOICE_SQL}", {"by_name": by_name})
    with transaction(con):
        con.execute("DELETE FROM core.prescriptions_atc3 WHERE dataset = $dataset", params)
        con.execute(_INSERT_SQL, params)
        con.execute("DELETE FROM core.mapping_coverage WHERE dataset = $dataset", params)
        con.execute(_COVERAGE_SQL, {**params, "by_name": by_name})
    mapped, ambiguous = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE n_candidates > 1) FROM core.prescriptions_atc3 "
        "WHERE dataset = $dataset", params
    ).fetchall()[0]
    by_rule = dict(con.sql("SELECT choice, sum(n_rows) FROM _map_keys JOIN _map_choice USING (key_id) GROUP BY 1")
                   .fetchall())
    log.info("map [%s]: %d rows mapped, %d of them had several ATC-3 candidates (decided by: %s)",
             dataset, mapped, ambiguous, by_rule)
    for table in ("_map_keys", "_map_choice"):
        con.execute(f"DROP TABLE IF EXISTS {quote_ident(table)}")
    return mapped


def coded_by_name(con: duckdb.DuckDBPyConnection, dataset: str) -> bool:
    """Whether the dataset codes medications by name (a MEDS import whose mapping rule says `field: name`, e.g.
    MIMIC-IV MEDS): then its prescriptions without an NDC take the drug-name route too. MIMIC-III's NDC-less rows
    (IV fluids and flushes, mostly) and medtx's own export never do: PyHealth's drug codes are NDCs."""
    try:
        return bool(con.execute("SELECT count(*) FROM raw.meds_codes WHERE dataset = ? AND target_table = ?",
                                [dataset, BY_NAME]).fetchall()[0][0])
    except duckdb.CatalogException:  # a warehouse without the MEDS tables
        return False


def coverage_summary(con: duckdb.DuckDBPyConnection, dataset: str) -> dict[str, tuple[int, int, float]]:
    """route -> (distinct NDCs, rows, share of rows carrying an NDC), from `core.mapping_coverage`."""
    rows = con.execute(
        "SELECT route, n_ndc, n_rows, pct_rows FROM core.mapping_coverage WHERE dataset = $dataset AND kind = 'route'",
        {"dataset": dataset},
    ).fetchall()
    return {route: (n_ndc, n_rows, pct) for route, n_ndc, n_rows, pct in rows}
