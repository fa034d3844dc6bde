"""Where source files come from: a local path, or an http(s) URL downloaded into a checksummed cache.

Downloads resume from a `.part` file with an HTTP Range request, retry transient failures with backoff,
check the length the server announced, and record the file's SHA-256 (plus ETag / Last-Modified) next to
it. A later fetch re-validates the cache: the file must still hash to the recorded SHA-256, and a
conditional GET (If-None-Match / If-Modified-Since) answered 304 reuses it without downloading.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

from medtx.store.fingerprint import file_sha256

log = logging.getLogger("medtx.ingest")

_CHUNK = 1 << 20  # 1 MiB reads: large enough for throughput, small enough for smooth progress
_RETRYABLE_HTTP = {408, 425, 429, 500, 502, 503, 504}


class SourceNotFound(FileNotFoundError):
    """The source (file or URL) does not exist: 404/410, or no such path."""


class DownloadError(OSError):
    """A download failed after all retries (an I/O error: orchestrators may retry the task)."""


class ChecksumError(ValueError):
    """A downloaded or cached file does not hash to the expected SHA-256."""


@dataclass(frozen=True)
class SourceFile:
    """A source resolved to a local file. `source` is what was asked for (path or URL)."""

    source: str
    path: Path
    sha256: str | None  # None until computed: local files are hashed while they load
    bytes: int


def is_url(source: str | os.PathLike[str]) -> bool:
    return str(source).lower().startswith(("http://", "https://"))


def dataset_name(source: str | os.PathLike[str]) -> str:
    """Default dataset name of a source: the folder name (URL: last path segment), lower-cased, each run
    of characters outside [a-z0-9_] replaced by `_`. A table-file source is named by its folder."""
    text = str(source)
    if is_url(text):
        segments = [s for s in unquote(urlparse(text).path).split("/") if s]
        if segments and re.search(r"\.csv(\.gz)?$", segments[-1], re.I):
            segments = segments[:-1]
        base = segments[-1] if segments else urlparse(text).hostname or "url"
    else:
        path = Path(text).expanduser().resolve()
        base = path.name if path.is_dir() or not path.suffix else path.parent.name
    # Same rule as medtx.pipeline.config.DatasetConfig.key, so CLI and pipeline agree on names.
    name = re.sub(r"[^a-z0-9_]+", "_", base.lower()).strip("_")
    if not name:
        raise ValueError(f"cannot derive a dataset name from {source!r}: pass --dataset")
    return name


def fetch(
    source: str | os.PathLike[str],
    cache_dir: Path,
    *,
    expected_sha256: str | None = None,
    retries: int = 4,
    timeout: float = 60.0,
    backoff: float = 1.0,
    progress: Callable[[int, int | None], None] | None = None,
) -> SourceFile:
    """Resolve a source to a local file. Local paths are used in place (not hashed here); URLs are
    downloaded into `cache_dir/downloads/` (see `download`)."""
    if is_url(source):
        return download(
            str(source), cache_dir, expected_sha256=expected_sha256, retries=retries, timeout=timeout,
            backoff=backoff, progress=progress,
        )
    path = Path(source).expanduser()
    if not path.is_file():
        raise SourceNotFound(f"{path}: no such file")
    return SourceFile(str(source), path, None, path.stat().st_size)


def _cache_paths(url: str, cache_dir: Path) -> tuple[Path, Path, Path]:
    """(final file, partial download, metadata) for a URL; one folder per URL keeps names readable."""
    key = hashlib.sha256(url.encode()).hexdigest()[:16]
    name = Path(unquote(urlparse(url).path)).name or "download"
    folder = cache_dir / "downloads" / key
    return folder / name, folder / f"{name}.part", folder / f"{name}.json"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _valid_cache(final: Path, meta: dict, expected_sha256: str | None) -> bool:
    """The cached file exists and still hashes to what was recorded (and expected, when given)."""
    if not final.is_file() or "sha256" not in meta:
        return False
    actual = file_sha256(final)
    if actual != meta["sha256"]:
        log.warning("cached %s is corrupt (sha256 %s, recorded %s): downloading again", final, actual, meta["sha256"])
        return False
    return expected_sha256 is None or actual == expected_sha256.lower()


def download(
    url: str,
    cache_dir: Path,
    *,
    expected_sha256: str | None = None,
    retries: int = 4,
    timeout: float = 60.0,
    backoff: float = 1.0,
    progress: Callable[[int, int | None], None] | None = None,
) -> SourceFile:
    """Download `url` into the cache (or reuse a validated cached copy) and return it with its SHA-256.

    Raises SourceNotFound (404/410), DownloadError (retries exhausted, other HTTP errors) or
    ChecksumError (content differs from `expected_sha256`).
    """
    final, part, meta_path = _cache_paths(url, cache_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    meta = _read_json(meta_path)
    cached = _valid_cache(final, meta, expected_sha256)
    part_meta_path = part.with_name(part.name + ".json")

    attempt = 0
    while True:
        try:
            if cached:
                revalidated = _revalidate(url, meta, timeout)
                if revalidated:
                    log.info("%s: cached copy is current (%s)", url, final)
                    return SourceFile(url, final, meta["sha256"], final.stat().st_size)
                cached = False  # changed on the server: fall through to a fresh download
            _download_to_part(url, part, part_meta_path, timeout, progress)
            break
        except urllib.error.HTTPError as exc:
            if exc.code in (404, 410):
                raise SourceNotFound(f"{url}: HTTP {exc.code} {exc.reason}") from exc
            if exc.code == 416:  # our Range start is past the end: the .part is stale, start over
                part.unlink(missing_ok=True)
            elif exc.code not in _RETRYABLE_HTTP:
                raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
            error: Exception = exc
        except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError, _Incomplete) as exc:
            error = exc
        attempt += 1
        if attempt > retries:
            if cached:  # server unreachable, but we hold a verified copy: offline use is the point of a cache
                log.warning("%s: unreachable (%s); using the verified cached copy %s", url, error, final)
                return SourceFile(url, final, meta["sha256"], final.stat().st_size)
            raise DownloadError(f"{url}: download failed after {attempt} attempts: {error}") from error
        delay = backoff * 2 ** (attempt - 1)
        log.warning("%s: %s; retry %d/%d in %.1fs", url, error, attempt, retries, delay)
        time.sleep(delay)

    digest = file_sha256(part)
    if expected_sha256 and digest != expected_sha256.lower():
        part.unlink()
        raise ChecksumError(f"{url}: sha256 {digest} does not match the expected {expected_sha256}")
    part_meta = _read_json(part_meta_path)
    os.replace(part, final)
    part_meta_path.unlink(missing_ok=True)
    meta = {
        "url": url,
        "sha256": digest,
        "bytes": final.stat().st_size,
        "etag": part_meta.get("etag"),
        "last_modified": part_meta.get("last_modified"),
        "downloaded_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    log.info("%s: downloaded %d bytes to %s (sha256 %s)", url, meta["bytes"], final, digest)
    return SourceFile(url, final, digest, meta["bytes"])


class _Incomplete(Exception):
    """The connection closed before the announced length arrived (retryable; the .part is kept)."""


def _revalidate(url: str, meta: dict, timeout: float) -> bool:
    """Conditional GET: True when the server answers 304 (or the cache has no validators to send,
    in which case the recorded checksum is all we can go on and the copy is reused)."""
    headers = {}
    if meta.get("etag"):
        headers["If-None-Match"] = meta["etag"]
    if meta.get("last_modified"):
        headers["If-Modified-Since"] = meta["last_modified"]
    if not headers:
        return True
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout):
            return False  # 200: the resource changed
    except urllib.error.HTTPError as exc:
        if exc.code == 304:
            return True
        raise


def _download_to_part(
    url: str,
    part: Path,
    part_meta_path: Path,
    timeout: float,
    progress: Callable[[int, int | None], None] | None,
) -> None:
    """One attempt: continue `part` with a Range request (If-Range guards against a changed file),
    or start it over when the server sends the whole body."""
    offset = part.stat().st_size if part.exists() else 0
    part_meta = _read_json(part_meta_path) if offset else {}
    headers = {}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        validator = part_meta.get("etag") or part_meta.get("last_modified")
        if validator:
            headers["If-Range"] = validator
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
        total = _announced_total(resp, offset)
        if total == -1:
            part.unlink()
            raise _Incomplete(f"server answered Range {offset}- with {resp.headers.get('Content-Range')!r}")
        if resp.status == 206:
            mode = "ab"
            log.info("%s: resuming at byte %d", url, offset)
        else:
            mode, offset = "wb", 0
            part_meta = {"etag": resp.headers.get("ETag"), "last_modified": resp.headers.get("Last-Modified")}
            part_meta_path.write_text(json.dumps(part_meta))
        received = offset
        with open(part, mode) as fh:
            while True:
                try:
                    chunk = resp.read(_CHUNK)
                except http.client.IncompleteRead as exc:
                    fh.write(exc.partial)
                    raise _Incomplete(f"connection closed at byte {received + len(exc.partial)}") from exc
                if not chunk:
                    break
                fh.write(chunk)
                received += len(chunk)
                if progress:
                    progress(received, total)
    if total is not None and received != total:
        raise _Incomplete(f"got {received} of {total} bytes")


def _announced_total(resp: http.client.HTTPResponse, offset: int) -> int | None:
    """Full size of the resource from Content-Range (206) or Content-Length (200)."""
    if resp.status == 206:
        match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", resp.headers.get("Content-Range", ""))
        if not match or int(match[1]) != offset:
            return -1  # a range we did not ask for: the caller starts over
        return None if match[2] == "*" else int(match[2])
    length = resp.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None
