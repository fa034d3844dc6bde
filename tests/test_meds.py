"""MEDS export and import (issue 17): round trip on the bundled demo, the meds package's own schemas,
a foreign (MIMIC-IV-style, ICD-10) dataset, and the rules a malformed dataset breaks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import meds
import polars as pl
import pyarrow.parquet as pq
import pytest

from medtx.codes import map_codes
from medtx.store.db import connect
from medtx.meds import ExportError, MedsFormatError, export_meds, ingest_meds
from medtx.tasks.build import build_samples
from medtx.tasks import get_task
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
        result = export_meds(con, DEMO, root / "export", shard_rows=3000, labels=["readmission", "mortality"])
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
    # data/<split>/<k>.parquet: each subject's shard sits in the folder of its MEDS split
    given = dict(pl.read_parquet(result.out / meds.subject_splits_filepath).iter_rows())
    assert all(name.split("/")[1] == given[sid] for sid, name in seen.items())
    assert {name.split("/")[1] for name in result.shards} == {"train", "tuning", "held_out"}
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
    # labels/<task>/<split>/<k>.parquet: one folder per task, each label in the shard named like its subject's
    label_files = {t: sorted((result.out / "labels" / t).rglob("*.parquet")) for t in ("readmission", "mortality")}
    for task, files in label_files.items():
        for path in files:
            meds.LabelSchema.validate(pq.read_table(path))
            shard = path.relative_to(result.out / "labels" / task).as_posix()
            assert {seen[s] for s in pl.read_parquet(path)["subject_id"]} == {f"data/{shard}"}
    labels = pl.concat([pl.read_parquet(f) for f in label_files["readmission"]])
    assert labels.height == result.labels["readmission"] > 0
    mortality = pl.concat([pl.read_parquet(f) for f in label_files["mortality"]])  # a registry task, no label code
    with duckdb.connect(str(round_trip[0]), read_only=True) as con:
        assert mortality.height == con.sql("SELECT count(*) FROM samples.admission_outcome WHERE task = "
                                           "'mortality' AND dataset = 'mimic3_demo'").fetchall()[0][0] > 0
    meta = json.loads((result.out / meds.dataset_metadata_filepath).read_text())
    meds.DatasetMetadataSchema.validate(meta)
    assert meta["etl_name"] == "medtx" and meta["meds_version"] == "0.4.1"


def test_import_logs_mapped_and_unmapped_codes(round_trip):
    db, result, imported = round_trip
    # every event is read and mapped; the age measurements (one per admission, derived from the birth, which is
    # loaded) have their own rule: derived, not loaded
    assert imported.events == result.events and imported.events == imported.events_mapped
    con = connect(db, read_only=True)
    try:
        log = dict(con.execute("SELECT table_name, rows_loaded FROM raw.ingest_log WHERE dataset = ?",
                               [COPY]).fetchall())
        assert log["admissions"] == 129 and log["meds_events"] == result.events
        prefixes = {p: (t, n) for p, t, n in con.execute(
            "SELECT prefix, target_table, n_rows FROM raw.meds_codes WHERE dataset = ?", [COPY]).fetchall()}
        assert prefixes["MEDTX//AGE_AT_ADMISSION"] == ("derived (not loaded)", 129) and "AGE" not in prefixes
        assert prefixes["DIAGNOSIS//ICD//9//"][1] == con.execute(
            "SELECT count(*) FROM raw.diagnoses_icd WHERE dataset = ?", [DEMO]).fetchall()[0][0]
    finally:
        con.close()


# ---- a MEDS dataset medtx did not write: MIMIC-IV MEDS ETL codes, ICD-10, no hadm_id column ------------------

DRUGS = ["Metoprolol", "Furosemide", "Heparin", "Pantoprazole", "Lisinopril", "Simvastatin", "Ondansetron"]
DX10 = ["I10", "E119", "J189", "N179", "K219", "F329", "I4891", "E785"]
HF = "I509"  # heart failure: planted cause of 30-day readmission


def _foreign_events(n_subjects: int, seed: int = 0) -> pl.DataFrame:
    """MIMIC-IV-MEDS-style events: births, deaths, stays with ICD-10 diagnoses/procedures at discharge,
    medications by name, labs (which medtx does not map). Readmission within 30 days iff the stay had HF."""
    import numpy as np
    from datetime import datetime, timedelta

    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n_subjects):
        sid = 10_000 + s
        birth = datetime(1950, 1, 1) + timedelta(days=int(rng.integers(0, 15_000)))
        rows += [(sid, None, f"GENDER//{'F' if s % 2 else 'M'}", None), (sid, birth, "MEDS_BIRTH", None)]
        t = datetime(2150, 1, 1) + timedelta(days=int(rng.integers(0, 300)), hours=int(rng.integers(0, 24)))
        for _ in range(int(rng.integers(2, 5))):
            disch = t + timedelta(days=int(rng.integers(2, 9)), hours=3)
            hf = rng.random() < 0.4
            rows.append((sid, t, "HOSPITAL_ADMISSION//EW EMER.//EMERGENCY ROOM", None))
            rows.append((sid, t + timedelta(hours=2), "LAB//50912//mg/dL", float(rng.normal(1, 0.2))))
            for drug in rng.choice(DRUGS, size=3, replace=False):
                rows.append((sid, t + timedelta(hours=4), f"MEDICATION//START//{drug}", None))
            codes = list(rng.choice(DX10, size=3, replace=False)) + ([HF] if hf else [])
            rows += [(sid, disch, f"DIAGNOSIS//ICD//10//{c}", None) for c in codes]
            rows.append((sid, disch, "PROCEDURE//ICD//10//02HV33Z", None))
            rows.append((sid, disch, "HOSPITAL_DISCHARGE//HOME", None))
            t = disch + timedelta(days=int(rng.integers(5, 25)) if hf else int(rng.integers(60, 200)))
    frame = pl.DataFrame(rows, schema={"subject_id": pl.Int64, "time": pl.Datetime("us"), "code": pl.String,
                                       "numeric_value": pl.Float32}, orient="row")
    return frame.sort("subject_id", pl.col("time"), nulls_last=False, maintain_order=True)


def _write_foreign(root: Path, n_subjects: int = 240) -> Path:
    """Written with meds-testing-helpers' MEDSDataset (which validates it against the meds schemas)."""
    from meds import DatasetMetadataSchema
    from meds_testing_helpers.dataset import MEDSDataset

    events = _foreign_events(n_subjects)
    subjects = events["subject_id"].unique().sort()
    cycle = ["train"] * 7 + ["tuning", "held_out", "held_out"]
    splits = pl.DataFrame({"subject_id": subjects, "split": [cycle[i % 10] for i in range(len(subjects))]})
    shards = {}
    for name in ("train", "tuning", "held_out"):
        ids = splits.filter(pl.col("split") == name)["subject_id"]
        half = len(ids) // 2
        for k, part in enumerate((ids[:half], ids[half:])):
            shards[f"{name}/{k}"] = events.filter(pl.col("subject_id").is_in(part.implode()))
    dataset = MEDSDataset(data_shards=shards, subject_splits=splits,
                          dataset_metadata=DatasetMetadataSchema(dataset_name="MIMIC-IV-style test",
                                                                 etl_name="MIMIC_IV_MEDS", etl_version="0.0.7"))
    dataset.write(root)
    return root


def test_import_of_a_foreign_meds_dataset_trains_logreg(tmp_path):
    from medtx.pipeline.steps import train_in_process

    source = _write_foreign(tmp_path / "mimic4_style")
    db = tmp_path / "warehouse.duckdb"
    result = ingest_meds(db, source, "mimic4_style")
    assert result.mapping == "mimic4"
    con = connect(db)
    try:
        # labs have no medtx table: counted as not mapped, by prefix, never silently dropped
        unmapped = con.execute("SELECT prefix, n_rows FROM raw.meds_codes WHERE dataset = 'mimic4_style' "
                               "AND target_table IS NULL").fetchall()
        assert unmapped == [("LAB//", result.events - result.events_mapped)] and unmapped[0][1] > 0
        logged = con.execute("SELECT rows_loaded, rows_rejected FROM raw.ingest_log "
                             "WHERE dataset = 'mimic4_style' AND table_name = 'meds_events'").fetchall()
        assert logged == [(result.events_mapped, unmapped[0][1])]
        # stays from the admission/discharge events (no hadm_id column): every diagnosis found its stay
        assert con.sql("SELECT count(*) FROM raw.diagnoses_icd WHERE dataset = 'mimic4_style' "
                       "AND hadm_id IS NULL").fetchall()[0][0] == 0
        assert con.sql("SELECT count(*) FROM raw.diagnoses_icd WHERE dataset = 'mimic4_style' "
                       "AND icd9_code = 'I509'").fetchall()[0][0] > 0
        map_codes(con, DATA, ["mimic4_style"])
        counts = build_samples(con, DATA, ["next_visit", "readmission"], ["mimic4_style"])
        assert counts[("readmission", "mimic4_style")] > 300 and counts[("next_visit", "mimic4_style")] > 300
        # medications by name only: loaded, but medtx's ATC-3 mapping needs an NDC, so drug_rec has no labels
        assert con.sql("SELECT count(*) FROM raw.prescriptions WHERE dataset = 'mimic4_style' AND ndc IS NULL "
                       "AND drug = 'Heparin'").fetchall()[0][0] > 0
        # the builders used the dataset's own MEDS splits (tuning -> val, held_out -> test)
        given = {r["subject_id"]: r["split"]
                 for r in pq.read_table(source / "metadata" / "subject_splits.parquet").to_pylist()}
        used = dict(con.sql("SELECT subject_id, split FROM samples.splits WHERE dataset = 'mimic4_style' "
                            "AND task = 'readmission'").fetchall())
        assert used and all({"train": "train", "tuning": "val", "held_out": "test"}[given[s]] == v
                            for s, v in used.items())
    finally:
        con.close()
    run_id = train_in_process(db, get_task("readmission"), "logreg", 0, dataset="mimic4_style")
    con = connect(db, read_only=True)
    try:
        status = con.execute("SELECT status FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
        auroc = con.execute("SELECT value FROM ml.metrics WHERE run_id = ? AND metric = 'auroc' AND split = 'test'",
                            [run_id]).fetchall()
    finally:
        con.close()
    assert status == "completed"
    assert auroc and auroc[0][0] > 0.8, auroc  # the planted heart-failure rule is learnt from ICD-10 codes


# ---- malformed datasets: one line naming the file and the rule, warehouse unchanged ---------------------------

def _warehouse_state(db: Path) -> list[tuple]:
    con = connect(db, read_only=True)
    try:
        out = []
        for t in ("patients", "admissions", "diagnoses_icd", "prescriptions", "meds_splits", "meds_codes",
                  "ingest_log"):
            out += con.sql(f"SELECT '{t}', dataset, count(*) FROM raw.{t} GROUP BY ALL ORDER BY ALL").fetchall()
        return out
    finally:
        con.close()


def _rewrite(path: Path, edit) -> None:
    frame = edit(pl.read_parquet(path))
    frame.write_parquet(path)


def _tamper_type(root: Path) -> None:
    _rewrite(root / "data" / "train" / "0.parquet", lambda f: f.with_columns(pl.col("subject_id").cast(pl.String)))


def _tamper_split_subject(root: Path) -> None:
    moved = pl.read_parquet(root / "data" / "train" / "1.parquet").head(1)
    _rewrite(root / "data" / "train" / "0.parquet", lambda f: pl.concat([f, moved]))


def _tamper_unsorted(root: Path) -> None:
    def swap(f: pl.DataFrame) -> pl.DataFrame:
        timed = f.with_row_index("i").filter(pl.col("time").is_not_null())
        first = timed.row(0, named=True)
        later = timed.filter((pl.col("subject_id") == first["subject_id"]) & (pl.col("time") > first["time"])).row(
            0, named=True)
        order = list(range(f.height))
        order[first["i"]], order[later["i"]] = later["i"], first["i"]
        return f[order]
    _rewrite(root / "data" / "train" / "0.parquet", swap)


def _tamper_not_contiguous(root: Path) -> None:
    _rewrite(root / "data" / "train" / "0.parquet", lambda f: pl.concat([f.slice(1), f.head(1)]))


MALFORMED = {
    "wrong column type": (_tamper_type, r"0\.parquet: column 'subject_id' is (large_)?string, MEDS needs int64 \(rule: column types\)"),
    "subject in two shards": (_tamper_split_subject, r"data/train/1\.parquet: subject \d+ also appears in .*data/train/0\.parquet \(rule: each subject sits in exactly one shard\)"),
    "unsorted times": (_tamper_unsorted, r"0\.parquet: row \d+ \(subject \d+\) breaks the rule: a subject's events are sorted by time"),
    "not contiguous": (_tamper_not_contiguous, r"0\.parquet: row \d+ \(subject \d+\) breaks the rule: a subject's events are contiguous"),
    "extra column of the wrong type": (
        lambda root: _rewrite(root / "data" / "train" / "0.parquet",
                              lambda f: f.with_columns(pl.col("hadm_id").cast(pl.String) + pl.lit("x"))),
        r"data/train/0\.parquet: cannot read the shard \(.*hadm_id\) \(rule: column types\)"),
    "missing metadata": (lambda root: (root / "metadata" / "codes.parquet").unlink(),
                         r"codes\.parquet: missing \(rule: a MEDS dataset has metadata/dataset\.json and metadata/codes\.parquet\)"),
    "split named oddly": (lambda root: _rewrite(root / "metadata" / "subject_splits.parquet",
                                                lambda f: f.with_columns(pl.lit("dev").alias("split"))),
                          r"subject_splits\.parquet: split value\(s\) \['dev'\] are not train/tuning/held_out"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_dataset_fails_naming_file_and_rule_and_changes_nothing(round_trip, tmp_path, case):
    db0, result, _ = round_trip
    db = tmp_path / "warehouse.duckdb"
    shutil.copy(db0, db)
    source = tmp_path / "bad"
    shutil.copytree(result.out, source)
    tamper, message = MALFORMED[case]
    tamper(source)
    before = _warehouse_state(db)
    with pytest.raises(MedsFormatError, match=message):
        ingest_meds(db, source, COPY)  # COPY exists already: a failed re-ingest must keep it as it was
    assert _warehouse_state(db) == before


def test_failure_inside_the_write_transaction_rolls_everything_back(round_trip, tmp_path):
    """A split file giving one subject two splits is only found while writing: the raw tables already
    rewritten in that transaction must come back."""
    db0, result, _ = round_trip
    db = tmp_path / "warehouse.duckdb"
    shutil.copy(db0, db)
    source = tmp_path / "bad"
    shutil.copytree(result.out, source)
    _rewrite(source / "metadata" / "subject_splits.parquet",
             lambda f: pl.concat([f, f.head(1).with_columns(
                 pl.when(pl.col("split") == "train").then(pl.lit("tuning")).otherwise(pl.lit("train")).alias("split"))]))
    _rewrite(source / "data" / "train" / "0.parquet", lambda f: f.filter(~pl.col("code").str.starts_with("DIAGNOSIS")))
    before = _warehouse_state(db)
    with pytest.raises(MedsFormatError, match=r"subject_splits\.parquet: subject \d+ has more than one split"):
        ingest_meds(db, source, COPY)
    assert _warehouse_state(db) == before


def test_export_refuses_a_non_empty_folder_and_an_unknown_dataset(round_trip, tmp_path):
    db, result, _ = round_trip
    con = connect(db)
    try:
        with pytest.raises(ExportError, match="not empty"):
            export_meds(con, DEMO, result.out)
        with pytest.raises(ExportError, match="'nope' has no rows in raw.admissions"):
            export_meds(con, "nope", tmp_path / "x")
        with pytest.raises(ExportError, match="no label export for task"):
            export_meds(con, DEMO, tmp_path / "y", labels=["drug_rec"])
        assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
        assert not list(tmp_path.glob(".*"))  # no temporary folder left behind
    finally:
        con.close()


def test_round_trip_of_a_synthetic_cohort_keeps_discharge_notes(tmp_path):
    """The demo has no notes: a small synthetic cohort with discharge summaries checks the note events
    (text_value) and every EHR task again, readmission's text included."""
    from medtx.ingest import ingest_mimic3
    from medtx.synth import generate_mimic3

    generate_mimic3(tmp_path / "synth", n_patients=80, seed=3, notes=True)
    db = tmp_path / "warehouse.duckdb"
    ingest_mimic3(db, tmp_path / "synth", "synth_notes", tmp_path / "cache")
    con = connect(db)
    try:
        map_codes(con, DATA, ["synth_notes"])
        build_samples(con, DATA, list(EHR), ["synth_notes"])
        export_meds(con, "synth_notes", tmp_path / "meds")
    finally:
        con.close()
    notes = pl.read_parquet(tmp_path / "meds" / "data" / "**" / "*.parquet").filter(pl.col("code") == "NOTE//DISCHARGE_SUMMARY")
    assert notes.height > 50 and notes["text_value"].null_count() == 0
    ingest_meds(db, tmp_path / "meds", "synth_notes_meds")
    con = connect(db)
    try:
        map_codes(con, DATA, ["synth_notes_meds"], reload_reference=False)
        build_samples(con, DATA, list(EHR), ["synth_notes_meds"])
        for table in EHR:
            sql = f"SELECT * EXCLUDE (dataset) FROM samples.{table} WHERE dataset = $d"
            original = _rows(con, sql, "synth_notes")
            assert original and _rows(con, sql, "synth_notes_meds") == original, table
        with_text = con.sql("SELECT count(text) FROM samples.readmission WHERE dataset = 'synth_notes_meds'").fetchall()
        assert with_text[0][0] > 50
    finally:
        con.close()


def test_dashboard_overview_shows_the_meds_code_accounting(round_trip, tmp_path):
    from dashboard import queries
    from dashboard.pages import overview
    from medtx.publish.snapshot import publish_snapshot

    db, _, _ = round_trip
    snapshot = tmp_path / "snapshot.duckdb"
    publish_snapshot(db, snapshot)
    codes = queries.meds_codes(snapshot, COPY)
    assert "DIAGNOSIS//ICD//9//" in codes["prefix"].to_list() and codes["n_rows"].sum() > 13_000
    assert queries.meds_codes(snapshot, DEMO).height == 0  # a CSV-ingested dataset has none
    assert "meds-codes-grid" in str(overview._rejects(snapshot, COPY))
    assert "meds-codes-grid" not in str(overview._rejects(snapshot, DEMO))
