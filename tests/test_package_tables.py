"""A training package's table is verified when it is read, not only when the package is opened: the bytes a table
is parsed from are the bytes whose sha256 is checked against the manifest, so a file rewritten between the open and
the read is refused (one line naming the file) instead of trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medtx.training.integrity import file_digests
from medtx.training.packages import MANIFEST, PackageError, read_training_package


def _package(folder: Path) -> Path:
    """A real training package (the exchange's format): two Parquet tables, a manifest with rows and sha256s."""
    folder.mkdir()
    tables = {"samples.specialty": pa.table({"note_id": [1, 2, 3], "label": ["a", "b", "a"]}),
              "samples.vocab": pa.table({"token": ["a", "b"]})}
    for name, table in tables.items():
        pq.write_table(table, folder / f"{name}.parquet")
    manifest = {"key": "k", "tables": {n: t.num_rows for n, t in tables.items()},
                "scope": {"dataset": "mtsamples", "task": "specialty"}, "files": file_digests(folder)}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_a_table_rewritten_after_the_package_was_opened_is_refused_when_read(tmp_path: Path) -> None:
    package = _package(tmp_path / "pkg")
    _, tables = read_training_package(package)  # every file matches its sha256 here
    assert tables["samples.vocab"].column("token").to_pylist() == ["a", "b"]  # read (and kept) before the rewrite
    target = package / "samples.specialty.parquet"
    pq.write_table(pa.table({"note_id": [7, 8, 9], "label": ["x", "x", "x"]}), target)  # valid, other rows
    with pytest.raises(PackageError) as refused:
        tables["samples.specialty"]
    message = str(refused.value)
    assert str(target) in message and "\n" not in message and "sha256" in message
    assert tables["samples.vocab"].num_rows == 2  # the table read before still holds the verified rows


def test_a_table_cut_after_the_open_is_refused_and_an_intact_one_reads(tmp_path: Path) -> None:
    package = _package(tmp_path / "pkg")
    _, tables = read_training_package(package)
    assert tables["samples.specialty"].column("note_id").to_pylist() == [1, 2, 3]  # intact: read as written
    vocab = package / "samples.vocab.parquet"
    vocab.write_bytes(vocab.read_bytes()[:-10])
    with pytest.raises(PackageError, match="samples.vocab.parquet"):
        tables["samples.vocab"]


def test_the_open_still_checks_every_file_up_front(tmp_path: Path) -> None:
    package = _package(tmp_path / "pkg")
    pq.write_table(pa.table({"token": ["z", "y"]}), package / "samples.vocab.parquet")
    with pytest.raises(PackageError, match="samples.vocab.parquet"):
        read_training_package(package)
