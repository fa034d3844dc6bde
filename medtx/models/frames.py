"""Sample frames as the training path reads them: Arrow tables (pyarrow), nothing else.

Why Arrow: a training runs where only torch, numpy, pyarrow, scikit-learn and transformers are installed (a GPU
machine, `python -m medtx.worker`): the rows a run trains on come from Parquet files or from DuckDB's `.arrow()`,
and the training path never imports polars. A polars DataFrame (tests, notebooks) is accepted and converted
through its own `to_arrow()`, so this module does not import polars either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Frame = pa.Table


def arrow(frame: Any) -> pa.Table:
    """`frame` as a pyarrow Table (a polars DataFrame through its `to_arrow()`; chunks combined)."""
    if isinstance(frame, pa.Table):
        return frame
    if hasattr(frame, "to_arrow"):
        return frame.to_arrow()
    raise TypeError(f"expected a pyarrow Table (or a frame with to_arrow()), got {type(frame).__name__}")


def columns(frame: Any) -> list[str]:
    return list(arrow(frame).column_names)


def values(frame: Any, column: str) -> list:
    """One column as Python values (nested lists stay lists; nulls are None)."""
    return arrow(frame).column(column).to_pylist()


def numbers(frame: Any, column: str) -> np.ndarray:
    """One primitive column as a numpy array (a null makes the array float/object, as numpy would)."""
    col = arrow(frame).column(column)
    return col.to_numpy() if col.num_chunks != 1 else col.chunk(0).to_numpy(zero_copy_only=False)


def rows(frame: Any, needed: Sequence[str]) -> list[dict]:
    """Row dicts of the `needed` columns, in frame order."""
    return arrow(frame).select(list(needed)).to_pylist()


def where(frame: Any, column: str, value: Any) -> pa.Table:
    """The rows whose `column` equals `value` (nulls never match)."""
    table = arrow(frame)
    return table.filter(pc.fill_null(pc.equal(table.column(column), pa.scalar(value)), False))


def height(frame: Any) -> int:
    return arrow(frame).num_rows
