"""Load a synthetic cohort's ground truth (ORACLE_*.csv.gz) into `raw.synth_oracle_*`.

The `oracle` baseline then scores these probabilities on the test split like any model's predictions:
what a model that knows the generating process would get, the ceiling beside every model's score.
"""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb

from medtx.store.db import quote_table, sql_literal, transaction

log = logging.getLogger("medtx.synth")

# file stem -> (warehouse table, column types); columns in file order
ORACLE_FILES: dict[str, tuple[str, dict[str, str]]] = {
    "ORACLE_DRUG_REC": ("raw.synth_oracle_drug_rec", {"hadm_id": "BIGINT", "atc3": "VARCHAR", "prob": "DOUBLE"}),
    "ORACLE_NEXT_VISIT": ("raw.synth_oracle_next_visit",
                          {"hadm_id": "BIGINT", "icd9_code": "VARCHAR", "prob": "DOUBLE"}),
    "ORACLE_READMISSION": ("raw.synth_oracle_readmission", {"hadm_id": "BIGINT", "prob": "DOUBLE"}),
    "ORACLE_MORTALITY": ("raw.synth_oracle_mortality", {"hadm_id": "BIGINT", "prob": "DOUBLE"}),
}

WRITES = tuple(table for table, _ in ORACLE_FILES.values())  # lineage of the oracle ingest step


class OracleFilesMissing(FileNotFoundError):
    """The source folder is not a synthetic cohort (or its oracle files were removed)."""


def _oracle_path(source_dir: Path, stem: str) -> Path:
    path = source_dir / f"{stem}.csv.gz"
    if not path.is_file():
        raise OracleFilesMissing(f"{path}: oracle file missing; is {source_dir} a `medtx synth mimic3` folder?")
    return path


def _read_sql(path: Path, columns: dict[str, str]) -> str:
    """Strict typed read: a malformed row fails the load, naming the file and line."""
    types_sql = ", ".join(f"{sql_literal(c)}: {sql_literal(t)}" for c, t in columns.items())
    return f"SELECT * FROM read_csv({sql_literal(path)}, header = true, columns = {{{types_sql}}}, auto_detect = false)"


def load_oracle(con: duckdb.DuckDBPyConnection, source_dir: Path, dataset: str) -> dict[str, int]:
    """Replace `dataset`'s rows of the three oracle tables with the files in `source_dir` (one transaction).

    Returns rows loaded per table. Raises OracleFilesMissing when a file is absent (nothing is changed)."""
    source_dir = Path(source_dir)
    paths = {stem: _oracle_path(source_dir, stem) for stem in ORACLE_FILES}
    counts: dict[str, int] = {}
    with transaction(con):
        for stem, (table, columns) in ORACLE_FILES.items():
            con.execute(f"DELETE FROM {quote_table(table)} WHERE dataset = ?", [dataset])
            try:
                con.execute(
                    f"INSERT INTO {quote_table(table)} SELECT ?, * FROM ({_read_sql(paths[stem], columns)})", [dataset]
                )
            except duckdb.Error as exc:
                raise ValueError(f"{paths[stem]}: cannot load oracle file: {exc}") from exc
            counts[table] = con.execute(
                f"SELECT count(*) FROM {quote_table(table)} WHERE dataset = ?", [dataset]
            ).fetchall()[0][0]
    log.info("oracle of %s loaded from %s: %s", dataset, source_dir, counts)
    return counts
