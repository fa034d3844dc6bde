"""The exchange folder is untrusted input: a package's manifest lists the content hash of every file in it, and
whoever uses a package (the flow reusing a training package, a worker reading one, the flow recording a result)
checks them first. Standard library only, so the torch-only worker (medtx.worker) can check too.

- `file_digests(folder)`: {relative path: {"sha256", "bytes"}} of every regular file but the manifest; a symlink
  or anything that is not a plain file or folder is refused (a package is data, it points nowhere).
- `verify(folder, manifest)`: the folder holds exactly those files with those hashes, else `PackageDamaged`
  naming the first file that differs (missing, extra, other size, other content) — one line.
- `content_digest(folder)`: a training package's identity from its own bytes, which the flow records when it hands
  the package out and a worker and the recorder compare against (authentication against the warehouse, not
  against the folder: a rewritten table with a recomputed manifest hash no longer matches).
- `safe_name(name, what)`: a run id or folder name that stays inside the folder it names a child of (`../../x`,
  `a/b`, `.`, an empty or hidden name are refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_CHUNK = 1 << 20
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+=-]{0,199}$")


class PackageDamaged(ValueError):
    """A package in the exchange folder is not what its manifest says; the message names the file."""


def sha256_bytes(data: bytes) -> str:
    """The sha256 of bytes already in memory (a file read once, then parsed from the same buffer)."""
    return hashlib.sha256(data).hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(folder: Path | str) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under `folder` (relative POSIX paths, sorted), the manifest excepted."""
    folder = Path(folder)
    out: dict[str, dict[str, Any]] = {}
    for root, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                raise PackageDamaged(f"{path}: a symlink inside a package (a package holds plain files only)")
            if name in files and not path.is_file():
                raise PackageDamaged(f"{path}: not a plain file (a package holds plain files only)")
            if name in files and rel != MANIFEST:
                out[rel] = {"sha256": sha256_of(path), "bytes": path.stat().st_size}
    return dict(sorted(out.items()))


def verify(folder: Path | str, manifest: Mapping[str, Any]) -> None:
    """PackageDamaged unless `folder` holds exactly the files the manifest lists, byte for byte."""
    folder = Path(folder)
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise PackageDamaged(f"{folder / MANIFEST}: no content hashes ('files'); the package cannot be checked")
    actual = file_digests(folder)
    for rel, want in listed.items():
        got = actual.get(rel)
        if got is None:
            raise PackageDamaged(f"{folder}: the manifest lists {rel} but {rel} is missing")
        if not isinstance(want, dict) or got["bytes"] != want.get("bytes"):
            raise PackageDamaged(f"{folder / rel}: {got['bytes']:,} bytes, the manifest says "
                                 f"{want.get('bytes') if isinstance(want, dict) else want!r} (cut or rewritten)")
        if got["sha256"] != want.get("sha256"):
            raise PackageDamaged(f"{folder / rel}: content differs from the manifest's sha256 (rewritten)")
    extra = sorted(set(actual) - set(listed))
    if extra:
        raise PackageDamaged(f"{folder / extra[0]}: not listed in the manifest ({len(extra)} unlisted file(s))")


def read_manifest(folder: Path | str) -> dict[str, Any]:
    """The package's manifest as a JSON object, else PackageDamaged (missing, not JSON, not an object)."""
    path = Path(folder) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PackageDamaged(f"{path}: missing (a package without a manifest is unfinished or damaged)") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise PackageDamaged(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise PackageDamaged(f"{path}: holds {type(data).__name__} JSON, not an object")
    return data


def check_package(folder: Path | str) -> dict[str, Any]:
    """The manifest of a package whose files all match it (read_manifest + verify)."""
    manifest = read_manifest(folder)
    verify(folder, manifest)
    return manifest


def safe_name(name: object, what: str) -> str:
    """`name` when it is a plain, non-hidden file name (letters, digits, . _ : + = -), else PackageDamaged."""
    if not isinstance(name, str) or not _SAFE.match(name):
        raise PackageDamaged(f"unsafe {what} {name!r}: a name must be letters, digits and . _ : + = - only "
                             "(no '/', no '..', not hidden)")
    return name



def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The identity of a training package from a manifest already checked against its folder (`verify`: every
    listed sha256 is the file's own): the sha256 of its files' hashes and of its `tables` and `scope` (what a
    worker trains on and how it reads it). Never trusted on its own: see `content_digest`."""
    body = {"files": {rel: d.get("sha256") for rel, d in sorted(manifest.get("files", {}).items())},
            "tables": manifest.get("tables"), "scope": manifest.get("scope")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def content_digest(folder: Path | str) -> str:
    """A training package's identity, computed from its files (each hashed here), never from what its manifest
    claims. The flow records it when it hands a package out (ml.dispatches); a worker given it out of band (its
    command line) and the flow recording a result compare against that record, so a table rewritten with its
    manifest hash recomputed no longer matches. PackageDamaged for a folder that is not an intact package."""
    return manifest_digest(check_package(folder))
