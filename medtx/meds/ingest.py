"""`medtx ingest meds`: read a MEDS 0.4 dataset into the raw MIMIC-format tables of one medtx dataset.

Everything downstream (map-codes, build-samples, training) then runs on it unchanged. How codes become rows
is the YAML mapping (medtx.meds.mapping); stays come from the admission/discharge events, joined by the
`hadm_id` column when the data has one; an event without a stay id is placed in the stay whose window
(admission day .. discharge) holds its time. Splits come from metadata/subject_splits.parquet (and medtx's
per-task metadata/medtx_task_splits.parquet) into raw.meds_splits, which the sample builders honour.
All checks run before the one write transaction, which replaces the dataset's rows of every raw table.

The write goes through medtx.ingest.writepath like every importer: the writer lock for the whole import, and
the row-count guard at the end of the transaction (a 10-subject folder over a 100-patient dataset, a 0-row
shard, a foreign etl_name mapping a tenth of the prescriptions: refused unless `guard.allow_shrink`).
Times are read as the `meds` schema aligns them: a tz-aware `time` becomes its UTC wall time (never the
machine's zone), nanoseconds are accepted only when they are whole microseconds.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa

from medtx.store.db import quote_ident, quote_table
from medtx.store.fingerprint import file_sha256
from medtx.ingest.loader import IngestResult, write_log
from medtx.ingest.mimic3 import check_dataset
from medtx.ingest.plausibility import check_policy
from medtx.ingest.writepath import ShrinkGuard, raw_writer
from medtx.meds import tables
from medtx.meds.mapping import CodeMapping, load_mapping
from medtx.meds.validate import (
    MedsFormatError, check_codes_file, check_columns, check_events, check_row_counts, check_stays, check_times,
    find_shards, read_dataset_json, split_rows,
)

log = logging.getLogger("medtx.meds")

OPTIONAL_COLUMNS = {"numeric_value": "FLOAT", "text_value": "VARCHAR", "hadm_id": "BIGINT", "seq_num": "INTEGER",
                    "drug": "VARCHAR", "drug_name_generic": "VARCHAR", "route": "VARCHAR", "ndc": "VARCHAR"}
EVENTS = "_meds_events"


@dataclass(frozen=True)
class MedsIngestResult:
    dataset: str
    source: str
    mapping: str
    subjects: int
    events: int
    events_mapped: int
    rows: dict[str, int]         # raw table -> rows loaded
    splits: int                  # subjects with a MEDS split (dataset-wide)
    seconds: float


def default_mapping(meta: dict) -> str:
    """medtx's own export -> `medtx`; anything else -> `mimic4` (the community MIMIC ETL's codes)."""
    return "medtx" if meta.get("etl_name") == "medtx" else "mimic4"


def ingest_meds(db: Path, source: str | Path, dataset: str | None = None, codes: str | Path | None = None, *,
                guard: ShrinkGuard = ShrinkGuard(), command: str = "medtx ingest meds",
                plausibility: str = "warn", cast_types: bool = False) -> MedsIngestResult:
    """Load the MEDS dataset at `source` as `dataset` (default: the folder name). `codes`: a shipped mapping
    name or a YAML file (default: from metadata/dataset.json's etl_name). `guard`: the row-count guard;
    `command`: how the writer lock names this writer; `plausibility`: warn | reject | fail
    (medtx.ingest.plausibility); `cast_types`: accept the column types meds' DataSchema.align casts (tz-aware or
    nanosecond times, float64 values) instead of refusing them."""
    started, clock = datetime.now(), time.perf_counter()
    check_policy(plausibility)
    root = Path(source).expanduser()
    shards = find_shards(root)
    meta = read_dataset_json(root)
    check_codes_file(root)
    mapping = load_mapping(codes or default_mapping(meta))
    dataset = check_dataset(dataset or root.resolve().name.lower().replace("-", "_"))
    schemas = [check_columns(p, exact=not cast_types) for p in shards]
    for path, schema in zip(shards, schemas, strict=True):
        check_times(path, schema)
    splits = _read_splits(root)
    with raw_writer(Path(db), command) as writer:
        con = writer.con
        try:
            rows, n_splits, mapped, unmapped, subjects, events = _write(
                writer, root, str(source), dataset, shards, schemas, splits, mapping, guard, started, clock,
                plausibility)
        finally:
            con.execute("DROP VIEW IF EXISTS _meds_mapped")
            for name in ("_meds_rules", EVENTS, "_meds_stays"):
                con.execute(f"DROP TABLE IF EXISTS {quote_table(name)}")
    result = MedsIngestResult(dataset, str(source), mapping.name, subjects, events, mapped, rows, n_splits,
                              round(time.perf_counter() - clock, 3))
    log.info("MEDS %s -> [%s] (%s codes): %d subjects, %d events, %d mapped, %d not mapped; %s",
             source, dataset, mapping.name, subjects, events, mapped, unmapped, rows)
    return result


def _write(writer, root: Path, source: str, dataset: str, shards: list[Path], schemas: list[pa.Schema], splits,
           mapping: CodeMapping, guard: ShrinkGuard, started: datetime, clock: float, plausibility: str):
    """Load, check and swap in (see ingest_meds) on the writer's connection."""
    con = writer.con
    # Row order is carried by _eid (and row_id), never by insertion order: let DuckDB insert in parallel,
    # unordered (faster at full scale, see benchmarks/README.md). A tz-aware time is cast to its UTC wall
    # time, as meds' DataSchema.align does, not to the machine's zone. This session only.
    con.execute("SET SESSION preserve_insertion_order = false")
    con.execute("SET SESSION TimeZone = 'UTC'")
    _load_events(con, shards, schemas, mapping)
    check_row_counts(con, EVENTS, shards)
    check_events(con, EVENTS, shards)
    tables.create_rules(con, EVENTS, mapping)
    tables.assign_stays(con, EVENTS, mapping)
    check_stays(con, shards)
    digest = _digest(shards)
    with writer.replacing(dataset, guard, {"*": str(root)}, plausibility):
        rows = tables.write_raw(con, dataset, mapping)
        n_splits = _replace_splits(con, dataset, splits)
        mapped, unmapped = tables.write_accounting(con, dataset)
        for table, n in {**rows, "meds_events": mapped}.items():
            write_log(con, IngestResult(dataset, table, source, str(root / "data"), digest, None, n,
                                        unmapped if table == "meds_events" else 0, "loaded",
                                        round(time.perf_counter() - clock, 3)), started)
    subjects, events = con.sql(f"SELECT count(DISTINCT subject_id), count(*) FROM {EVENTS}").fetchall()[0]
    return rows, n_splits, mapped, unmapped, subjects, events


def _load_events(con: duckdb.DuckDBPyConnection, shards: list[Path], schemas: list[pa.Schema],
                 mapping: CodeMapping) -> None:
    """All shards into one temp table, shard by shard. Each row gets `_shard` (its file), `_eid` (shard << 40 |
    row in file: unique, in file order, so no string file names are carried per row) and `_rule` (the mapping
    rule its code matches, decided in this same pass)."""
    con.execute(f"""CREATE OR REPLACE TEMP TABLE {EVENTS} (subject_id BIGINT, time TIMESTAMP, code VARCHAR,
                    {_optional_columns_sql()},
                    _shard INTEGER, _eid BIGINT, _rule INTEGER)""")
    rule_sql, rule_params = tables.rule_case_sql(mapping)
    for k, (path, schema) in enumerate(zip(shards, schemas, strict=True)):
        try:
            con.execute(f"""
                INSERT INTO {EVENTS}
                SELECT subject_id, CAST(time AS TIMESTAMP), CAST(code AS VARCHAR), {_optional_values_sql(schema)},
                       {int(k)}, ({int(k)}::BIGINT << {tables.EID_BITS}) + file_row_number, {rule_sql}
                FROM read_parquet($path, file_row_number = true)""", {"path": str(path), **rule_params})
        except duckdb.Error as exc:  # e.g. an extra column (hadm_id) that is not a number
            first = str(exc).strip().splitlines()[0]
            raise MedsFormatError(f"{path}: cannot read the shard ({first}) (rule: column types)") from exc


def _optional_columns_sql() -> str:
    """Column definitions of the code constant OPTIONAL_COLUMNS."""
    return ", ".join(f"{quote_ident(c)} {t}" for c, t in OPTIONAL_COLUMNS.items())


def _optional_values_sql(schema: pa.Schema) -> str:
    """The OPTIONAL_COLUMNS of one shard: cast when the shard has the column, else a typed NULL. Only the
    constant names are written (the shard's own column names merely pick between the two)."""
    return ", ".join(f"CAST({quote_ident(c)} AS {t})" if c in schema.names else f"NULL::{t}"
                     for c, t in OPTIONAL_COLUMNS.items())


def _read_splits(root: Path) -> list[tuple[str, pa.Table]]:
    """(file name, checked rows) of the split files the dataset has (the task-split file has a task column)."""
    out = []
    for name, with_task in (("subject_splits.parquet", False), ("medtx_task_splits.parquet", True)):
        path = root / "metadata" / name
        if path.is_file():
            out.append((name, split_rows(path, with_task)))
    return out


def _replace_splits(con: duckdb.DuckDBPyConnection, dataset: str, splits) -> int:
    """Replace the dataset's raw.meds_splits; returns the subjects with a dataset-wide split."""
    con.execute("DELETE FROM raw.meds_splits WHERE dataset = ?", [dataset])
    n = 0
    for name, rows in splits:
        con.register("_meds_split_rows", rows)
        try:
            task_sql = "task" if "task" in rows.column_names else "NULL::VARCHAR"
            con.execute(f"""INSERT INTO raw.meds_splits
                            SELECT DISTINCT $d, {task_sql}, subject_id, split FROM _meds_split_rows""", {"d": dataset})
            if task_sql == "NULL::VARCHAR":
                n = con.sql("SELECT count(DISTINCT subject_id) FROM _meds_split_rows").fetchall()[0][0]
        finally:
            con.unregister("_meds_split_rows")
    return n


def _digest(shards: list[Path]) -> str:
    """One SHA-256 over the shards' own hashes: changes when any shard changes (pipeline cache key)."""
    return hashlib.sha256("".join(file_sha256(p) for p in shards).encode()).hexdigest()
