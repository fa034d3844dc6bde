"""The one write path into `raw.*`: every importer (MIMIC-III CSV, MTSamples, MEDS, the next one) goes through it.

`raw_writer(db, command)` holds the warehouse's writer lock for the whole import (medtx.store.writer_lock:
the real path, so a symlinked `--db` meets the same holder; re-entrant, so the CLI or the pipeline that already
holds it is fine) and opens the warehouse; the importer stages its rows in TEMP tables on that connection.
`RawWriter.replacing(dataset, guard)` is then the one transaction that replaces the dataset's rows, and it
checks the row-count guard at its end on every guarded raw table: the rows before the transaction against
the rows the body left, inside the transaction — so whatever the body wrote (any table, any importer), a
dataset that would drop to 0 rows or lose more than `max_shrink` of a table is rolled back unless
`allow_shrink`. An importer cannot skip the guard or the lock: there is no other way to the transaction, and
tests/test_raw_write_path.py fails on SQL that writes a raw table anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from medtx.ingest.loader import IngestError
from medtx.ingest.plausibility import Finding, check_plausibility
from medtx.store.db import connect, quote_table, transaction
from medtx.store.writer_lock import hold_writer

DEFAULT_MAX_SHRINK = 0.5  # a table may lose at most half its rows on re-ingest without --allow-shrink
# Guarded raw tables -> whether rows carry a dataset column (raw.mtsamples is one corpus, counted whole).
GUARDED_TABLES: dict[str, bool] = {
    "raw.patients": True, "raw.admissions": True, "raw.diagnoses_icd": True, "raw.procedures_icd": True,
    "raw.prescriptions": True, "raw.noteevents": True, "raw.mtsamples": False,
}


class ShrinkRefused(IngestError):
    """A replacement would drop a table to 0 rows or by more than the allowed fraction; nothing was changed."""


@dataclass(frozen=True)
class ShrinkGuard:
    """Row-count guard: a table that would drop to 0 rows, or lose more than `max_shrink` of the rows
    loaded for its dataset, fails unless `allow_shrink`."""

    allow_shrink: bool = False
    max_shrink: float = DEFAULT_MAX_SHRINK

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_shrink <= 1.0:
            raise ValueError(f"max_shrink must be between 0 and 1, got {self.max_shrink}")

    def refuses(self, before: int, after: int) -> bool:
        """True when going from `before` to `after` rows is more than this guard allows (a first load never is)."""
        if self.allow_shrink or before == 0:
            return False
        return after == 0 or after < before * (1 - self.max_shrink)


def table_rows(con: duckdb.DuckDBPyConnection, dataset: str) -> dict[str, int]:
    """Rows of every guarded raw table for `dataset` (whole-table counts for tables without a dataset)."""
    out = {}
    for table, scoped in GUARDED_TABLES.items():
        sql = f"SELECT count(*) FROM {quote_table(table)}" + (" WHERE dataset = ?" if scoped else "")
        out[table] = con.execute(sql, [dataset] if scoped else []).fetchall()[0][0]
    return out


def check_shrink(before: Mapping[str, int], after: Mapping[str, int], dataset: str, guard: ShrinkGuard,
                 labels: Mapping[str, str], flag: str = "--allow-shrink") -> None:
    """ShrinkRefused naming the first table (in GUARDED_TABLES order) the guard refuses, and its source."""
    for table in GUARDED_TABLES:
        old, new = before.get(table, 0), after.get(table, 0)
        if guard.refuses(old, new):
            label = labels.get(table) or labels.get("*") or dataset
            raise ShrinkRefused(
                f"{label}: {table} [{dataset}] would shrink from {old:,} to {new:,} rows "
                f"(more than {guard.max_shrink:.0%} fewer); nothing was changed — pass {flag} "
                "(pipeline config: ingest.allow_shrink) if that is intended"
            )


@dataclass
class RawWriter:
    """An open warehouse whose writer lock this process holds (only `raw_writer` makes one)."""

    con: duckdb.DuckDBPyConnection
    db: Path
    findings: list[Finding] = field(default_factory=list)  # the plausibility findings of the last replacement

    @contextmanager
    def replacing(self, dataset: str, guard: ShrinkGuard, labels: Mapping[str, str] | None = None,
                  plausibility: str = "warn") -> Iterator[duckdb.DuckDBPyConnection]:
        """One transaction replacing `dataset`'s rows. At its end the plausibility rules run on the dataset's rows
        as the body left them (medtx.ingest.plausibility: `plausibility` = warn | reject | fail), then the
        row-count guard compares every guarded table with the rows it had when the transaction began; a refusal
        rolls everything back. `labels`: raw table (or '*') -> the source file named in messages."""
        with transaction(self.con):
            before = table_rows(self.con, dataset)
            yield self.con
            self.findings = check_plausibility(self.con, dataset, plausibility, labels or {})
            check_shrink(before, table_rows(self.con, dataset), dataset, guard, labels or {})


@contextmanager
def raw_writer(db: Path | str, command: str) -> Iterator[RawWriter]:
    """Hold `db`'s writer lock (waiting politely, bounded: MEDTX_LOCK_WAIT_S) and open it for the import."""
    db = Path(db)
    with hold_writer(db, command):
        con = connect(db)
        try:
            yield RawWriter(con, db)
        finally:
            con.close()
