"""Hashes with no warehouse: file bytes, the medtx source that ran (`code_version`), short keys (`text_hash`).
Pure (hashlib), so a training worker records its code version where DuckDB is not installed (medtx.worker)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import medtx

_CHUNK = 1 << 20


def file_sha256(path: Path | str) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks (full MIMIC-III files are GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def code_version(*packages: str) -> str:
    """medtx version + a hash of the source files of the given subpackages (e.g. "ingest", "samples").

    Hashing source, not a git sha, means uncommitted edits count and unrelated commits do not.
    With no packages, the whole `medtx` package is hashed.
    """
    root = Path(medtx.__file__).parent
    targets = [root / p for p in packages] if packages else [root]
    digest = hashlib.sha256()
    for target in targets:
        files = [target.with_suffix(".py")] if not target.exists() else sorted(target.rglob("*.py"))
        for path in files:
            if path.exists():
                digest.update(f"{path.relative_to(root.parent)}:{file_sha256(path)}\n".encode())
    return f"{medtx.__version__}+{digest.hexdigest()[:12]}"


def text_hash(*parts: object) -> str:
    """Short stable hash of a few values (config fragments, keys)."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]
