"""Code dictionaries (`ref.*`), NDC normalisation and prescriptions -> ATC-3 mapping with coverage."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import duckdb

from medtx.codes.mapping import ATC3_PATTERN, adm_route_class, coverage_summary, map_prescriptions
from medtx.codes.ndc import normalize_ndc
from medtx.codes.reference import load_reference_tables, reference_loaded

log = logging.getLogger("medtx.codes")

__all__ = [
    "ATC3_PATTERN", "adm_route_class", "coverage_summary", "load_reference_tables", "map_codes", "map_prescriptions",
    "normalize_ndc",
]


def map_codes(
    con: duckdb.DuckDBPyConnection, data_dir: Path, datasets: Sequence[str] | None = None,
    *, reload_reference: bool = True,
) -> dict[str, dict[str, tuple[int, int, float]]]:
    """Reload `ref.*` from `data_dir` (or only when empty, `reload_reference=False`), then map the
    prescriptions of each dataset (default: every dataset in raw.admissions). Returns coverage per dataset."""
    if reload_reference or not reference_loaded(con):
        load_reference_tables(con, data_dir)
    if datasets is None:
        datasets = [r[0] for r in con.sql("SELECT DISTINCT dataset FROM raw.admissions ORDER BY 1").fetchall()]
    if not datasets:
        log.warning("map_codes: raw.admissions is empty, only the reference tables were loaded")
    out = {}
    for dataset in datasets:
        mapped = map_prescriptions(con, dataset)
        out[dataset] = coverage_summary(con, dataset)
        with_ndc = sum(v[1] for k, v in out[dataset].items() if k in ("mapped", "unmapped"))
        share = out[dataset].get("mapped", (0, 0, 0.0))[2]
        log.info("map_codes [%s]: %d rows mapped (one ATC-3 each); %.1f%% of %d prescription rows with an NDC mapped",
                 dataset, mapped, 100 * share, with_ndc)
    return out
