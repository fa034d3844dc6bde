"""A dataset's ingest as one unit: every table replaced and checked inside one transaction, then one COMMIT.

Every header is read first (a wrong file fails before the warehouse is touched). Then, inside the write path's
one transaction, each table's rows of the dataset are deleted and the file is read by DuckDB straight into the
raw table, and checked (physical record accounting against a scan of the decompressed bytes, merged records,
a cut file, a listed checksum); the plausibility rules and the row-count guard run at the end. Only when
every table passed are the rows, their rejects and the ingest log committed, together. Any failure before
the COMMIT rolls all of it back, and a kill at any point leaves the dataset exactly as it was (DuckDB commits
atomically; rows of an unfinished transaction are never visible, not after a restart either): wholly old or
wholly new, never new admissions beside old prescriptions. The lock, the connection and the guarded
transaction come from medtx.ingest.writepath, the one write path into raw.*.

Speed (issue 35): the rows are written once, not staged in a TEMP table and copied (at 46,520 patients the
copy was 8.5 of the ingest's 20 s), and the record scan (a second decompression of each file, in Python)
runs in a thread beside DuckDB's load instead of after it.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from medtx.store.db import quote_ident, quote_table
from medtx.store.fingerprint import file_sha256
from medtx.ingest.loader import (
    STAGED_REJECTS,
    Header,
    IngestError,
    IngestResult,
    LoadPlan,
    load_csv,
    plan_load,
    read_header,
    write_log,
)
from medtx.ingest.records import GZIP_ERRORS, RecordScan, read_lines_at, scan_records
from medtx.ingest.schema import TableSpec
from medtx.ingest.sources import SourceFile
from medtx.ingest.plausibility import check_policy
from medtx.ingest.writepath import DEFAULT_MAX_SHRINK, ShrinkGuard, raw_writer

log = logging.getLogger("medtx.ingest")

__all__ = ["DEFAULT_MAX_SHRINK", "ShrinkGuard", "TableSource", "ingest_tables"]
_LINES = "medtx_stage_lines"  # temp: physical line and whole raw line of each rejected record


@dataclass(frozen=True)
class TableSource:
    """One table of a dataset to ingest: its file, or None for an optional table the source lacks."""

    spec: TableSpec
    file: SourceFile | None
    searched: str  # what was asked for (folder, file or URL): the label when `file` is None
    index_column: str | None = None


@dataclass
class _Staged:
    item: TableSource
    header: Header | None
    plan: LoadPlan | None
    label: str
    dataset: str = ""
    rows: int = 0
    rejected: int = 0
    seconds: float = 0.0
    line_break_columns: tuple[str, ...] | None = None  # text columns with a '\n' in some value (_line_break_columns)
    scan: Future | None = None  # the record scan (scan_records, counts and hash only), running beside the load
    size: int = 0  # the file's bytes when its scan started: a file that changes while it is read is refused

    def rows_sql(self) -> str:
        """`table WHERE condition`: this file's rows in its raw table (the dataset's: the old ones are deleted by
        then); more conditions may follow with AND. The dataset is bound as $dataset (`rows_params`)."""
        scope_sql = "dataset = $dataset" if self.item.spec.has_dataset else "TRUE"
        return f"{quote_table(self.item.spec.raw_table)} WHERE {scope_sql}"

    def rows_params(self) -> dict[str, str]:
        return {"dataset": self.dataset} if self.item.spec.has_dataset else {}


def _line_break_columns(con: duckdb.DuckDBPyConnection, s: _Staged) -> tuple[str, ...]:
    """The loaded rows' VARCHAR columns holding a line break in some value, found once per file by one cheap
    `contains` scan: the merged-record and line accounting checks then read only those columns (in MIMIC, none
    but the notes' text). At 10,000 synthetic patients this took the two checks from 2.1 s to 0.4 s."""
    if s.line_break_columns is None:
        text = [c.name for c in s.item.spec.columns if c.type == "VARCHAR"]
        found = con.execute(
            "SELECT " + ", ".join(f"count(*) FILTER (WHERE contains({quote_ident(c)}, chr(10)))" for c in text)
            + f" FROM {s.rows_sql()}", s.rows_params()
        ).fetchall()[0] if text and s.rows else ()
        s.line_break_columns = tuple(c for c, n in zip(text, found, strict=False) if n)
    return s.line_break_columns


def ingest_tables(
    db: Path,
    dataset: str,
    items: list[TableSource],
    *,
    others: dict[str, TableSpec] | None = None,
    guard: ShrinkGuard = ShrinkGuard(),
    limit: int | None = None,
    command: str = "medtx ingest",
    plausibility: str = "warn",
) -> list[IngestResult]:
    """Replace `dataset`'s rows of every table in `items` at once, or change nothing (see module doc).
    Headers are checked before the warehouse is opened; `limit` keeps the first N parsed rows per file
    (quick demos: the record accounting is then skipped, since the file is not read to its end).
    The write goes through medtx.ingest.writepath: the writer lock (held as `command`) for the whole
    ingest, and the plausibility rules (`plausibility`: warn | reject | fail) and the row-count guard at the end
    of the one transaction."""
    started = datetime.now()
    check_policy(plausibility)  # a wrong policy fails before any file is read
    staged = []
    for item in items:  # every header first: a wrong file fails before the warehouse is touched
        label = item.file.source if item.file else item.searched
        header = read_header(item.file.path, label) if item.file else None
        plan = plan_load(item.spec, header, label, others, index_column=item.index_column) if header else None
        staged.append(_Staged(item, header, plan, label, dataset))
    # Beside DuckDB's load, in one thread: each file's record scan (a second decompression, in Python) and the hash
    # of local files for the log. ISA-L, hashlib and DuckDB release the GIL while they work.
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        for s in staged:
            if s.item.file is not None:
                s.size = s.item.file.path.stat().st_size
                s.scan = pool.submit(_scan, s) if limit is None else None
        digests = {
            s.item.spec.name: pool.submit(file_sha256, s.item.file.path)
            for s in staged if s.item.file and s.item.file.sha256 is None
        }
        with raw_writer(db, command) as writer:
            con = writer.con
            _create_temp_tables(con)
            labels = {s.item.spec.raw_table: s.label for s in staged}
            with writer.replacing(dataset, guard, labels, plausibility):
                for s in staged:
                    _swap_in(con, s, limit)
                shas = {name: f.result() for name, f in digests.items()}
                results = [_result(s, shas) for s in staged]
                for r in results:
                    write_log(con, r, started)
    finally:  # a failed ingest does not wait for the scans of the files after the one that failed
        pool.shutdown(wait=True, cancel_futures=True)
    for r in results:
        log.info("%s -> raw.%s [%s]: %s, %d rows loaded, %d rejected", r.source, r.table, r.dataset, r.status,
                 r.rows_loaded, r.rows_rejected)
        if r.rows_rejected:
            log.warning("%s: %d row(s) rejected, kept in raw.ingest_rejects", r.source, r.rows_rejected)
    return results


def _create_temp_tables(con: duckdb.DuckDBPyConnection) -> None:
    """The connection-local tables collecting every file's rejects (and their whole lines) until they are stored."""
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {quote_ident(STAGED_REJECTS)} AS SELECT dataset, table_name, file, line,"
        " byte_position, column_name, error_type, error, raw_line, record_byte_position"
        " FROM raw.ingest_rejects LIMIT 0"
    )
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {quote_ident(_LINES)}"
        " (table_name VARCHAR, record_byte_position BIGINT, record_start BIGINT, physical_line BIGINT,"
        " raw_line VARCHAR)"
    )


def _scan(s: _Staged) -> tuple[RecordScan, tuple[str, str] | None]:
    """In the scan thread: the file's physical lines (and the hash of its decompressed bytes when a checksum file
    lists them), and its listed checksum."""
    path = s.item.file.path
    listed = listed_checksum(path)
    return scan_records(path, s.header.compression, sha256=listed is not None and listed[0] != path.name), listed


def _swap_in(con: duckdb.DuckDBPyConnection, s: _Staged, limit: int | None) -> None:
    """Inside the caller's transaction: replace the dataset's rows of one table by its file's rows, collect its
    rejects, and account for every physical line of the file (an IngestError rolls the whole ingest back)."""
    spec = s.item.spec
    if spec.has_dataset:
        con.execute(f"DELETE FROM {quote_table(spec.raw_table)} WHERE dataset = ?", [s.dataset])
    else:
        con.execute(f"DELETE FROM {quote_table(spec.raw_table)}")
    con.execute("DELETE FROM raw.ingest_rejects WHERE dataset = ? AND table_name = ?", [s.dataset, spec.name])
    if s.item.file is None:
        return
    clock = time.perf_counter()
    path = s.item.file.path
    s.rows, s.rejected = load_csv(
        con, spec, path, s.plan, s.header, label=s.label, dataset=s.dataset, limit=limit
    )
    offsets = [r[0] for r in con.execute(
        f"SELECT DISTINCT record_byte_position FROM temp.{quote_ident(STAGED_REJECTS)}"
        " WHERE table_name = ? AND record_byte_position IS NOT NULL ORDER BY 1", [spec.name]
    ).fetchall()]
    try:
        scan, listed = s.scan.result() if s.scan is not None else (None, None)
        # Where each rejected record starts: a pass of its own, only for a file with rejects (or with a `limit`).
        located = scan_records(path, s.header.compression, offsets) if scan is None or offsets else scan
        scan = scan or located
    except GZIP_ERRORS as exc:  # gzip: no end-of-stream marker, a CRC or length mismatch, a broken stream
        raise IngestError(f"{s.label}: the gzip stream is cut or damaged ({exc}); nothing was changed") from exc
    if path.stat().st_size != s.size:
        raise IngestError(f"{s.label}: the file changed while it was read ({s.size:,} -> {path.stat().st_size:,} "
                          "bytes); nothing was changed")
    if offsets:
        whole = read_lines_at(path, s.header.compression, located.start_of.values())
        con.executemany(
            f"INSERT INTO temp.{quote_ident(_LINES)} VALUES (?, ?, ?, ?, ?)",
            [[spec.name, o, located.start_of[o], located.line_of[o], whole.get(located.start_of[o])] for o in offsets],
        )
    if limit is None:
        _check_complete(s, scan.lines, scan.size, scan.ends_with_newline)
        _check_listed_checksum(s, path, listed, scan.sha256)
        _check_merged(con, s)
        _check_accounting(con, s, scan.lines - 1 - scan.blank_lines, offsets, located.line_of, located.start_of)
    con.execute(
        f"""
        INSERT INTO raw.ingest_rejects (dataset, table_name, file, line, byte_position, column_name, error_type,
                                        error, raw_line, ingested_at, record_byte_position, physical_line)
        SELECT r.dataset, r.table_name, r.file, r.line, r.byte_position, r.column_name, r.error_type, r.error,
               -- DuckDB cuts csv_line at 10,000 characters; the whole first physical line may be longer
               CASE WHEN length(l.raw_line) > length(r.raw_line) THEN l.raw_line ELSE r.raw_line END, $now,
               coalesce(l.record_start, r.record_byte_position), l.physical_line
        FROM temp.{quote_ident(STAGED_REJECTS)} r
        LEFT JOIN temp.{quote_ident(_LINES)} l USING (table_name, record_byte_position)
        WHERE r.table_name = $table ORDER BY r.line
        """,
        {"now": datetime.now(), "table": spec.name},
    )
    s.seconds = round(time.perf_counter() - clock, 3)


def _check_complete(s: _Staged, lines: int, size: int, ends_with_newline: bool) -> None:
    """A whole CSV file ends with a line end: a last data line without one is a cut file (e.g. PRESCRIPTIONS cut
    at 60% of its bytes lost 4,125 rows as "1 row rejected", or none at all when the cut fell in the last
    column), whatever the row-count guard allows."""
    if ends_with_newline or lines < 2:
        return
    raise IngestError(
        f"{s.label}: the file ends in the middle of line {lines:,} (byte {size:,} has no line end after it): it "
        "looks cut short; nothing was changed — a whole CSV ends with a line end (add one if this file is whole)"
    )


CHECKSUMS_FILE = "SHA256SUMS.txt"  # as PhysioNet ships with MIMIC-III (the bundled demo has one)


def listed_checksum(path: Path) -> tuple[str, str] | None:
    """(listed name, sha256) for `path` in a SHA256SUMS.txt beside it: its own name (the hash of its bytes) or,
    for X.csv.gz, X.csv (the hash of its decompressed bytes); None when there is no such file or line."""
    sums = path.parent / CHECKSUMS_FILE
    if not sums.is_file():
        return None
    names = (path.name, path.name[:-3]) if path.name.endswith(".gz") else (path.name,)
    for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
        digest, _, name = line.strip().partition(" ")
        name = name.strip().lstrip("*")  # sha256sum writes '*' before a name hashed in binary mode
        if name in names:
            return name, digest.lower()
    return None


def _check_listed_checksum(s: _Staged, path: Path, listed: tuple[str, str] | None, decompressed_sha256: str) -> None:
    """A file cut exactly at a line end is a smaller, whole CSV: nothing inside it tells. When its folder has a
    SHA256SUMS.txt listing it (PhysioNet's MIMIC-III does), the content must match, whatever the row-count guard
    allows; a folder without one is not checked (the row-count guard is then the only check)."""
    if listed is None:
        return
    name, expected = listed
    actual = file_sha256(path) if name == path.name else decompressed_sha256
    if actual == expected:
        return
    raise IngestError(
        f"{s.label}: its content does not match {CHECKSUMS_FILE} beside it ({name}: sha256 {actual[:12]}..., "
        f"listed {expected[:12]}...): the file is cut or changed; nothing was changed — restore the file, or "
        f"remove its line from {CHECKSUMS_FILE} if the change is intended"
    )


def _check_merged(con: duckdb.DuckDBPyConnection, s: _Staged) -> None:
    """Records merged by a quote that opened in one record and closed in a later one: the merged record has the
    right number of columns and parses, so DuckDB reports no reject for the rows it swallowed. Its value then
    holds line breaks followed by what look like whole records (at least as many commas as the header). Free
    text (notes, MTSamples) is left out: a clinical note may hold such lines; a RFC 4180 quoted line break in
    any other column still loads when what follows it is not a record."""
    spec = s.item.spec
    single = [c.name for c in spec.columns if c.type == "VARCHAR" and not c.multiline]
    if not single or not s.rows:
        return
    single = [c for c in single if c in _line_break_columns(con, s)]  # a value without '\n' merged nothing
    if not single:
        return
    commas = len(s.header.names) - 1
    rows_sql, params = s.rows_sql(), s.rows_params()

    def records_sql(col: str) -> str:  # line-starts inside the value that look like a whole record
        return (f"len(list_filter(string_split({quote_ident(col)}, chr(10))[2:], "
                f"lambda x: length(x) - length(replace(x, ',', '')) >= {int(commas)}))")

    found_sql = ", ".join(f"count(*) FILTER (WHERE contains({quote_ident(c)}, chr(10)) AND {records_sql(c)} > 0)"
                          for c in single)
    found = con.execute(f"SELECT {found_sql} FROM {rows_sql}", params).fetchall()[0]
    hit = next((c for c, n in zip(single, found, strict=True) if n), None)
    if hit is None:
        return
    keys = [k for k in ("row_id", "note_id", "subject_id", "hadm_id") if spec.column(k)]
    col_sql = quote_ident(hit)
    row = con.execute(
        f"SELECT {', '.join(map(quote_ident, keys))}, length({col_sql}) - length(replace({col_sql}, chr(10), '')),"
        f" {records_sql(hit)} FROM {rows_sql} AND contains({col_sql}, chr(10)) AND {records_sql(hit)} > 0 LIMIT 1",
        params,
    ).fetchall()[0]
    which = ", ".join(f"{k} {v}" for k, v in zip(keys, row, strict=False) if v is not None) or "a row"
    breaks, records = row[len(keys)], row[len(keys) + 1]
    raise IngestError(
        f"{s.label}: column {hit} of the row with {which} holds {breaks:,} line break(s), {records:,} of them "
        f"followed by a whole record ({commas}+ commas): a quote opened in one record and closed {breaks:,} line(s) "
        f"later merged those records into one ({sum(found):,} such value(s) in all); nothing was changed"
    )


def _check_accounting(
    con: duckdb.DuckDBPyConnection,
    s: _Staged,
    data_lines: int,
    offsets: list[int],
    line_of: dict[int, int],
    start_of: dict[int, int],
) -> None:
    """Fail when parsed rows, the newlines inside their values and the rejected records do not add up to
    the file's data lines: the difference was swallowed into a rejected record (an unterminated quote)."""
    if data_lines - s.rows - s.rejected <= 0:
        return  # the newlines inside values (never negative) can only lower what is left over
    text_cols = [c.name for c in s.item.spec.columns if c.type == "VARCHAR"]
    newlines = 0
    if text_cols and s.rows:
        text_cols = [c for c in text_cols if c in _line_break_columns(con, s)]  # the others hold 0 newlines
    if text_cols and s.rows:
        sql = f"SELECT {_newlines_sql(text_cols)} FROM {s.rows_sql()}"
        newlines = con.execute(sql, s.rows_params()).fetchall()[0][0]
    lost = data_lines - s.rows - newlines - s.rejected
    if lost <= 0:
        return
    where = (
        f"the rejected record starting on line {line_of[offsets[0]]:,} (byte {start_of[offsets[0]]:,})"
        if offsets else "an unknown record"
    )
    raise IngestError(
        f"{s.label}: {lost:,} of {data_lines:,} data line(s) are neither a parsed row nor a rejected record "
        f"({s.rows:,} rows, {s.rejected:,} rejected): {where} swallowed them (unterminated quote or cut file?)"
        "; nothing was changed"
    )


def _newlines_sql(columns: list[str]) -> str:
    """How many '\n' the values of `columns` hold, summed over the rows (0 for none)."""
    return " + ".join(
        f"coalesce(sum(length({quote_ident(c)}) - length(replace({quote_ident(c)}, chr(10), ''))), 0)"
        for c in columns
    )


def _result(s: _Staged, shas: dict[str, str]) -> IngestResult:
    """What one table's ingest did (its raw.ingest_log row)."""
    spec, file = s.item.spec, s.item.file
    return IngestResult(
        s.dataset, spec.name, s.label, str(file.path) if file else None,
        (file.sha256 or shas.get(spec.name)) if file else None, file.bytes if file else None,
        s.rows, s.rejected, "loaded" if file else "absent", s.seconds,
    )
