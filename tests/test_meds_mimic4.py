"""Import that understands the data (issue 45): a MIMIC-IV-style MEDS dataset - NDC-coded and name-coded
medications, ICD-9 and ICD-10 diagnoses, MEDS-Transforms' own `AGE`, no medtx extension columns or task splits,
`etl_name` not medtx - gets drug_rec, readmission and mortality samples after one `medtx ingest meds` with no
hand-written code mapping (the shipped `mimic4` preset), then the usual map-codes and build-samples. The import
summary and map-codes print how many medications were coded (and mapped) by which route.

Built from the bundled demo's own MEDS export, rewritten the way the MIMIC-IV MEDS ETL writes it."""

from __future__ import annotations

import json
import re
import shutil

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.meds import export_meds
from medtx.meds.events import AGE
from medtx.store.db import connect
from tests.fixtures_samples import DEMO, demo_db  # noqa: F401  (session fixture)

NAME = "mimic4_style"


@pytest.fixture(scope="module")
def mimic4_style(demo_db, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("mimic4-style")
    db = root / "w.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        out = export_meds(con, DEMO, root / "export").out
    finally:
        con.close()
    src = root / NAME
    shutil.copytree(out, src)
    for path in sorted((src / "data").rglob("*.parquet")):
        events = pl.read_parquet(path)
        odd, even = pl.col("subject_id") % 2 == 1, pl.col("subject_id") % 2 == 0
        code = pl.col("code")
        events = events.with_columns(
            pl.when(code == AGE).then(pl.lit("AGE"))  # MEDS-Transforms' time-derived age
            # ICD-10 beside ICD-9 (odd subjects), as MIMIC-IV holds both
            .when(odd & code.str.starts_with("DIAGNOSIS//ICD//9//"))
            .then(code.str.replace("DIAGNOSIS//ICD//9//", "DIAGNOSIS//ICD//10//", literal=True))
            # medications by name, no NDC (even subjects), the rest by NDC
            .when(even & code.str.starts_with("MEDICATION//NDC//"))
            .then(pl.lit("MEDICATION//START//") + pl.col("drug").str.to_uppercase())
            .otherwise(code).alias("code"))
        keep = ["subject_id", "time", "code", "numeric_value", "text_value", "hadm_id"]
        events.select(keep).write_parquet(path)
    (src / "metadata" / "medtx_task_splits.parquet").unlink()
    meta = json.loads((src / "metadata" / "dataset.json").read_text())
    meta.update(etl_name="MIMIC_IV_MEDS", other_extension_columns=[])
    (src / "metadata" / "dataset.json").write_text(json.dumps(meta))
    return db, src


def _ok(*args):
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


def test_mimic4_style_meds_gets_every_task_with_no_yaml(mimic4_style):
    db, src = mimic4_style
    with_ndc = pl.read_parquet(src / "data" / "**" / "*.parquet").filter(
        pl.col("code").str.starts_with("MEDICATION//")).group_by(
        pl.col("code").str.starts_with("MEDICATION//NDC//").alias("ndc")).len()
    counts = dict(with_ndc.iter_rows())
    assert counts[True] > 1000 and counts[False] > 1000  # both kinds of medication codes

    summary = _ok("ingest", "meds", "--source", str(src), "--db", str(db))
    assert f"(codes: mimic4)" in summary
    ndc_rows = int(re.search(r"medications by NDC: MEDICATION//NDC// │ ([0-9,]+)", summary)[1].replace(",", ""))
    name_rows = int(re.search(r"medications by name: MEDICATION//START// │ ([0-9,]+)", summary)[1].replace(",", ""))
    assert (ndc_rows, name_rows) == (counts[True], counts[False])  # every medication event read, by its route
    with duckdb.connect(str(db), read_only=True) as con:
        unmapped = con.execute("SELECT coalesce(sum(n_rows), 0) FROM raw.meds_codes WHERE dataset = ? "
                               "AND target_table IS NULL", [NAME]).fetchall()[0][0]
        icd10 = con.execute("SELECT n_rows FROM raw.meds_codes WHERE dataset = ? AND prefix = 'DIAGNOSIS//ICD//10//' "
                            "AND target_table = 'diagnoses_icd'", [NAME]).fetchall()[0][0]
    assert unmapped == 0 and icd10 > 0  # AGE is derived, ICD-10 diagnoses load beside ICD-9

    coverage = _ok("map-codes", "--dataset", NAME, "--db", str(db))
    name_mapped = int(re.search(rf"{NAME} │ name_no_ndc │ 0 │ (\d+)", coverage)[1])
    print(f"MIMIC-IV-style import: {ndc_rows} NDC-coded, {name_rows} name-coded medication events; map-codes: "
          f"{name_mapped} name-coded rows mapped by drug name ({name_mapped / name_rows:.1%}); {coverage}")
    assert name_mapped > 0.3 * name_rows  # the bundled drug names match most of the demo's drugs
    with duckdb.connect(str(db), read_only=True) as con:
        routes = dict(con.execute("SELECT route, n_rows FROM core.mapping_coverage WHERE dataset = ? AND kind = 'route'",
                                  [NAME]).fetchall())
        demo_routes = dict(con.execute("SELECT route, n_rows FROM core.mapping_coverage WHERE dataset = ? "
                                       "AND kind = 'route'", [DEMO]).fetchall())
    assert routes["mapped"] > 0 and "name_no_ndc" not in demo_routes  # MIMIC-III's NDC-less rows stay unmapped

    built = _ok("build-samples", "--dataset", NAME, "--db", str(db))
    for task in ("drug_rec", "readmission", "mortality"):
        n = int(re.search(rf"{task}/{NAME} │ (\d+)", built)[1])
        assert n > 20, (task, built)
