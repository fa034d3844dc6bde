"""Free space before a long run: `medtx pipeline` refuses to start on a (nearly) full disk.

Why: a full disk mid-run fails in every layer at once (the temporary Prefect server's sqlite database, the log
file, DuckDB's WAL, checkpoints), and Prefect's server then times out after 90 s with pages of tracebacks. A
check of the folders the run writes, before any server starts, turns the common case into one line. A disk
that fills during the run is still caught where the write fails (the CLI's one-line resource errors).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

MIN_FREE_ENV = "MEDTX_MIN_FREE_MB"
DEFAULT_MIN_FREE_MB = 100.0


def min_free_mb() -> float:
    """MEDTX_MIN_FREE_MB (default 100): the free space a pipeline run asks for on each folder it writes."""
    raw = os.environ.get(MIN_FREE_ENV)
    if raw is None:
        return DEFAULT_MIN_FREE_MB
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{MIN_FREE_ENV}={raw!r}: not a size; allowed: a finite number of megabytes >= 0 "
                         f"(default {DEFAULT_MIN_FREE_MB:g})")
    return value


def _existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space_problem(folders: Iterable[Path], needed_mb: float | None = None) -> str | None:
    """One line naming the first folder (or its nearest existing parent) with less than `needed_mb` free."""
    needed = min_free_mb() if needed_mb is None else needed_mb
    for folder in dict.fromkeys(_existing(Path(f)) for f in folders):
        free = shutil.disk_usage(folder).free / 1e6
        if free < needed:
            return (f"no space left on {folder}: {free:.1f} MB free; a pipeline run needs at least {needed:g} MB "
                    f"there (free some space, or set {MIN_FREE_ENV})")
    return None
