"""The dashboard's snapshot reader: connections, query cache, marts; the page queries are its siblings in
dashboard.queries.

Rules every query of dashboard.queries keeps so the dashboard stays up and safe while flows write:
- Only the published snapshot is read, read-only, so the writer never waits on us, and a newly published
  snapshot is picked up by the next query. The reader of each snapshot version is a private in-memory
  DuckDB that ATTACHes the file READ_ONLY (`duckdb.connect(path)` would reuse DuckDB's per-process instance
  for that path, which can still be the *old* file for a moment after a publish renamed the new one into
  place; ATTACH always opens what the path names now); each query runs on its own cursor of it, so a
  request does not pay for re-opening the file's catalog.
- User input only ever travels as bound parameters (`?`); SQL text is constant. The few identifiers that
  vary (mart names) come from constant mappings, never from a request.
- Results are cached per snapshot *version* (inode, mtime, size): repeated callbacks are fast, and a publish
  (an `os.replace` of the file) changes the key, so nobody sees stale data after it.
- A table that does not exist yet (a stage that has not run) reads as an empty frame: the pages then show
  an empty state instead of a traceback.
- Aggregations over millions of rows are not run per request: they read the `dash.*` marts that publishing
  materialises into the snapshot (`medtx.publish.marts`), or, for a snapshot published before they existed, the
  same SELECT inline.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TypeVar

import duckdb
import polars as pl

from medtx.store.db import WarehouseVersionError, load_migrations, quote_ident
from medtx.publish.marts import MARTS
from medtx.publish.marts import SCHEMA as MART_SCHEMA

log = logging.getLogger("medtx.dashboard")

# Which tasks a page lists, whether the leakage gate covers one, what a `task` request parameter may name and
# which sample table holds a note task's text are read off the registry's `Task` objects where they are used
# (dashboard.validate, dashboard.pages, the page queries): no table here is keyed by task name.

Signature = tuple[int, int, int]
T = TypeVar("T")


def snapshot_signature(snapshot: Path) -> Signature | None:
    """Identity of the snapshot's current version, or None when nothing has been published yet."""
    try:
        st = os.stat(snapshot)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def query(snapshot: Path, sql: str, params: Sequence[object] = ()) -> pl.DataFrame:
    """Run one parameterised SELECT against the snapshot; empty frame if it or a table is missing."""
    signature = snapshot_signature(snapshot)
    if signature is None:
        return pl.DataFrame()
    return _cached_query(str(snapshot), signature, sql, _freeze(params))


def _freeze(params: Sequence[object]) -> tuple[object, ...]:
    """Hashable form of the parameters (lists become tuples) for the cache key."""
    return tuple(tuple(p) if isinstance(p, list) else p for p in params)


def open_snapshot(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection to the snapshot file as it is now (see the module docstring).

    Refuses a snapshot written by a newer medtx, like `medtx.store.db.connect(read_only=True)`.
    """
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute("ATTACH ? AS snapshot (READ_ONLY)", [str(path)])
        con.execute("USE snapshot")
        version = con.sql("SELECT coalesce(max(version), 0) FROM snapshot.main.schema_migrations").fetchall()[0][0]
    except duckdb.CatalogException:
        version = 0  # no migrations table: an empty or foreign file; queries then find no tables
    except BaseException:
        con.close()
        raise
    if version > _supported_version():
        con.close()
        raise WarehouseVersionError(f"snapshot {path} has schema version {version}, newer than this medtx supports")
    return con


@lru_cache(maxsize=1)
def _supported_version() -> int:
    return max((m.version for m in load_migrations()), default=0)


# snapshot path -> (version, attached connection): the reader of the newest version seen.
_ATTACHED: dict[str, tuple[Signature, duckdb.DuckDBPyConnection]] = {}
_ATTACH_LOCK = threading.Lock()


def _cursor(path: str, signature: Signature) -> duckdb.DuckDBPyConnection:
    """A cursor (own connection, shared database) on the snapshot version `signature`.

    A new version (a publish renamed a new file into place) gets a fresh ATTACH. The previous reader is
    dropped, not closed: closing it would close the cursors of queries still running on it; they finish
    on the old (unlinked) file, which is released with the last of them.
    """
    with _ATTACH_LOCK:
        known = _ATTACHED.get(path)
        if known is None or known[0] != signature:
            _ATTACHED[path] = (signature, open_snapshot(path))
        cursor = _ATTACHED[path][1].cursor()
    cursor.execute("USE snapshot")
    return cursor


def _forget_connections() -> None:
    with _ATTACH_LOCK:
        _ATTACHED.clear()  # dropped, not closed: see `_cursor`


@lru_cache(maxsize=1024)
def _cached_query(path: str, signature: Signature, sql: str, params: tuple[object, ...]) -> pl.DataFrame:
    bound = [list(p) if isinstance(p, tuple) else p for p in params]
    try:
        con = _cursor(path, signature)
    except (FileNotFoundError, duckdb.IOException) as exc:
        log.warning("snapshot %s not readable right now: %s", path, exc)
        return pl.DataFrame()
    try:
        return con.sql(sql, params=bound or None).pl()
    except duckdb.CatalogException as exc:
        # A schema or table that a not-yet-run stage creates: an empty state, not an error.
        log.debug("snapshot %s lacks a table for this query: %s", path, exc)
        return pl.DataFrame()
    finally:
        con.close()


def _mart_sql(snapshot: Path, name: str) -> str:
    """FROM-clause text of a mart: its materialised table when this snapshot has one, else its SELECT.

    Both come from the constant `medtx.publish.marts.MARTS`; no request data reaches SQL text.
    """
    if name in _snapshot_marts(snapshot):
        return f"{MART_SCHEMA}.{quote_ident(name)}"
    return f"({MARTS[name].select}) AS {quote_ident(name)}"


def _snapshot_marts(snapshot: Path) -> set[str]:
    df = query(snapshot, "SELECT table_name FROM duckdb_tables() WHERE database_name = 'snapshot' "
               "AND schema_name = ?", [MART_SCHEMA])
    return set(df.to_series().to_list()) if df.height else set()


_VIEW_CACHES: list = []


def cached_view(build: Callable[..., T]) -> Callable[..., T]:
    """Cache a page part built by `build(snapshot, *hashable_args)` per snapshot version, like the queries:
    warm callbacks then skip figure building too, and a publish invalidates them."""

    @lru_cache(maxsize=256)
    def cached(path: str, signature: Signature | None, *args: object) -> T:
        return build(Path(path), *args)

    @functools.wraps(build)
    def wrapper(snapshot: Path, *args: object) -> T:
        return cached(str(snapshot), snapshot_signature(snapshot), *args)

    _VIEW_CACHES.append(cached)
    return wrapper


def clear_cache() -> None:
    """Forget cached results, views and open readers (benchmarks measure cold latency with it)."""
    _cached_query.cache_clear()
    _forget_connections()
    for cache in _VIEW_CACHES:
        cache.cache_clear()


def has_snapshot(snapshot: Path) -> bool:
    return snapshot_signature(snapshot) is not None


def _scalar(df: pl.DataFrame, default: object = None) -> object:
    return df.item(0, 0) if df.height and df.width else default
