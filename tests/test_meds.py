"""MEDS export and import (issue 17): round trip on the bundled demo, the meds package's own schemas,
a foreign (MIMIC-IV-style, ICD-10) dataset, and the rules a malformed dataset breaks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import meds
import polars as pl
import pyarrow.parquet as pq
import pytest

from medtx.codes import map_codes
from medtx.db import connect
from medtx.meds import ExportError, MedsFormatError, export_meds, ingest_meds
from medtx.samples import build_samples
from tests.conftest import DATA
from tests.fixtures_samples import DEMO, demo_db  # noqa: F401  (session fixture)

COPY = "demo_meds"
EHR = ("drug_rec", "next_visit", "readmission")


@pytest.fixture(scope="module")
def round_trip(demo_db, tmp_path_factory):  # noqa: F811
    """Demo -> MEDS (small shards) -> `ingest meds` as a second dataset -> map-codes -> build-samples."""
    root = tmp_path_factory.mktemp("meds")
    db = root / "warehouse.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        result = export_meds(con, DEMO, root / "export", shard_rows=3000, labels=["readmission"])
    finally:
        con.close()
    imported = ingest_meds(db, result.out, COPY)
    con = connect(db)
    try:
        map_codes(con, DATA, [COPY], reload_reference=False)
        build_samples(con, DATA, list(EHR), [COPY])
    finally:
        con.close()
    return db, result, imported


def _rows(con, sql: str, dataset: str) -> list[tuple]:
    return sorted(con.execute(sql, {"d": dataset}).fetchall(), key=repr)


@pytest.mark.parametrize("table", EHR)
def test_round_trip_gives_identical_samples_and_splits(round_trip, table):
    db, _, _ = round_trip
    con = connect(db, read_only=True)
    try:
        sql = f"SELECT * EXCLUDE (dataset) FROM samples.{table} WHERE dataset = $d"
        original, copy = _rows(con, sql, DEMO), _rows(con, sql, COPY)
        assert len(original) > 0
        assert copy == original
        splits = "SELECT subject_id, split FROM samples.splits WHERE dataset = $d AND task = '" + table + "'"
        assert _rows(con, splits, COPY) == _rows(con, splits, DEMO)
        vocab = "SELECT feature, token, idx, count FROM samples.vocab WHERE dataset = $d AND task = '" + table + "'"
        assert _rows(con, vocab, COPY) == _rows(con, vocab, DEMO)
    finally:
        con.close()


def test_export_validates_against_the_meds_schemas(round_trip):
    _, result, _ = round_trip
    assert len(result.shards) > 1, "small shard_rows must give several shards"
    seen: dict[int, str] = {}
    for name in result.shards:
        table = pq.read_table(result.out / name)
        meds.DataSchema.validate(table)
        frame = pl.read_parquet(result.out / name)
        for sid in frame["subject_id"].unique():
            assert sid not in seen, f"subject {sid} in {seen.get(sid)} and {name}"
            seen[sid] = name
        # contiguous per subject, sorted by time with static events first
        runs = (frame["subject_id"] != frame["subject_id"].shift(1)).fill_null(True).sum()
        assert runs == frame["subject_id"].n_unique()
        key = frame.select("subject_id", pl.col("time").is_not_null().alias("timed"), "time")
        assert key.equals(key.sort("subject_id", "timed", "time", nulls_last=False, maintain_order=True))
    assert len(seen) == result.subjects == 100
    codes = pq.read_table(result.out / meds.code_metadata_filepath)
    meds.CodeMetadataSchema.validate(codes)
    codes = pl.from_arrow(codes)
    used = set(pl.concat([pl.read_parquet(result.out / s) for s in result.shards])["code"].unique())
    assert used <= set(codes["code"])
    assert codes.filter(pl.col("code") == "DIAGNOSIS//ICD//9//4019")["description"].item() == "Unspecified essential hypertension"
    ndc = codes.filter(pl.col("code").str.starts_with("MEDICATION//NDC//") & pl.col("parent_codes").is_not_null())
    assert ndc.height > 100
    atc3 = ndc["parent_codes"][0][0]
    parent = codes.filter(pl.col("code") == atc3)["parent_codes"].item()
    assert parent.to_list() == [atc3[:-1]]  # ATC-3 -> ATC-2
    splits = pq.read_table(result.out / meds.subject_splits_filepath)
    meds.SubjectSplitSchema.validate(splits)
    assert set(splits.column("split").to_pylist()) == {"train", "tuning", "held_out"}
    assert splits.num_rows == 100
    labels = pq.read_table(result.out / "labels" / "readmission.parquet")
    meds.LabelSchema.validate(labels)
    assert labels.num_rows == result.labels["readmission"] > 0
    meta = json.loads((result.out / meds.dataset_metadata_filepath).read_text())
    meds.DatasetMetadataSchema.validate(meta)
    assert meta["etl_name"] == "medtx" and meta["meds_version"] == "0.4.1"


def test_import_logs_mapped_and_unmapped_codes(round_trip):
    db, result, imported = round_trip
    assert imported.events == imported.events_mapped == result.events
    con = connect(db, read_only=True)
    try:
        log = dict(con.execute("SELECT table_name, rows_loaded FROM raw.ingest_log WHERE dataset = ?",
                               [COPY]).fetchall())
        assert log["admissions"] == 129 and log["meds_events"] == result.events
        prefixes = dict(con.execute("SELECT prefix, n_rows FROM raw.meds_codes WHERE dataset = ?", [COPY]).fetchall())
        assert prefixes["DIAGNOSIS//ICD//9//"] == con.execute(
            "SELECT count(*) FROM raw.diagnoses_icd WHERE dataset = ?", [DEMO]).fetchall()[0][0]
    finally:
        con.close()
