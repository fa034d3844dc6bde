"""Loading one CSV file into one raw table with DuckDB's CSV reader, keeping rows that fail to parse.

The header is read first (Python's csv module, so quoted names work) to map any header case onto the
lower-case spec and to refuse a file missing a required column before DuckDB touches the warehouse.
DuckDB then reads the file with explicit types and `store_rejects`, straight into the raw table: bad rows land
in a temporary rejects table and are copied to `raw.ingest_rejects`. The caller wraps everything in one
transaction (medtx.ingest.writepath), so a failed check or a kill leaves the table as it was.
"""

from __future__ import annotations

import csv
import gzip
import io
import logging
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import duckdb

from medtx.store.db import quote_ident, quote_table, sql_literal
from medtx.ingest.schema import TableSpec, guess_table

log = logging.getLogger("medtx.ingest")

_GZIP_MAGIC = b"\x1f\x8b"
# Temporary (connection-local) tables DuckDB fills with the rejected rows of one scan.
_REJECTS = "medtx_csv_rejects"
_SCANS = "medtx_csv_scans"
# Connection-local table collecting the rejects of every staged file until they are swapped in.
STAGED_REJECTS = "medtx_stage_rejects"
# MIMIC NOTEEVENTS texts reach ~100 kB; leave room for much longer lines before DuckDB refuses one.
_MAX_LINE_SIZE = 64 * 1024 * 1024
# DuckDB's CSV buffer defaults to 16 x max_line_size: 1 GiB per buffer here, which made the ingest's peak memory
# (1.93 GB for the 46,520-patient cohort: 5.3M prescriptions). A buffer of one maximal line reads the same rows.
_BUFFER_SIZE = _MAX_LINE_SIZE


class IngestError(ValueError):
    """Bad input: the message names the file and what is wrong. Not retryable."""


@dataclass(frozen=True)
class Header:
    """A file's header as read: lower-cased names in file order, and the compression DuckDB must use."""

    names: tuple[str, ...]
    compression: str  # 'gzip' or 'none' (from the magic bytes, not the file name)


@dataclass
class LoadPlan:
    """How to read a file into a spec: DuckDB column types in file order and the INSERT's select list."""

    read_columns: list[tuple[str, str]]
    select: dict[str, str] = field(default_factory=dict)  # spec column -> SQL expression


def read_header(path: Path, label: str) -> Header:
    """The header row of a CSV or gzipped CSV. Raises IngestError for an empty file, an unreadable gzip
    or an undecodable header; `label` (the source name) is used in messages."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if not magic:
        raise IngestError(f"{label}: the file is empty (0 bytes, no header row)")
    compression = "gzip" if magic == _GZIP_MAGIC else "none"
    try:
        # The first line only: decoding a buffered chunk would blame the header for a bad byte in row 10.
        with gzip.open(path, "rb") if compression == "gzip" else open(path, "rb") as raw:
            first = raw.readline(_MAX_LINE_SIZE)
        row = next(csv.reader(io.StringIO(first.decode("utf-8-sig"), newline="")), None)
    except (gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise IngestError(f"{label}: unreadable gzip ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise IngestError(f"{label}: the header (line 1) is not UTF-8 text ({exc})") from exc
    except csv.Error as exc:
        raise IngestError(f"{label}: the header row is not valid CSV ({exc})") from exc
    if not row or not any(name.strip() for name in row):
        raise IngestError(f"{label}: the file is empty (no header row)")
    return Header(tuple(name.strip().lower() for name in row), compression)


# Header names pandas gives an unnamed index column (Kaggle CSVs written with `to_csv()` have one).
_UNNAMED_INDEX = ("", "unnamed: 0")


def plan_load(
    spec: TableSpec,
    header: Header,
    label: str,
    others: dict[str, TableSpec] | None = None,
    *,
    index_column: str | None = None,
) -> LoadPlan:
    """Map a header onto a spec. Spec columns get their declared type; unknown columns are read as VARCHAR
    (so the file still parses) and dropped; optional spec columns the file lacks become NULL.
    `index_column`: when the file lacks it but starts with an unnamed 0-based index, it is index + 1."""
    names = list(header.names)
    from_index = bool(index_column and names and names[0] in _UNNAMED_INDEX and index_column not in names)
    if from_index:
        names[0] = "_index"
    seen: set[str] = set()
    for name in names:
        if name and name in seen:
            raise IngestError(f"{label}: column {name!r} appears twice in the header")
        seen.add(name)
    if from_index:
        seen.add(index_column)
    missing = [c for c in spec.required if c not in seen]
    if missing:
        hint = ""
        if others:
            guess = guess_table(list(header.names), {k: v for k, v in others.items() if k != spec.name})
            if guess:
                hint = f"; the header looks like {guess.upper()}, not {spec.file_stem} (wrong table?)"
        raise IngestError(
            f"{label}: missing required column(s) {', '.join(missing)} for {spec.raw_table}"
            f" (header: {', '.join(header.names)}){hint}"
        )
    read_columns = []
    for i, name in enumerate(names):
        col = spec.column(name)
        if name == "_index" and from_index:
            read_columns.append((name, "BIGINT"))
        else:
            read_columns.append((name, col.type) if col else (f"_extra_{i}", "VARCHAR"))
    select = {
        c.name: quote_ident(c.name) if c.name in seen else f"CAST(NULL AS {c.type})" for c in spec.columns
    }
    if from_index:
        select[index_column] = '"_index" + 1'
    return LoadPlan(read_columns, select)


def load_csv(
    con: duckdb.DuckDBPyConnection,
    spec: TableSpec,
    path: Path,
    plan: LoadPlan,
    header: Header,
    *,
    label: str,
    dataset: str,
    limit: int | None = None,
) -> tuple[int, int]:
    """INSERT the parsable rows of `path` into `spec.raw_table` as `dataset`'s rows, and its rejects into
    `temp.{STAGED_REJECTS}`. Returns (rows loaded, records rejected). Call it inside the write path's transaction
    (medtx.ingest.staging._swap_in, under RawWriter.replacing), after the dataset's old rows are deleted.
    Raises IngestError when DuckDB cannot read the file at all (e.g. a gzip corrupt past its header)."""
    con.execute(f"DROP TABLE IF EXISTS temp.{quote_ident(_REJECTS)}")
    con.execute(f"DROP TABLE IF EXISTS temp.{quote_ident(_SCANS)}")
    columns = ", ".join(f"{sql_literal(name)}: {sql_literal(type_)}" for name, type_ in plan.read_columns)
    target_cols = (["dataset"] if spec.has_dataset else []) + list(plan.select)
    values_sql = (["$dataset"] if spec.has_dataset else []) + list(plan.select.values())  # quoted in plan_load
    # auto_detect off: the types are ours, and the dialect is fixed RFC 4180 (MIMIC and MTSamples use it).
    # read_csv's options must be constants, so they go through the one quoting helper, not parameters.
    options_sql = (
        f"compression = {sql_literal(header.compression)}, max_line_size = {int(_MAX_LINE_SIZE)},"
        f" buffer_size = {int(_BUFFER_SIZE)},"
        f" columns = {{{columns}}}, rejects_table = {sql_literal(_REJECTS)}, rejects_scan = {sql_literal(_SCANS)}"
    )
    sql = f"""
        INSERT INTO {quote_table(spec.raw_table)} ({", ".join(map(quote_ident, target_cols))})
        SELECT {", ".join(values_sql)}
        FROM read_csv($path, header = true, auto_detect = false, delim = ',', quote = '"', escape = '"',
                      encoding = 'utf-8', store_rejects = true, {options_sql})
        {f"LIMIT {int(limit)}" if limit is not None else ""}
    """
    params: dict[str, object] = {"path": str(path)}
    if spec.has_dataset:
        params["dataset"] = dataset
    try:
        loaded = con.execute(sql, params).fetchall()[0][0]
    except (duckdb.IOException, duckdb.InvalidInputException, duckdb.ConversionException) as exc:
        raise IngestError(f"{label}: cannot read the file: {_first_line(exc)}") from exc
    con.execute(
        f"""
        INSERT INTO temp.{quote_ident(STAGED_REJECTS)}
        SELECT $dataset, $table, $file, line, byte_position, column_name, error_type, error_message, csv_line,
               line_byte_position - 1  -- DuckDB's is 1-based: 0-based offsets from here on
        FROM temp.{quote_ident(_REJECTS)} ORDER BY line, column_idx
        """,
        {"dataset": dataset, "table": spec.name, "file": label},
    )
    rejected = con.execute(
        f"SELECT count(DISTINCT line) FROM temp.{quote_ident(_REJECTS)}"
    ).fetchall()[0][0]
    return loaded, rejected


def _first_line(exc: BaseException) -> str:
    """DuckDB errors carry a multi-line SQL excerpt; the first line is the message."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@dataclass(frozen=True)
class IngestResult:
    """What one table's ingest did (picklable: Prefect passes it between tasks and flows)."""

    dataset: str
    table: str
    source: str  # the file or URL read; for an absent optional table, the source searched
    file: str | None  # local path read (the cache file for URLs)
    sha256: str | None
    file_bytes: int | None
    rows_loaded: int
    rows_rejected: int
    status: str  # 'loaded' or 'absent'
    seconds: float


def write_log(con: duckdb.DuckDBPyConnection, result: IngestResult, started: datetime) -> None:
    """One raw.ingest_log row per ingest of one table."""
    con.execute(
        "INSERT INTO raw.ingest_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            str(uuid.uuid4()), result.dataset, result.table, result.source, result.file, result.sha256,
            result.file_bytes, result.rows_loaded, result.rows_rejected, result.status, started, datetime.now(),
        ],
    )
