"""URL sources against a real local HTTP server (127.0.0.1): download, cache, checksum, resume, retry."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from medtx.store.db import connect
from medtx.ingest import ChecksumError, DownloadError, SourceNotFound, fetch, ingest_mimic3, ingest_mtsamples
from tests.conftest import DATA

DEMO = DATA / "mimic3_demo"


class FileServer(ThreadingHTTPServer):
    """Serves `files` (path -> bytes) with ETag, conditional GET and Range; `faults` (path -> list of
    'cut' | '503') are consumed one per request to simulate dropped connections and overloaded servers."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, list[str]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FileServer

    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self.server.requests.append((self.path, dict(self.headers)))
        body = self.server.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        fault = (self.server.faults.get(self.path) or [None]).pop(0) if self.server.faults.get(self.path) else None
        if fault == "503":
            self.send_error(503)
            return
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.end_headers()
            return
        start = 0
        rng = self.headers.get("Range")
        if rng and self.headers.get("If-Range", etag) == etag:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:]
        if fault == "cut":  # send half, then drop the connection
            self.wfile.write(payload[: len(payload) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(payload)


@pytest.fixture
def server() -> Iterator[FileServer]:
    srv = FileServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def test_mimic3_from_url_prefix_then_cached(server, tmp_path):
    # Mixed naming as a bucket might have it: upper-case .csv.gz and a lower-case plain .csv; no NOTEEVENTS.
    for name in ("PATIENTS", "ADMISSIONS", "DIAGNOSES_ICD", "PROCEDURES_ICD"):
        server.files[f"/bucket/Synthetic_MIMIC-III/{name}.csv.gz"] = (DEMO / f"{name}.csv.gz").read_bytes()
    import gzip

    server.files["/bucket/Synthetic_MIMIC-III/prescriptions.csv"] = gzip.decompress(
        (DEMO / "PRESCRIPTIONS.csv.gz").read_bytes())
    db, cache = tmp_path / "w.duckdb", tmp_path / "cache"
    prefix = server.url + "/bucket/Synthetic_MIMIC-III/"
    results = ingest_mimic3(db, prefix, cache_dir=cache)
    assert [(r.dataset, r.table, r.rows_loaded, r.status) for r in results] == [
        ("synthetic_mimic_iii", "patients", 100, "loaded"), ("synthetic_mimic_iii", "admissions", 129, "loaded"),
        ("synthetic_mimic_iii", "diagnoses_icd", 1761, "loaded"),
        ("synthetic_mimic_iii", "procedures_icd", 506, "loaded"),
        ("synthetic_mimic_iii", "prescriptions", 10398, "loaded"),
        ("synthetic_mimic_iii", "noteevents", 0, "absent")]
    rx = results[4]
    assert rx.source == prefix + "prescriptions.csv" and Path(rx.file).is_relative_to(cache)
    assert rx.sha256 == hashlib.sha256(server.files["/bucket/Synthetic_MIMIC-III/prescriptions.csv"]).hexdigest()
    # Second run: every cached file is revalidated with a conditional GET (304), nothing downloaded again.
    server.requests.clear()
    ingest_mimic3(db, prefix, cache_dir=cache, tables=["patients", "prescriptions"])
    conditional = [h.get("If-None-Match") for p, h in server.requests if p.endswith((".csv", ".csv.gz"))
                   and p.rsplit("/", 1)[1] in ("PATIENTS.csv.gz", "prescriptions.csv")]
    assert len(conditional) == 2 and all(conditional)
    con = connect(db, read_only=True)
    try:
        assert con.sql("SELECT count(*) FROM raw.prescriptions").fetchall() == [(10398,)]
        assert con.sql("SELECT count(*) FROM raw.ingest_log WHERE table_name = 'prescriptions'").fetchall() == [(2,)]
    finally:
        con.close()


def test_download_resumes_after_dropped_connection_and_retries_503(server, tmp_path):
    body = (DATA / "mtsamples" / "mtsamples.csv.gz").read_bytes()
    server.files["/mt/mtsamples.csv.gz"] = body
    server.faults["/mt/mtsamples.csv.gz"] = ["cut", "503", "cut"]
    got = fetch(server.url + "/mt/mtsamples.csv.gz", tmp_path, backoff=0.01)
    assert got.path.read_bytes() == body and got.sha256 == hashlib.sha256(body).hexdigest()
    ranges = [h.get("Range") for _, h in server.requests]
    # 1st: full GET cut at half; 2nd: Range resume answered 503; 3rd: Range resume cut again; 4th: completes.
    assert ranges[0] is None and ranges[1] == ranges[2] == f"bytes={len(body) // 2}-"
    assert ranges[3] == f"bytes={len(body) // 2 + (len(body) - len(body) // 2) // 2}-"
    meta = json.loads(got.path.with_name(got.path.name + ".json").read_text())
    assert meta["sha256"] == got.sha256 and meta["etag"]
    # The downloaded file ingests like a local one.
    result = ingest_mtsamples(tmp_path / "w.duckdb", server.url + "/mt/mtsamples.csv.gz", tmp_path)
    assert result.rows_loaded == 4999


def test_corrupt_cache_is_downloaded_again_and_checksum_enforced(server, tmp_path):
    server.files["/x/PATIENTS.csv"] = b"subject_id,gender,dob\n1,F,2100-01-01\n"
    url = server.url + "/x/PATIENTS.csv"
    first = fetch(url, tmp_path)
    first.path.write_bytes(b"tampered")  # the cached file no longer hashes to its recorded sha256
    again = fetch(url, tmp_path)
    assert again.path.read_bytes() == server.files["/x/PATIENTS.csv"]
    with pytest.raises(ChecksumError, match="does not match"):
        fetch(url, tmp_path / "other", expected_sha256="0" * 64)


def test_missing_url_and_exhausted_retries(server, tmp_path):
    with pytest.raises(SourceNotFound, match="404"):
        fetch(server.url + "/nope.csv", tmp_path)
    server.files["/busy.csv"] = b"a\n1\n"
    server.faults["/busy.csv"] = ["503"] * 3
    with pytest.raises(DownloadError, match="after 3 attempts"):
        fetch(server.url + "/busy.csv", tmp_path, retries=2, backoff=0.01)
