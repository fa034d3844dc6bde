"""The one guard in front of every file a user names for medtx to write (`medtx report --out`, the exports,
benchmarks/gpu/record.py): nothing a person types can make medtx replace the warehouse or anything it holds.

- `warehouse_paths(settings)`: what an output must never be or contain: the warehouse, its snapshot, their WAL
  files, the writer file, the warehouse's folder and the folders medtx manages (models, exchange, cache, Prefect
  results and home). Files inside the managed folders are theirs too (a card written into `models/` is refused);
  files beside the warehouse (e.g. `reports/`) are the user's.
- `check_output(out, ...)`: the path with symlinks resolved; refused (OutputRefused, one line) when it is or
  contains one of those paths, is a hard link to one of their files (same device and inode, whatever its name),
  is a folder, or exists while `overwrite` is off. Every file a command writes is checked, its companions
  included (the Markdown twin of a card), so a command never replaces a file it did not mean to write.
- `write_output(path, data)`: write beside the target and rename into place, so a hard link elsewhere keeps its
  old content and a failed write leaves no half file.

Standard library only (the torch-only worker may use it).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class OutputRefused(ValueError):
    """A file medtx was asked to write must not be written there; the message names it and why (exit 2)."""


@dataclass(frozen=True)
class Protected:
    """What outputs must stay clear of: `exact` paths (files and folders) an output may not be, contain, or be a
    hard link to; `folders` whose whole content belongs to medtx (an output may not land inside either)."""

    exact: tuple[Path, ...]
    folders: tuple[Path, ...] = ()


def _real(path: Path | str) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def warehouse_paths(settings: object) -> Protected:
    """The warehouse's files and folders from medtx.settings.Settings (see the module docstring)."""
    from medtx.settings import snapshot_path
    from medtx.store.writer_lock import holder_path

    db = Path(settings.db)  # type: ignore[attr-defined]
    snapshot = snapshot_path(db)
    exact = [db, Path(f"{db}.wal"), snapshot, Path(f"{snapshot}.wal"), holder_path(db), db.parent]
    folders = [getattr(settings, name, None) for name in ("models_dir", "exchange_dir", "cache_dir", "results_dir")]
    folders.append(getattr(settings, "prefect_home", None))
    return Protected(tuple(exact), tuple(Path(f) for f in folders if f is not None))


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def check_output(out: Path | str, protected: Protected, *, overwrite: bool, option: str = "--out") -> Path:
    """The real path `out` may be written at, else OutputRefused naming `option` and the reason; nothing is
    touched. See the module docstring for what is refused."""
    shown = f"{option} {out}" if option else str(out)
    target = _real(out)
    for path in (*protected.exact, *protected.folders):
        kept = _real(path)
        if target == kept or kept.is_relative_to(target):
            raise OutputRefused(f"{shown}: is or contains {path}, which medtx must never replace; "
                                "choose a file of its own (e.g. beside the warehouse in reports/)")
    for folder in protected.folders:
        if target.is_relative_to(_real(folder)):
            raise OutputRefused(f"{shown}: lies inside {folder}, a folder medtx manages; choose a file of its own")
    try:
        st = os.stat(target)
    except FileNotFoundError:
        return target
    if not os.path.isfile(target):
        raise OutputRefused(f"{shown}: exists and is not a plain file")
    for path in protected.exact:
        try:
            if _same_file(st, os.stat(path)):
                raise OutputRefused(f"{shown}: is a hard link to {path}, which medtx must never replace")
        except FileNotFoundError:
            continue
    if not overwrite:
        raise OutputRefused(f"{shown}: file exists (pass --overwrite to replace it)")
    return target


def check_outputs(outs: Sequence[Path | str], protected: Protected, *, overwrite: bool,
                  option: str = "--out") -> list[Path]:
    """check_output for every file one command writes (all refused before any is written)."""
    return [check_output(out, protected, overwrite=overwrite, option=option) for out in outs]


def write_output(path: Path, data: str | bytes) -> Path:
    """Write `data` to a temporary file beside `path` and rename it into place (a checked path, check_output)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

