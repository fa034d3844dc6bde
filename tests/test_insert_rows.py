"""`medtx.store.db.insert_rows`: one INSERT over an Arrow table stores exactly what `executemany` stored."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import numpy as np
import pytest

from medtx.store.db import insert_rows

ROWS = [("r1", "test", "auroc", "none", 0.5, None, 1000, True, dt.datetime(2026, 11, 29, 6, 0), '{"a": 1}'),
        ("r1", "test", "auprc", "none", None, 0.01, None, None, None, None),
        ("r2", "val", "brier", "none", 1, 0.25, 7, False, dt.datetime(2026, 1, 1), "x")]
DDL = ("(run_id VARCHAR, split VARCHAR, metric VARCHAR, averaging VARCHAR, value DOUBLE, sd DOUBLE, n_boot INTEGER, "
       "ok BOOLEAN, seen TIMESTAMP, note VARCHAR)")


def test_insert_rows_stores_what_executemany_stores(tmp_path: Path) -> None:
    with duckdb.connect(str(tmp_path / "w.duckdb")) as con:
        con.execute("CREATE SCHEMA ml")
        con.execute(f"CREATE TABLE ml.a {DDL}")
        con.execute(f"CREATE TABLE ml.b {DDL}")
        con.executemany(f"INSERT INTO ml.a VALUES ({', '.join('?' * len(ROWS[0]))})", ROWS)
        insert_rows(con, "ml.b", ROWS)
        a = con.execute("SELECT * FROM ml.a ORDER BY ALL").fetchall()
        assert a == con.execute("SELECT * FROM ml.b ORDER BY ALL").fetchall() and len(a) == 3
        insert_rows(con, "ml.b", [r[:3] for r in ROWS], columns=("run_id", "split", "metric"))
        assert con.execute("SELECT count(*), count(value) FROM ml.b").fetchone() == (6, 2)
        insert_rows(con, "ml.b", [])  # nothing to insert: no statement
        assert con.execute("SELECT count(*) FROM ml.b").fetchone() == (6,)
        insert_rows(con, "ml.b", [("r3", "test", "ece", "none", np.float64(0.5), None, np.int64(7), np.bool_(True),
                                   None, None)])  # numpy scalars, which executemany refuses
        assert con.execute("SELECT value, n_boot, ok FROM ml.b WHERE run_id = 'r3'").fetchone() == (0.5, 7, True)
        assert con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_medtx_rows%'").fetchone() \
            == (0,)


def test_rows_of_different_lengths_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with duckdb.connect(str(tmp_path / "w.duckdb")) as con:
        con.execute("CREATE SCHEMA ml")
        con.execute(f"CREATE TABLE ml.b {DDL}")
        with pytest.raises(ValueError, match=r"insert into ml\.b: rows of different lengths"):
            insert_rows(con, "ml.b", [ROWS[0], ROWS[1][:4]])
        assert con.execute("SELECT count(*) FROM ml.b").fetchone() == (0,)
