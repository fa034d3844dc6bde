"""The record scan's blank-line count (medtx.ingest.records.scan_records) against a plain count, whatever the chunk
borders: the scan only runs its regex on chunks holding '\\n\\n' or '\\n\\r\\n', so a blank line split across two
chunks, CRLF blank lines and runs of blank lines must still be counted."""

from __future__ import annotations

import gzip

import pytest

from medtx.ingest import records
from medtx.ingest.records import scan_records


def plain_blank_count(data: bytes) -> int:
    """Lines holding nothing or only '\\r' that end with '\\n' (what DuckDB skips), the slow obvious way."""
    lines = data.split(b"\n")[:-1]  # the part after the last '\n' has no line end
    return sum(1 for line in lines if line in (b"", b"\r"))


CASES = {
    "none": b"a,b\n1,2\n3,4\n",
    "lf": b"a,b\n1,2\n\n3,4\n",
    "crlf": b"a,b\r\n1,2\r\n\r\n3,4\r\n",
    "run": b"a,b\n1,2\n\n\n\n3,4\n\n",
    "leading": b"\na,b\n1,2\n",
    "crlf_run": b"a,b\r\n\r\n\r\n1,2\r\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 22])
def test_blank_lines_counted_across_chunk_borders(tmp_path, monkeypatch, name, chunk):
    monkeypatch.setattr(records, "_CHUNK", chunk)
    data = CASES[name]
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(data))
    scan = scan_records(path, "gzip")
    assert scan.blank_lines == plain_blank_count(data)
    assert scan.lines == data.count(b"\n")


def test_a_large_file_without_blank_lines_has_none_and_one_with_them_counts_each(tmp_path):
    body = b"".join(b"%d,x,y\n" % i for i in range(200_000))
    path = tmp_path / "big.csv"
    path.write_bytes(b"a,b,c\n" + body)
    assert scan_records(path, "none").blank_lines == 0
    path.write_bytes(b"a,b,c\n" + body + b"\n\r\n" + body)
    assert scan_records(path, "none").blank_lines == 2


def test_the_scan_reads_gzip_like_the_gzip_module_and_refuses_a_broken_stream(tmp_path):
    """The scan decompresses with ISA-L (medtx.ingest.records._open): the same lines, size and hash as the gzip module
    on a whole file, and on a broken deflate stream (one byte flipped: 'Invalid deflate symbol') an error the ingest
    turns into its one line (staging catches records.GZIP_ERRORS), not a short, silent count."""
    import hashlib
    import random

    data = b"row,drug,dose\n" + b"".join(b"%d,DRUG %d,%d\n" % (i, i * 7 % 13, i * 31) for i in range(20000))
    whole = tmp_path / "whole.csv.gz"
    whole.write_bytes(gzip.compress(data))
    scan = scan_records(whole, "gzip", sha256=True)
    assert (scan.lines, scan.size, scan.sha256) == (data.count(b"\n"), len(data), hashlib.sha256(data).hexdigest())
    broken = bytearray(whole.read_bytes())
    broken[random.Random(11).randrange(20, len(broken) // 2)] ^= 0xFF  # seed 11: a symbol error, not a CRC one
    bad = tmp_path / "broken.csv.gz"
    bad.write_bytes(bytes(broken))
    with pytest.raises(records.GZIP_ERRORS) as caught:
        scan_records(bad, "gzip")
    assert "deflate" in str(caught.value).lower() or "crc" in str(caught.value).lower()
