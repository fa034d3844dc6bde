"""Which EHR datasets a warehouse holds, and which one a command means when it was not told.

A command that needs one dataset uses the only one present; with none or several it fails with one line
that lists what is there and the command that would help, instead of guessing a hard-coded name.
"""

from __future__ import annotations

import duckdb


class DatasetChoiceError(ValueError):
    """No dataset was named and the warehouse does not make the choice obvious."""


def warehouse_datasets(con: duckdb.DuckDBPyConnection) -> list[str]:
    """EHR datasets with admissions in raw.admissions, sorted (empty when nothing was ingested yet)."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'raw' AND table_name = 'admissions'"
    ).fetchall()[0][0]
    if not exists:
        return []
    return [r[0] for r in con.execute("SELECT DISTINCT dataset FROM raw.admissions ORDER BY 1").fetchall()]


def choose_dataset(available: list[str], requested: str | None, *, db: str = "") -> str:
    """`requested` when given and present; else the only dataset present; else DatasetChoiceError naming
    the datasets present and the command to run next."""
    db_flag = f" --db {db}" if db else ""
    if requested is not None:
        if available and requested not in available:
            raise DatasetChoiceError(
                f"dataset {requested!r} is not in the warehouse; present: {', '.join(available)}"
            )
        return requested
    if len(available) == 1:
        return available[0]
    if not available:
        raise DatasetChoiceError(
            "the warehouse holds no EHR dataset yet: run `medtx ingest mimic3" + db_flag + "` (bundled demo) "
            "or `medtx pipeline" + db_flag + "`"
        )
    raise DatasetChoiceError(
        f"the warehouse holds {len(available)} datasets ({', '.join(available)}): "
        f"choose one with --dataset, e.g. --dataset {available[0]}"
    )
