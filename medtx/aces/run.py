"""Run ACES (es-aces, the MEDS community's task extractor) on a MEDS folder and read back its labels.

    from medtx.aces.run import run_aces, write_events
    write_events(con, "mimic3_demo", work / "events.parquet")   # the events `medtx export meds` writes
    labels = run_aces(work / "events.parquet", Path("config/aces/readmission.yaml"), work)   # -> labels.parquet

ACES itself extracts the labels: medtx never reimplements its window semantics. es-aces pins `polars<2` (medtx
uses polars 2), so it lives in a venv of its own and runs here as a subprocess, its command line (`aces-cli`,
es-aces 0.7.3) named by the environment variable MEDTX_ACES (default: `aces-cli` on PATH):

    python -m venv ~/.venvs/aces && ~/.venvs/aces/bin/pip install es-aces==0.7.3
    export MEDTX_ACES=~/.venvs/aces/bin/aces-cli

ACES writes one parquet file (`subject_id, prediction_time, boolean_value`, plus its window summaries), which
medtx reads with DuckDB (`labels_sql`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only
    import duckdb

ENV = "MEDTX_ACES"
DEFAULT_COMMAND = "aces-cli"
TIMEOUT_S = 3600


class AcesError(ValueError):
    """ACES is missing, refused a task config, or wrote nothing; the message is one line naming the file."""


def aces_command() -> str:
    """The `aces-cli` to run: $MEDTX_ACES, else `aces-cli` on PATH; missing -> AcesError saying how to install."""
    named = os.environ.get(ENV)
    found = shutil.which(named or DEFAULT_COMMAND)
    if found is None:
        where = f"{ENV}={named}" if named else f"`{DEFAULT_COMMAND}` on PATH"
        raise AcesError(f"ACES not found ({where}): install es-aces==0.7.3 in a venv of its own (it pins polars<2) "
                        f"and set {ENV}=<that venv>/bin/aces-cli (docs/MEDS.md, 'Bring your own ACES task')")
    return found


def write_events(con: duckdb.DuckDBPyConnection, dataset: str, path: Path) -> int:
    """Write every event of `dataset` to one MEDS data file, exactly the events `medtx export meds` writes
    (medtx.meds.events: codes, times on the task clock, columns and types), sorted by subject and time as MEDS
    asks. Returns the row count; a dataset without admissions raises AcesError."""
    from medtx.meds.events import DATA_ARROW_SCHEMA, EXTRA_COLUMNS, events_sql
    from medtx.meds.export import copy_parquet
    from medtx.store.db import quote_ident

    con.execute(f"CREATE OR REPLACE TEMP TABLE _aces_events AS {events_sql()}", {"dataset": dataset})
    try:
        n = con.sql("SELECT count(*) FROM _aces_events").fetchall()[0][0]
        if n == 0:
            raise AcesError(f"dataset {dataset!r} has no events to give ACES (no rows in raw.admissions?)")
        columns_sql = ", ".join(map(quote_ident, ["subject_id", "time", "code", "numeric_value", "text_value",
                                                   *EXTRA_COLUMNS]))
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        copy_parquet(con, f"""SELECT {columns_sql} FROM _aces_events
                              ORDER BY subject_id, time NULLS FIRST, _ord, hadm_id, seq_num NULLS LAST, _row, code""",
                     Path(path), DATA_ARROW_SCHEMA)
        return n
    finally:
        con.execute("DROP TABLE IF EXISTS _aces_events")


def run_aces(data_file: Path, config: Path, out_dir: Path, predicates: Path | None = None) -> Path:
    """Run ACES with task `config` (and, for a MEDS-DEV task whose predicates are `???`, a dataset `predicates`
    file) over one MEDS data file; returns the parquet file of its labels (`<out_dir>/labels.parquet`). A
    failed run raises AcesError with ACES's last line of output."""
    config, data_file, out_dir = Path(config).resolve(), Path(data_file).resolve(), Path(out_dir).resolve()
    for path, what in ((config, "task config"), *(((predicates, "predicates file"),) if predicates else ())):
        if not Path(path).is_file():
            raise AcesError(f"{path}: ACES {what} not found")
    labels = out_dir / "labels.parquet"
    cmd = [aces_command(), "data=single_file", "data.standard=meds", f"data.path={data_file}",
           f"config_path={config}", f"output_filepath={labels}", f"log_dir={out_dir / 'logs'}"]
    if predicates is not None:
        cmd.append(f"predicates_path={Path(predicates).resolve()}")
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S,
                            env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    if result.returncode != 0:
        lines = [line.strip() for line in (result.stdout + result.stderr).splitlines() if line.strip()]
        raise AcesError(f"{config}: ACES failed (exit {result.returncode}): {lines[-1] if lines else 'no output'}")
    if not labels.is_file():
        raise AcesError(f"{config}: ACES wrote no label file ({labels})")
    return labels


def labels_sql(labels: Path) -> str:
    """SQL reading ACES's label file: subject_id, prediction_time, label (its boolean_value), one row each."""
    from medtx.store.db import sql_literal

    glob_sql = sql_literal(str(labels))
    return (f"SELECT CAST(subject_id AS BIGINT) AS subject_id, CAST(prediction_time AS TIMESTAMP) AS prediction_time, "
            f"CAST(boolean_value AS BOOLEAN) AS label FROM read_parquet({glob_sql})")
