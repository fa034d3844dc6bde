"""Opening the DuckDB warehouse, applying migrations, and transactional writes.

Every write path goes through `transaction()` so a failure leaves the warehouse exactly as it was.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from medtx.store.writer_lock import WarehouseBusy, lock_wait_s, read_holder
from warehouse import migrations_dir

log = logging.getLogger("medtx.store.db")

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


# DuckDB's memory limit in every process medtx opens a warehouse in (issue #35). DuckDB's own default is 80% of the
# machine's memory per process: its buffer pool then keeps GBs of pages and staged rows (the ingest's TEMP tables)
# in memory in each process before spilling to its temp folder. `auto`: 1/32 of the memory this process tree may
# use (cgroup-capped), at least 1 GiB, at most 8 GiB (1 GiB on a 24 GiB machine). Set by MEDTX_DUCKDB_MEMORY_LIMIT,
# or a pipeline config's `runner.duckdb_memory_limit`; a size such as 2GiB or 1500MB.
MEMORY_LIMIT_ENV = "MEDTX_DUCKDB_MEMORY_LIMIT"
MIN_MEMORY_LIMIT = 256 << 20
AUTO_MEMORY_FRACTION, AUTO_MEMORY_FLOOR, AUTO_MEMORY_CEILING = 1 / 32, 1 << 30, 8 << 30
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(b|kb|mb|gb|tb|kib|mib|gib|tib)\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """Bytes allowed by the cgroup (v2 `memory.max`, else v1 `memory/memory.limit_in_bytes`); None when unlimited
    or unreadable."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            return None
        return value if 0 < value < 1 << 60 else None  # v1 writes ~2**63 for "unlimited"
    return None


def available_memory(root: Path = CGROUP_ROOT) -> int:
    """Bytes of memory this process tree may use: the machine's physical memory, capped by the cgroup limit."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_memory_limit(root)
    return min(total, limit) if limit is not None else total


def auto_memory_limit(memory: int | None = None) -> int:
    """`auto`: 1/32 of `memory` (default: what this process tree may use), within [1 GiB, 8 GiB]."""
    if memory is None:
        memory = available_memory()
    return int(min(AUTO_MEMORY_CEILING, max(AUTO_MEMORY_FLOOR, memory * AUTO_MEMORY_FRACTION)))


def parse_memory_limit(raw: object, name: str = MEMORY_LIMIT_ENV) -> int:
    """Bytes of a DuckDB memory limit given as `auto` or a size (`2GiB`, `1500MB`, `1.5GB`); else ValueError,
    one line naming `name` (the environment variable or config key it came from) and what is allowed."""
    text = str(raw).strip()
    if text.lower() == "auto":
        return auto_memory_limit()
    match = _SIZE.match(text)
    value = int(float(match[1]) * _UNITS[match[2].lower()]) if match else 0
    if value < MIN_MEMORY_LIMIT:
        raise ValueError(f"{name}={raw!r}: not a DuckDB memory limit; allowed: auto (1/32 of the machine's memory, "
                         "1-8 GiB) or a size of at least 256MiB such as 2GiB or 1500MB")
    return value


def duckdb_memory_limit() -> int:
    """The memory limit, in bytes, of every DuckDB database medtx opens: MEDTX_DUCKDB_MEMORY_LIMIT, else `auto`."""
    return parse_memory_limit(os.environ.get(MEMORY_LIMIT_ENV, "auto"))


class WarehouseVersionError(RuntimeError):
    """The warehouse was written by a newer medtx than this one."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(folder: Path | None = None) -> list[Migration]:
    """All `NNNN_name.sql` files of the migrations folder, in version order."""
    folder = folder or migrations_dir()
    found = []
    for path in sorted(folder.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise ValueError(f"{path}: migration files must be named NNNN_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"{folder}: duplicate migration versions {versions}")
    return found


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The highest applied migration version (0 for an empty database: no migrations table). The missing table
    is DuckDB's CatalogException, raised while binding: an open transaction stays usable (checked on 2.0.0).

    The table is read directly, a missing one being the empty database: asking information_schema first cost
    every open ~8 ms more (9.1 vs 1.2 ms on a freshly opened 50 MB warehouse), and the pipeline opens the
    warehouse for every step's bookkeeping."""
    try:
        return con.sql("SELECT coalesce(max(version), 0) FROM main.schema_migrations").fetchall()[0][0]
    except duckdb.CatalogException:
        return 0


def migrate(con: duckdb.DuckDBPyConnection, migrations: list[Migration] | None = None) -> int:
    """Bring the warehouse to the newest schema; refuse a warehouse newer than this code."""
    migrations = migrations if migrations is not None else load_migrations()
    latest = max((m.version for m in migrations), default=0)
    current = schema_version(con)
    if current > latest:
        raise WarehouseVersionError(
            f"warehouse schema version {current} is newer than this medtx supports ({latest}); "
            "upgrade medtx or point --db at another warehouse"
        )
    # Every migration not yet applied, not only those above the highest applied one: a migration numbered below
    # one that landed first (parallel branches) must still run on warehouses created in between.
    applied = set() if current == 0 else {v for (v,) in con.sql("SELECT version FROM main.schema_migrations").fetchall()}
    pending = [m for m in migrations if m.version not in applied]
    if not pending:
        return current
    with transaction(con):
        con.execute(
            "CREATE TABLE IF NOT EXISTS main.schema_migrations ("
            " version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,"
            " applied_at TIMESTAMP NOT NULL DEFAULT current_timestamp)"
        )
        for m in pending:
            log.info("applying warehouse migration %04d_%s", m.version, m.name)
            con.execute(m.sql)
            con.execute("INSERT INTO main.schema_migrations (version, name) VALUES (?, ?)", [m.version, m.name])
    return latest


def _duckdb_connect(db: Path, read_only: bool, wait_s: float) -> duckdb.DuckDBPyConnection:
    """duckdb.connect, retried with backoff for up to `wait_s` seconds while another process holds the
    file lock (DuckDB locks the whole file across processes, see STACK.md); says once who holds it."""
    deadline = time.monotonic() + wait_s
    delay = 0.2
    told = False
    while True:
        try:
            return duckdb.connect(str(db), read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            holder = read_holder(db)
            who = holder.describe(db) if holder else f"warehouse {db} is locked by another process"
            if time.monotonic() > deadline:
                raise WarehouseBusy(f"{who}; gave up after waiting {wait_s:g} s") from exc
            if not told:
                log.warning("%s; waiting up to %g s", who, wait_s)
                told = True
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def connect(
    db: Path | str, *, read_only: bool = False, migrate_schema: bool = True, wait_s: float | None = None
) -> duckdb.DuckDBPyConnection:
    """Open the warehouse. Read-write connections create the file and apply pending migrations;
    read-only ones refuse a missing file and a schema newer than this code. Another process's lock on
    the file is waited out for `wait_s` seconds (default MEDTX_LOCK_WAIT_S, 120 s; 0 = fail at once)."""
    db = Path(db)
    wait_s = lock_wait_s() if wait_s is None else wait_s
    memory_limit = duckdb_memory_limit()  # a bad MEDTX_DUCKDB_MEMORY_LIMIT fails before the file is touched
    if read_only:
        if not db.exists():
            raise FileNotFoundError(f"warehouse {db} does not exist yet: run `medtx pipeline` first")
        con = _duckdb_connect(db, True, wait_s)
        latest = max((m.version for m in load_migrations()), default=0)
        if schema_version(con) > latest:
            con.close()
            raise WarehouseVersionError(
                f"warehouse {db} has schema version newer than this medtx supports ({latest})"
            )
    else:
        db.parent.mkdir(parents=True, exist_ok=True)
        con = _duckdb_connect(db, False, wait_s)
        if migrate_schema:
            try:
                migrate(con)
            except Exception:
                con.close()
                raise
    try:  # per database instance: every connection of this process to the file shares it
        con.execute(f"SET memory_limit = {sql_literal(f'{memory_limit}B')}")
    except Exception:
        con.close()
        raise
    con.execute("SET enable_progress_bar = false")
    return con


@contextmanager
def open_warehouse(
    db: Path | str, *, read_only: bool = False, wait_s: float | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """Short-lived connection: open (waiting up to `wait_s` for another process's lock), yield, always close."""
    con = connect(db, read_only=read_only, wait_s=wait_s)
    try:
        yield con
    finally:
        con.close()


def sql_literal(value: str | Path) -> str:
    """A string (or path) as a SQL string literal. The one place SQL text is built from a value: for the
    spots DuckDB takes no parameter (ATTACH, read_csv options); everything else binds parameters."""
    return "'" + str(value).replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    """One identifier, double-quoted (`raw.x` is two: quote each part, or use `quote_table`)."""
    return '"' + name.replace('"', '""') + '"'


def quote_table(qualified: str) -> str:
    """`schema.table` (or `db.schema.table`) with every part quoted."""
    return ".".join(quote_ident(part) for part in qualified.split("."))


def arrow_rows(rows: Sequence[Sequence[object]], names: Sequence[str], what: str) -> Any:
    """Python rows as an Arrow table with these column names (each column's type is Arrow's reading of its
    values; None is null). Rows of another length than `names` are refused, naming `what`."""
    import pyarrow as pa

    if any(len(r) != len(names) for r in rows):
        raise ValueError(f"{what}: rows of different lengths")
    return pa.table({name: pa.array([r[i] for r in rows]) for i, name in enumerate(names)})


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Sequence[object]],
                columns: Sequence[str] | None = None) -> None:
    """`INSERT INTO table [(columns)] VALUES` every row, as one statement over an Arrow table. DuckDB's
    `executemany` runs one INSERT per row: 600 subgroup rows took 0.51 s that way, 0.008 s this way (the per-run
    analysis of the default pipeline spent 15 of its 47 s in executemany). Values map by position; None is NULL;
    each column's type is Arrow's reading of its Python values, cast by DuckDB to the table's column type."""
    if not rows:
        return
    medtx_rows = arrow_rows(rows, [f"c{i}" for i in range(len(rows[0]))], f"insert into {table}")  # noqa: F841
    target_sql = quote_table(table) + (f" ({', '.join(map(quote_ident, columns))})" if columns else "")
    # DuckDB reads the local Arrow table by its name (a replacement scan): `register` and `from_arrow` refuse a
    # connection whose last result was not fetched to the end (a `.fetchone()`), `execute` does not.
    con.execute(f"INSERT INTO {target_sql} SELECT * FROM medtx_rows")


def insert_arrow(con: duckdb.DuckDBPyConnection, table: str, rows: Any) -> None:
    """`INSERT INTO table (its columns)` every row of an Arrow table, matched by column name, as one statement
    (read by name, as in `insert_rows`)."""
    if not rows.num_rows:
        return
    medtx_frame = rows  # noqa: F841 (read by name)
    cols_sql = ", ".join(map(quote_ident, rows.column_names))
    con.execute(f"INSERT INTO {quote_table(table)} ({cols_sql}) SELECT {cols_sql} FROM medtx_frame")


def param_marks(n: int) -> str:
    """`?, ?, ?` for an IN list of n bound values."""
    return ", ".join("?" * int(n))


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """BEGIN ... COMMIT, or ROLLBACK on any exception (DuckDB DDL is transactional too)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    else:
        con.execute("COMMIT")
