"""Fixtures of the samples stage: the real demo ingested and built once per session, crafted raw rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from medtx.codes import map_codes
from medtx.store.db import connect
from medtx.ingest import ingest_mimic3, ingest_mtsamples
from medtx.tasks.build import build_samples
from tests.conftest import DATA

DEMO = "mimic3_demo"


_BUILT: dict[str, Path] = {}  # test modules import the fixture separately: build the demo once per session


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory) -> Path:
    """A warehouse with the bundled demo + MTSamples ingested, codes mapped and every task built (seed 42)."""
    if "demo" in _BUILT:
        return _BUILT["demo"]
    db = tmp_path_factory.mktemp("samples-demo") / "warehouse.duckdb"
    cache = db.parent / "cache"
    ingest_mimic3(db, DATA / "mimic3_demo", DEMO, cache)
    ingest_mtsamples(db, DATA / "mtsamples" / "mtsamples.csv.gz", cache)
    con = connect(db)
    try:
        map_codes(con, DATA)
        build_samples(con, DATA)
    finally:
        con.close()
    _BUILT["demo"] = db
    return db


@pytest.fixture
def demo_copy(demo_db: Path, tmp_path: Path) -> Path:
    """A private copy of the built demo warehouse, for tests that rewrite it."""
    target = tmp_path / "demo.duckdb"
    shutil.copy(demo_db, target)
    return target


def insert_rows(con, table: str, rows: list[dict]) -> None:
    """Append crafted rows to raw.<table> by column name (other columns NULL)."""
    frame = pl.DataFrame(rows)
    con.register("_crafted", frame)
    con.execute(f"INSERT INTO raw.{table} BY NAME SELECT * FROM _crafted")
    con.unregister("_crafted")
