"""Rules every run family (EHR neural, EHR baselines, text, FAQ) shares, stated once.

- `is_synthetic`: a dataset is synthetic when its name says so or any of the generator's oracle tables has rows
  for it;
- `run_folder`: a run's checkpoints go to `<models_dir>/<run_id>/` (`best/`, `last/`, `pretrain/` ...);
- `attention_frame`: the trainer's per-sample attention -> `ml.attention` long form, cut to `max_tokens`
  query/key positions from the end that matters for the family (EHR: the last, i.e. the current visit;
  notes: the first, i.e. the start of the note), so rows of a cut sample no longer sum to exactly 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl

from medtx.store.db import quote_table


def oracle_exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    """Whether raw.<table> exists (the oracle tables are created when a synthetic cohort is ingested)."""
    return con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'raw' "
                       "AND table_name = ?", [table]).fetchall()[0][0] > 0


def is_synthetic(con: duckdb.DuckDBPyConnection, dataset: str) -> bool:
    """A dataset is synthetic when its name says so or the generator's oracle rows (any task's) exist for it."""
    from medtx.synth.oracle import WRITES as ORACLE_TABLES  # the oracle ingest step's declared lineage

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


def attention_frame(sample_ids: Sequence[Any], attentions: Sequence[dict], max_tokens: int,
                    keep: str = "last") -> pl.DataFrame:
    """Long-form attention rows of the showcase samples; `keep` = "last" or "first" `max_tokens` positions."""
    if keep not in ("last", "first"):
        raise ValueError(f"attention_frame: keep must be 'last' or 'first', got {keep!r}")
    cut = slice(-max_tokens, None) if keep == "last" else slice(0, max_tokens)
    parts = []
    for sample_id, modules in zip(sample_ids, attentions, strict=True):
        for module, (weights, q_tokens, k_tokens) in modules.items():
            w = weights[:, :, cut, cut]
            qt, kt = list(q_tokens)[cut], list(k_tokens)[cut]
            grid = np.indices(w.shape).reshape(4, -1)
            parts.append(pl.DataFrame({
                "sample_id": [str(sample_id)] * grid.shape[1], "module": [module] * grid.shape[1],
                "layer": grid[0].astype(np.int32), "head": grid[1].astype(np.int32),
                "query_pos": grid[2].astype(np.int32), "key_pos": grid[3].astype(np.int32),
                "weight": w.reshape(-1).astype(np.float32),
                "query_token": np.asarray(qt, dtype=object)[grid[2]].astype(str),
                "key_token": np.asarray(kt, dtype=object)[grid[3]].astype(str),
            }))
    return pl.concat(parts) if parts else pl.DataFrame()
