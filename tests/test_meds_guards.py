"""Issue 34, cases 1, 2, 4 and 15 (MEDS splits): `medtx ingest meds` goes through the same write path as
`ingest mimic3` — the writer lock, the row-count guard (also over a CSV-ingested dataset and through the
pipeline's `format: meds` step), one transaction — and reads what a MEDS folder holds: shards in symlinked
folders, tz-aware and nanosecond times as meds' own schema aligns them (under a non-UTC machine zone), one
admission per stay, split files without nulls. Bad inputs are built here from the bundled demo (exported as
MEDS by medtx); every case asserts the message, the exit code and the rows of every raw table before/after."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from meds.schema import DataSchema
from typer.testing import CliRunner

from flows.cli import app
from medtx.ingest import IngestError, ingest_mimic3
from medtx.meds import MedsFormatError, export_meds, ingest_meds
from medtx.meds.validate import shard_files
from medtx.pipeline.kinds import ingest as ingest_kind
from medtx.pipeline.config import load_config
from medtx.pipeline.plan import build_plan
from medtx.store.db import connect
from tests.conftest import DATA

REPO = Path(__file__).resolve().parent.parent
DEMO = "mimic3_demo"
TABLES = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents", "meds_splits",
          "meds_codes", "ingest_log")


def counts(db: Path) -> dict[str, int]:
    """Rows of every raw table a MEDS import writes, per dataset."""
    with duckdb.connect(str(db), read_only=True) as con:
        return {f"{t}[{d}]": n for t in TABLES
                for d, n in con.execute(f"SELECT dataset, count(*) FROM raw.{t} GROUP BY 1").fetchall()}


def cli(*args: str, env: dict | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["ingest", "meds", *args], env=env)
    return result.exit_code, " ".join(result.output.split())


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, Path]:
    """A warehouse with the demo CSV-ingested as `mimic3_demo` and re-imported from its MEDS export as
    `demo_meds`; and that export (small shards, so some can move to a symlinked folder)."""
    root = tmp_path_factory.mktemp("meds-guards")
    db = root / "warehouse.duckdb"
    ingest_mimic3(db, DATA / "mimic3_demo", DEMO, root / "cache")
    con = connect(db)
    try:
        out = export_meds(con, DEMO, root / "export", shard_rows=2000).out
    finally:
        con.close()
    ingest_meds(db, out, "demo_meds")
    return db, Path(out)


@pytest.fixture
def db(base, tmp_path: Path) -> Path:
    copy = tmp_path / "warehouse.duckdb"
    shutil.copy(base[0], copy)
    return copy


def _copy(base, tmp_path: Path, name: str = "src") -> Path:
    dest = tmp_path / name
    shutil.copytree(base[1], dest, symlinks=True)
    return dest


def _keep_subjects(root: Path, n: int) -> None:
    """Rewrite every shard (and the split file) to the first `n` subjects of the dataset."""
    subjects = sorted(pl.concat([pl.read_parquet(p, columns=["subject_id"]) for p in shard_files(root / "data")])
                      .get_column("subject_id").unique().to_list())[:n]
    for path in [*shard_files(root / "data"), root / "metadata" / "subject_splits.parquet"]:
        table = pq.read_table(path)
        keep = pc.is_in(table.column("subject_id"), pa.array(subjects, pa.int64()))
        pq.write_table(table.filter(keep), path)


BASE_DEMO = {"patients": 100, "admissions": 129, "diagnoses_icd": 1761, "procedures_icd": 506,
             "prescriptions": 10398}
LATE_RX = 17  # prescriptions dated after their stay's discharge: not exported (medtx.samples.clock drops them)


def test_base_state(base) -> None:
    before = counts(base[0])
    for t, n in BASE_DEMO.items():
        assert before[f"{t}[{DEMO}]"] == n
        assert before[f"{t}[demo_meds]"] == n - (LATE_RX if t == "prescriptions" else 0)


# ------------------------------------------------------------------------------- case 1: the row-count guard


def test_a_10_subject_folder_over_100_patients_is_refused_unless_allowed(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    _keep_subjects(src, 10)
    before = counts(db)
    code, out = cli("--source", str(src), "--dataset", "demo_meds", "--db", str(db))
    assert code == 2, out
    assert (f"{src}: raw.patients [demo_meds] would shrink from 100 to 10 rows (more than 50% fewer); nothing was "
            "changed — pass --allow-shrink") in out
    assert counts(db) == before  # every table of every dataset, splits, codes and log as they were
    code, out = cli("--source", str(src), "--dataset", "demo_meds", "--db", str(db), "--allow-shrink")
    assert code == 0, out
    after = counts(db)
    assert after["patients[demo_meds]"] == 10 and after["meds_splits[demo_meds]"] == 10
    assert {k: v for k, v in after.items() if DEMO in k} == {k: v for k, v in before.items() if DEMO in k}


def test_a_valid_0_row_shard_is_refused(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    _keep_subjects(src, 0)
    before = counts(db)
    code, out = cli("--source", str(src), "--dataset", "demo_meds", "--db", str(db))
    assert code == 2 and "raw.patients [demo_meds] would shrink from 100 to 0 rows" in out, out
    assert counts(db) == before


def test_a_meds_import_over_a_csv_ingested_dataset_is_guarded(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    _keep_subjects(src, 10)
    before = counts(db)
    code, out = cli("--source", str(src), "--dataset", DEMO, "--db", str(db))
    assert code == 2 and f"raw.patients [{DEMO}] would shrink from 100 to 10 rows" in out, out
    assert counts(db) == before


def test_a_foreign_etl_name_losing_prescriptions_is_refused(base, db: Path, tmp_path: Path) -> None:
    """medtx's export read with a MIMIC-IV-style mapping that knows no medication code (a foreign etl_name and a
    user's mapping without prescription rules): the stays keep their diagnoses but lose every prescription.
    (The shipped `mimic4` mapping reads MEDICATION//NDC// and MEDICATION//START// since issue 45.)"""
    import yaml

    src = _copy(base, tmp_path)
    meta = json.loads((src / "metadata" / "dataset.json").read_text())
    (src / "metadata" / "dataset.json").write_text(json.dumps({**meta, "etl_name": "MIMIC_IV_MEDS"}))
    shipped = yaml.safe_load((REPO / "medtx" / "meds" / "codes" / "mimic4.yaml").read_text())
    mapping = tmp_path / "no_drugs.yaml"
    mapping.write_text(yaml.safe_dump({**shipped, "name": "no_drugs", "prescriptions": []}))
    before = counts(db)
    with pytest.raises(IngestError, match=r"raw\.prescriptions \[demo_meds\] would shrink from 10,381 to 0 rows"):
        ingest_meds(db, src, "demo_meds", mapping)
    assert counts(db) == before


def test_the_pipelines_meds_step_is_guarded_and_honours_the_config(base, db: Path, tmp_path: Path) -> None:
    """The `format: meds` step the plan builds, run by the pipeline's own step function (what its Prefect task
    calls): refused by default, accepted with `ingest: {allow_shrink: true}`."""
    src = _copy(base, tmp_path)
    _keep_subjects(src, 10)
    before = counts(db)
    for allow in (False, True):
        config = tmp_path / f"pipeline-{allow}.yaml"
        config.write_text(textwrap.dedent(f"""
            datasets:
              - {{source: {src}, format: meds, name: demo_meds}}
            ingest: {{allow_shrink: {str(allow).lower()}}}
            seeds: [42]
            tasks:
              readmission:
                models: [{{model: logreg}}]
            """))
        step = build_plan(load_config(config), tmp_path / "synth", DATA)["ingest.demo_meds.meds"]
        assert step.params["allow_shrink"] is allow and step.params["max_shrink"] == 0.5
        paths = {"db": str(db), "cache_dir": str(tmp_path / "cache")}
        if not allow:
            with pytest.raises(IngestError, match=r"raw\.patients \[demo_meds\] would shrink from 100 to 10 rows"):
                ingest_kind.run(step.spec(), paths)
            assert counts(db) == before
        else:
            assert ingest_kind.run(step.spec(), paths)["rows"]["patients"] == 10
            assert counts(db)["patients[demo_meds]"] == 10


# ------------------------------------------------------------------------------- case 2: the writer lock


def test_ingest_meds_waits_for_a_live_writer_then_gives_up_changing_nothing(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    _keep_subjects(src, 10)
    code = textwrap.dedent(f"""
        import time
        from medtx.store.writer_lock import hold_writer
        with hold_writer({str(db)!r}, "medtx pipeline", wait_s=0):
            print("held", flush=True)
            time.sleep(600)
        """)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        before = counts(db)
        code, out = cli("--source", str(src), "--dataset", "demo_meds", "--db", str(db), "--allow-shrink",
                        env={"MEDTX_LOCK_WAIT_S": "1"})
        assert code == 1, out
        assert f"is being written by `medtx pipeline` pid {holder.pid}" in out and "gave up after waiting 1 s" in out
        assert counts(db) == before  # before: raw.patients 100 -> 10 under the running pipeline
    finally:
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------------------- case 4: what the folder holds


def test_shards_in_a_symlinked_folder_are_read(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    shards = shard_files(src / "data")
    assert len(shards) >= 4
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for i, path in enumerate(shards[len(shards) // 2:]):  # half the shards move out, reached by a symlink
        path.rename(elsewhere / f"moved_{i}.parquet")
    (src / "data" / "linked").symlink_to(elsewhere, target_is_directory=True)
    before = counts(db)
    result = ingest_meds(db, src, "demo_meds")
    assert result.subjects == 100  # before: 47 (the linked folder skipped without a word)
    assert counts(db) == {**before, "ingest_log[demo_meds]": before["ingest_log[demo_meds]"] + 7}
    (elsewhere / "moved_0.parquet").unlink()  # now a dangling link inside: refused, not skipped
    (src / "data" / "gone.parquet").symlink_to(elsewhere / "moved_0.parquet")
    with pytest.raises(MedsFormatError, match=r"gone\.parquet: a symlink to .*moved_0\.parquet, which does not exist"):
        ingest_meds(db, src, "demo_meds")


def _admittimes(db: Path, dataset: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT hadm_id, admittime, dischtime FROM raw.admissions WHERE dataset = ? "
                           "AND hadm_id > 0 ORDER BY 1", [dataset]).fetchall()


def _retime(root: Path, to: pa.DataType) -> None:
    for path in shard_files(root / "data"):
        table = pq.read_table(path)
        i = table.schema.get_field_index("time")
        pq.write_table(table.set_column(i, pa.field("time", to), table.column("time").cast(to)), path)


@pytest.mark.parametrize("zone", ["UTC", "+05:00"])
def test_tz_aware_times_are_not_shifted_by_the_machines_zone(base, db: Path, tmp_path: Path, zone: str) -> None:
    """Shards whose `time` is tz-aware (the same instants), imported by a process whose machine zone is
    America/New_York: the stays' times are the UTC wall times, exactly what meds' DataSchema.align gives."""
    src = _copy(base, tmp_path)
    _retime(src, pa.timestamp("us", tz="UTC"))
    if zone != "UTC":  # the same instants written in another zone: UTC wall time is unchanged
        _retime(src, pa.timestamp("us", tz=zone))
    aligned = DataSchema.align(pq.read_table(shard_files(src / "data")[0]))
    assert aligned.column("time").type == pa.timestamp("us")
    with pytest.raises(MedsFormatError, match=r"column 'time' is timestamp\[us, tz=.*\], meds' DataSchema expects "
                                              r"timestamp\[us\] \(no time zone\) .*--cast-types"):
        ingest_meds(db, src, "demo_tz")  # off-schema: refused unless told to cast
    code = (f"from medtx.meds import ingest_meds; ingest_meds({str(db)!r}, {str(src)!r}, 'demo_tz', "
            "cast_types=True)")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TZ": "America/New_York"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _admittimes(db, "demo_tz") == _admittimes(db, "demo_meds")  # before: every stay 5 hours early
    first = pq.read_table(shard_files(base[1] / "data")[0]).column("time")
    assert aligned.column("time").equals(first.cast(pa.timestamp("us")))


def test_nanosecond_times_are_accepted_only_when_whole_microseconds(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    _retime(src, pa.timestamp("ns"))
    with pytest.raises(MedsFormatError, match=r"column 'time' is timestamp\[ns\], meds' DataSchema expects"):
        ingest_meds(db, src, "demo_ns")
    ingest_meds(db, src, "demo_ns", cast_types=True)
    assert _admittimes(db, "demo_ns") == _admittimes(db, "demo_meds")
    path = shard_files(src / "data")[0]
    table = pq.read_table(path)
    ints = table.column("time").cast(pa.int64()).to_pylist()
    row = next(i for i, v in enumerate(ints) if v is not None)
    ints[row] += 789  # 789 ns: meds' schema refuses this table, DuckDB would round it
    pq.write_table(table.set_column(table.schema.get_field_index("time"), "time",
                                    pa.array(ints, pa.int64()).cast(pa.timestamp("ns"))), path)
    with pytest.raises(Exception, match="incorrect types"):
        DataSchema.align(pq.read_table(path))
    before = counts(db)
    with pytest.raises(MedsFormatError, match=rf"{path.name}: row {row + 1}: time .* has nanoseconds, MEDS times are "
                                              r"microseconds \(column 'time' is timestamp\[ns\]"):
        ingest_meds(db, src, "demo_ns", cast_types=True)
    assert counts(db) == before


def test_a_float64_numeric_value_is_refused_unless_cast(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    for path in shard_files(src / "data"):
        table = pq.read_table(path)
        i = table.schema.get_field_index("numeric_value")
        pq.write_table(table.set_column(i, pa.field("numeric_value", pa.float64()),
                                        table.column(i).cast(pa.float64())), path)
    before = counts(db)
    with pytest.raises(MedsFormatError, match=r"column 'numeric_value' is double, meds' DataSchema expects float32 "
                                              r"\(rule: column types; pass --cast-types"):
        ingest_meds(db, src, "demo_f64")
    assert counts(db) == before
    ingest_meds(db, src, "demo_f64", cast_types=True)
    assert _admittimes(db, "demo_f64") == _admittimes(db, "demo_meds")


def test_a_duplicate_admission_at_another_time_is_reported(base, db: Path, tmp_path: Path) -> None:
    src = _copy(base, tmp_path)
    path = shard_files(src / "data")[0]
    frame = pl.read_parquet(path).with_row_index("i").with_columns(pl.col("i").cast(pl.Float64))
    first = frame.filter(pl.col("code").str.starts_with("HOSPITAL_ADMISSION//")).row(0, named=True)
    dup = frame.filter(pl.col("i") == first["i"]).with_columns(pl.col("time") + pl.duration(hours=6),
                                                               pl.col("i") + 0.5)
    rank = frame.group_by("subject_id").agg(pl.col("i").min().alias("rank"))
    frame = (pl.concat([frame, dup]).join(rank, on="subject_id")
             .sort(["rank", "time", "i"], nulls_last=False))  # still sorted by time within each subject
    row = frame.get_column("i").to_list().index(first["i"] + 0.5) + 1
    frame.drop("i", "rank").write_parquet(path)
    before = counts(db)
    code, out = cli("--source", str(src), "--dataset", "demo_meds", "--db", str(db))
    assert code == 2, out
    assert (f"{path}: row {row} (subject {first['subject_id']}): stay (hadm_id) {first['hadm_id']} has 2 "
            "admission events at different times") in out
    assert "(rule: one admission per stay)" in out
    assert counts(db) == before  # before: exit 0, that stay's admittime silently moved


# ------------------------------------------------------------------------------- case 15: the split file


@pytest.mark.parametrize("column", ["subject_id", "split"])
def test_a_null_in_the_split_file_is_one_line(base, db: Path, tmp_path: Path, column: str) -> None:
    src = _copy(base, tmp_path)
    path = src / "metadata" / "subject_splits.parquet"
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    values[3] = None
    pq.write_table(table.set_column(table.schema.get_field_index(column), column,
                                    pa.array(values, table.schema.field(column).type)), path)
    before = counts(db)
    code, out = cli("--source", str(src), "--dataset", "demo_meds", "--db", str(db))
    assert code == 2, out
    assert f"{path}: row 4 has a null {column} (1 null(s) in all; rule: subject_id, split are never null)" in out
    assert "Traceback" not in out
    assert counts(db) == before
