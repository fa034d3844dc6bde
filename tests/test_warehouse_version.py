"""medtx.store.db's schema version, on real DuckDB files: an empty file is version 0 and is migrated, a migrated
warehouse reports the newest migration, and a warehouse newer than this code is refused however it is opened."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from medtx.store.db import WarehouseVersionError, connect, load_migrations, schema_version


def test_an_empty_file_is_version_0_and_a_migrated_one_the_newest(tmp_path: Path) -> None:
    latest = max(m.version for m in load_migrations())
    path = tmp_path / "w.duckdb"
    with duckdb.connect(str(path)) as con:
        assert schema_version(con) == 0  # no migrations table
        con.execute("CREATE TABLE main.other (x INTEGER)")  # another table is not a migrations table
        assert schema_version(con) == 0
    con = connect(path)
    try:
        assert schema_version(con) == latest
        applied = [v for (v,) in con.sql("SELECT version FROM main.schema_migrations ORDER BY 1").fetchall()]
        assert applied == sorted(m.version for m in load_migrations())
    finally:
        con.close()
    with duckdb.connect(str(path), read_only=True) as con:
        assert schema_version(con) == latest


def test_a_warehouse_newer_than_this_code_is_refused(tmp_path: Path) -> None:
    latest = max(m.version for m in load_migrations())
    path = tmp_path / "w.duckdb"
    connect(path).close()
    with duckdb.connect(str(path)) as con:
        con.execute("INSERT INTO main.schema_migrations (version, name) VALUES (?, 'from_the_future')", [latest + 1])
    with pytest.raises(WarehouseVersionError, match=rf"schema version {latest + 1} is newer"):
        connect(path)
    with pytest.raises(WarehouseVersionError, match="newer than this medtx supports"):
        connect(path, read_only=True)
