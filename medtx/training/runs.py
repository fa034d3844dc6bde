"""Rules every run family (EHR neural, EHR baselines, text, FAQ) shares, stated once.

- `is_synthetic`: a dataset is synthetic when its name says so or any of the generator's oracle tables has rows
  for it;
- `run_folder`: a run's checkpoints go to `<models_dir>/<run_id>/` (`best/`, `last/`, `pretrain/` ...);
- `attention_frame`: the trainer's per-sample attention -> `ml.attention` long form, cut to `max_tokens`
  query/key positions from the end that matters for the family (EHR: the last, i.e. the current visit;
  notes: the first, i.e. the start of the note), so rows of a cut sample no longer sum to exactly 1.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from medtx.store.db import quote_table
from medtx.training.results import attention_frame  # noqa: F401  (the rule lives with RunResults, pure)


def oracle_exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether raw.<table> exists (the oracle tables are created when a synthetic cohort is ingested)."""
    return con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'raw' "
                       "AND table_name = ?", [table]).fetchall()[0][0] > 0


def is_synthetic(con: duckdb.DuckDBPyConnection, dataset: str) -> bool:
    """A dataset is synthetic when its name says so or the generator's oracle rows (any task's) exist for it."""
    from medtx.synth.oracle import (
        WRITES as ORACLE_TABLES,  # the oracle ingest step's declared lineage
    )

    if dataset.startswith("synth"):
        return True
    for table in ORACLE_TABLES:
        name = table.removeprefix("raw.")
        if oracle_exists(con, name) and con.execute(
                f"SELECT count(*) FROM {quote_table('raw.' + name)} WHERE dataset = ?", [dataset]).fetchall()[0][0] > 0:
            return True
    return False


def run_folder(models_dir: Path | str, run_id: str) -> Path:
    """The one checkpoint-folder rule: `<models_dir>/<run_id>`."""
    return Path(models_dir) / run_id


def settings_run_folder(db: Path | str, run_id: str, models_dir: Path | str | None = None) -> Path:
    """`run_folder` under `models_dir`, or by default under the settings' models folder of this warehouse."""
    from medtx.settings import get_settings

    return run_folder(models_dir or get_settings(db=Path(db)).models_dir, run_id)
