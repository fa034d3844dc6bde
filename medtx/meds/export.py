"""Export one warehouse dataset as a MEDS 0.4 dataset, set-based: every file is one DuckDB `COPY (...)`.

Layout written (MEDS 0.4): `data/<k>.parquet` shards (each subject in exactly one shard, its events
contiguous and sorted by time, static events first; shards cut by rows), `metadata/codes.parquet`,
`metadata/subject_splits.parquet`, `metadata/dataset.json`, and with labels `labels/<task>.parquet`.
medtx extension: `metadata/medtx_task_splits.parquet` (subject_id, task, split) keeps medtx's per-task
splits so that `medtx ingest meds` of the export rebuilds every task with the same split.
The whole tree is written into a temporary sibling folder and renamed into place at the end, so a failed
export never leaves a half-written dataset behind.
"""

from __future__ import annotations

import base64
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa

import medtx
from medtx.store.db import quote_ident, sql_literal
from medtx.meds.events import DATA_ARROW_SCHEMA, EXTRA_COLUMNS, events_sql
from medtx.meds.labels import LABEL_ARROW_SCHEMA, label_sql, label_tasks, missing_time_count
from medtx.samples.splits import DEFAULT_SEED, assign_splits
from medtx.tasks import all_tasks

log = logging.getLogger("medtx.meds")

MEDS_VERSION = "0.4.1"
DEFAULT_SHARD_ROWS = 2_000_000
# medtx split names -> the MEDS sentinels.
TO_MEDS_SPLIT = {"train": "train", "val": "tuning", "test": "held_out"}
# The subject split of a subject is the one of the first of these tasks that holds it (each task declares its
# `meds_split_rank`, medtx.tasks); others get a seeded draw like any medtx split.
SPLIT_TASK_ORDER = tuple(t.name for t in sorted((t for t in all_tasks() if t.meds_split_rank is not None),
                                                 key=lambda t: t.meds_split_rank))

CODES_ARROW_SCHEMA = pa.schema([("code", pa.string()), ("description", pa.string()),
                                ("parent_codes", pa.list_(pa.string()))])
SPLITS_ARROW_SCHEMA = pa.schema([("subject_id", pa.int64()), ("split", pa.string())])
TASK_SPLITS_ARROW_SCHEMA = pa.schema([("subject_id", pa.int64()), ("task", pa.string()), ("split", pa.string())])


class ExportError(ValueError):
    """The export cannot be written; the message says why (nothing was written)."""


@dataclass
class ExportResult:
    dataset: str
    out: Path
    subjects: int
    events: int
    shards: list[str]
    codes: int
    labels: dict[str, int] = field(default_factory=dict)


def copy_parquet(con: duckdb.DuckDBPyConnection, select_sql: str, path: Path, schema: pa.Schema,
                 params: dict | None = None) -> None:
    """COPY a SELECT to parquet, embedding the Arrow schema so readers get the MEDS types exactly
    (DuckDB alone writes plain `string` where meds 0.4 asks for `large_string`). `select_sql` is code-written
    SQL whose values are the named `params`; the path and schema are bound too."""
    encoded = base64.b64encode(schema.serialize().to_pybytes()).decode()
    con.execute(
        f"COPY ({select_sql}) TO $copy_path (FORMAT parquet, COMPRESSION zstd, "
        "KV_METADATA {'ARROW:schema': $copy_arrow_schema})",
        {**(params or {}), "copy_path": str(path), "copy_arrow_schema": encoded},
    )


def _count_rows(con: duckdb.DuckDBPyConnection, path: Path) -> int:
    return con.execute("SELECT count(*) FROM read_parquet(?)", [str(path)]).fetchall()[0][0]


def export_meds(
    con: duckdb.DuckDBPyConnection, dataset: str, out: Path, *, shard_rows: int = DEFAULT_SHARD_ROWS,
    labels: list[str] | None = None, overwrite: bool = False,
) -> ExportResult:
    """Write `dataset` as MEDS under `out`. `labels`: task names whose labels to write (see medtx.meds.labels)."""
    out = Path(out)
    if shard_rows < 1:
        raise ExportError(f"shard rows must be >= 1, got {shard_rows}")
    n_adm = con.execute("SELECT count(*) FROM raw.admissions WHERE dataset = ?", [dataset]).fetchall()[0][0]
    if not n_adm:
        raise ExportError(f"dataset {dataset!r} has no rows in raw.admissions: nothing to export")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"{out}: folder exists and is not empty (pass --overwrite to replace it)")
    wanted = list(labels or [])
    known = label_tasks(con)
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise ExportError(f"--labels: no label export for task(s) {unknown}; available here: {sorted(known)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        result = _write_tree(con, dataset, tmp, shard_rows, wanted)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        con.execute("DROP TABLE IF EXISTS _meds_export")
    result.out = out
    log.info("MEDS export [%s] -> %s: %d subjects, %d events in %d shard(s), %d codes",
             dataset, out, result.subjects, result.events, len(result.shards), result.codes)
    return result


def _write_tree(con, dataset: str, root: Path, shard_rows: int, labels: list[str]) -> ExportResult:
    (root / "data").mkdir()
    (root / "metadata").mkdir()
    params = {"dataset": dataset}
    con.execute(f"CREATE OR REPLACE TEMP TABLE _meds_export AS {events_sql()}", params)
    # Shards by rows: subjects in id order, a new shard when the running row count passes a multiple of
    # shard_rows; a subject is never cut (a subject bigger than shard_rows gets a shard of its own).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _meds_shards AS
        SELECT subject_id, CAST((sum(n) OVER (ORDER BY subject_id) - n) // {int(shard_rows)} AS INTEGER) AS shard
        FROM (SELECT subject_id, count(*) AS n FROM _meds_export GROUP BY 1)""")
    shard_ids = [r[0] for r in con.sql("SELECT DISTINCT shard FROM _meds_shards ORDER BY 1").fetchall()]
    columns_sql = ", ".join(map(quote_ident, ["subject_id", "time", "code", "numeric_value", "text_value",
                                               *EXTRA_COLUMNS]))
    shards = []
    for k, shard in enumerate(shard_ids):
        name = f"data/{k}.parquet"
        copy_parquet(con, f"""
            SELECT {columns_sql} FROM _meds_export JOIN _meds_shards USING (subject_id) WHERE shard = {int(shard)}
            ORDER BY subject_id, time NULLS FIRST, _ord, hadm_id, seq_num NULLS LAST, _row, code""",
                     root / name, DATA_ARROW_SCHEMA)
        shards.append(name)
    subjects, events = con.sql("SELECT count(DISTINCT subject_id), count(*) FROM _meds_export").fetchall()[0]
    codes = _write_codes(con, root, params)
    _write_splits(con, dataset, root)
    written = {}
    if labels:
        (root / "labels").mkdir()
    for task in labels:
        missing = missing_time_count(con, task, dataset)
        if missing:
            raise ExportError(f"--labels {task}: {missing} sample(s) of {dataset!r} have no prediction time "
                              "(admission without dischtime); nothing was written")
        path = root / "labels" / f"{task}.parquet"
        copy_parquet(con, label_sql(con, task), path, LABEL_ARROW_SCHEMA, params)
        written[task] = _count_rows(con, path)
    _write_dataset_json(dataset, root)
    con.execute("DROP TABLE IF EXISTS _meds_shards")
    return ExportResult(dataset, root, subjects, events, shards, codes, written)


def _write_codes(con, root: Path, params: dict) -> int:
    """metadata/codes.parquet: every code of the data, plus the ATC levels above the mapped drugs.

    Descriptions: ICD-9 long titles, WHO ATC names, an NDC's most frequent drug name. parent_codes: an NDC's
    mapped ATC-3 class(es) as `ATC//<code>`, an ATC code's next level up (ATC-3 -> ATC-2 -> ATC-1)."""
    select_sql = """
        WITH used AS (SELECT DISTINCT code FROM _meds_export),
        ndc_atc AS (
            SELECT 'MEDICATION//NDC//' || trim(ndc) AS code, list(DISTINCT 'ATC//' || atc3 ORDER BY 'ATC//' || atc3) AS parents
            FROM core.prescriptions_atc3 WHERE dataset = $dataset AND ndc IS NOT NULL GROUP BY 1
        ), ndc_name AS (
            SELECT 'MEDICATION//NDC//' || trim(ndc) AS code, mode(drug) AS name
            FROM raw.prescriptions WHERE dataset = $dataset AND ndc IS NOT NULL GROUP BY 1
        ), atc_used AS (   -- the mapped ATC-3 classes and every level above them
            SELECT DISTINCT a.atc_code, a.atc_name, a.level FROM ref.atc a
            JOIN (SELECT DISTINCT atc3 FROM core.prescriptions_atc3 WHERE dataset = $dataset) m
              ON a.level <= 3 AND starts_with(m.atc3, a.atc_code)
        )
        SELECT u.code,
               coalesce(dx.long_title, px.long_title, ndc_name.name) AS description,
               ndc_atc.parents AS parent_codes
        FROM used u
        LEFT JOIN ref.icd9_diagnoses dx ON u.code = 'DIAGNOSIS//ICD//9//' || dx.icd9_code
        LEFT JOIN ref.icd9_procedures px ON u.code = 'PROCEDURE//ICD//9//' || px.icd9_code
        LEFT JOIN ndc_atc USING (code) LEFT JOIN ndc_name USING (code)
        UNION ALL
        SELECT 'ATC//' || atc_code, atc_name,
               CASE level WHEN 3 THEN ['ATC//' || left(atc_code, 3)] WHEN 2 THEN ['ATC//' || left(atc_code, 1)] END
        FROM atc_used
        ORDER BY 1"""
    path = root / "metadata" / "codes.parquet"
    copy_parquet(con, select_sql, path, CODES_ARROW_SCHEMA, params)
    return _count_rows(con, path)


def _task_order_sql() -> str:
    """`WHEN task THEN rank` from the code constant SPLIT_TASK_ORDER."""
    return " ".join(f"WHEN {sql_literal(t)} THEN {int(i)}" for i, t in enumerate(SPLIT_TASK_ORDER))


def _to_meds_split_sql() -> str:
    """`WHEN medtx split THEN MEDS split` from the code constant TO_MEDS_SPLIT."""
    return " ".join(f"WHEN {sql_literal(k)} THEN {sql_literal(v)}" for k, v in TO_MEDS_SPLIT.items())


def _write_splits(con, dataset: str, root: Path) -> None:
    """subject_splits.parquet (one MEDS split per subject) and medtx_task_splits.parquet (per task)."""
    con.execute("CREATE OR REPLACE TEMP TABLE _meds_task_splits AS SELECT subject_id, task, split, seed "
                "FROM samples.splits WHERE dataset = ? AND task IN (SELECT unnest(?))",
                [dataset, list(SPLIT_TASK_ORDER)])
    chosen = dict(con.sql(f"""SELECT subject_id, arg_min(split, CASE task {_task_order_sql()} END)
                              FROM _meds_task_splits GROUP BY 1""").fetchall())
    seed = con.sql("SELECT min(seed) FROM _meds_task_splits").fetchall()[0][0]
    seed = DEFAULT_SEED if seed is None else seed
    subjects = [r[0] for r in con.sql("SELECT DISTINCT subject_id FROM _meds_export").fetchall()]
    rest = assign_splits([s for s in subjects if s not in chosen], seed)
    frame = pa.table({"subject_id": pa.array(list(chosen) + list(rest), pa.int64()),
                      "split": [TO_MEDS_SPLIT[s] for s in [*chosen.values(), *rest.values()]]})
    con.register("_meds_subject_splits", frame)
    try:
        copy_parquet(con, "SELECT subject_id, split FROM _meds_subject_splits ORDER BY subject_id",
                     root / "metadata" / "subject_splits.parquet", SPLITS_ARROW_SCHEMA)
    finally:
        con.unregister("_meds_subject_splits")
    copy_parquet(con, f"SELECT subject_id, task, CASE split {_to_meds_split_sql()} END AS split "
                      "FROM _meds_task_splits ORDER BY task, subject_id",
                 root / "metadata" / "medtx_task_splits.parquet", TASK_SPLITS_ARROW_SCHEMA)
    con.execute("DROP TABLE IF EXISTS _meds_task_splits")


def _write_dataset_json(dataset: str, root: Path) -> None:
    meta = {
        "dataset_name": dataset,
        "dataset_version": datetime.now().strftime("%Y-%m-%d"),
        "etl_name": "medtx",
        "etl_version": medtx.__version__,
        "meds_version": MEDS_VERSION,
        "created_at": datetime.now().isoformat(timespec="seconds"),
        "raw_source_id_columns": ["hadm_id"],
        "other_extension_columns": [c for c in EXTRA_COLUMNS if c != "hadm_id"],
    }
    (root / "metadata" / "dataset.json").write_text(json.dumps(meta, indent=2) + "\n")
