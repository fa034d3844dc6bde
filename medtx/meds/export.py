"""Export one warehouse dataset as a MEDS 0.4 dataset, set-based: every file is one DuckDB `COPY (...)`.

Layout written (MEDS 0.4): `data/<split>/<k>.parquet` shards (split = the subject's MEDS split, train /
tuning / held_out: the dataset's one patient split, `samples.patient_splits`, which every medtx task uses, so a
MEDS tool's held_out set is medtx's test set for every task; each subject in exactly one shard, its events
contiguous and sorted by time, static events first; shards cut by rows), `metadata/codes.parquet`,
`metadata/subject_splits.parquet`, `metadata/dataset.json`, and with labels one folder per task,
`labels/<task>/<split>/<k>.parquet`, each label in the shard named like its subject's data shard (refused when the
task's own split of a subject differs from it). medtx extension: `metadata/medtx_task_splits.parquet` (subject_id,
task, split) keeps every EHR task's split (the same as subject_splits for a dataset medtx split itself) so that
`medtx ingest meds` of the export rebuilds every task with the same split.
The whole tree is written into a temporary sibling folder and renamed into place at the end, so a failed
export never leaves a half-written dataset behind. `--out` is never the warehouse, its folder, the models
folder or any folder holding something else than a previous medtx MEDS export (`check_out_folder`).
Re-exporting the same warehouse gives a byte-identical `metadata/codes.parquet` (every order has a tie-break).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa

import medtx
from medtx.store.db import quote_ident, sql_literal
from medtx.meds.events import AGE, DATA_ARROW_SCHEMA, EXTRA_COLUMNS, events_sql
from medtx.meds.labels import LABEL_ARROW_SCHEMA, label_sql, label_tasks, missing_time_count, outcome_leak
from medtx.samples.splits import DEFAULT_SEED, assign_splits, draw_patient_splits
from medtx.tasks import all_tasks, get_task

log = logging.getLogger("medtx.meds")

MEDS_VERSION = "0.4.1"
DEFAULT_SHARD_ROWS = 2_000_000
# medtx split names -> the MEDS sentinels.
TO_MEDS_SPLIT = {"train": "train", "val": "tuning", "test": "held_out"}
# What a previous medtx MEDS export holds at its top level; `--overwrite` replaces nothing else.
EXPORT_ENTRIES = frozenset({"data", "metadata", "labels"})
EXPORT_SUFFIXES = frozenset({".parquet", ".json"})
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


def is_medtx_export(folder: Path) -> bool:
    """`folder` is a previous `medtx export meds` tree and holds nothing else: metadata/dataset.json says
    etl_name medtx, its top-level entries are among data/, metadata/, labels/, and every file below is a plain
    .parquet or .json file (no link, no warehouse, no model)."""
    meta = folder / "metadata" / "dataset.json"
    if not meta.is_file() or meta.is_symlink():
        return False
    try:
        if json.loads(meta.read_text()).get("etl_name") != "medtx":
            return False
    except (OSError, ValueError, AttributeError):
        return False
    if any(entry.name not in EXPORT_ENTRIES or entry.is_symlink() or not entry.is_dir() for entry in folder.iterdir()):
        return False
    return all(not p.is_symlink() and (p.is_dir() or (p.is_file() and p.suffix in EXPORT_SUFFIXES))
               for p in folder.rglob("*"))


def _warehouse_file(con: duckdb.DuckDBPyConnection) -> Path | None:
    path = con.sql("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
    return Path(path[0][0]) if path and path[0][0] else None


def check_out_folder(out: Path, overwrite: bool, protected: Sequence[Path] = ()) -> None:
    """Refuse an `--out` that is or contains a protected path (the warehouse file, its folder, the models
    folder...), a non-empty folder without `overwrite`, and with `overwrite` any folder that is not itself a
    previous medtx MEDS export. Raises ExportError (one line); nothing is touched."""
    target = Path(out).expanduser().resolve()
    for path in protected:
        kept = Path(path).expanduser().resolve()
        if target == kept or target in kept.parents:
            raise ExportError(f"--out {out}: is or contains {path}, which the export must never replace "
                              "(choose a folder of its own, e.g. var/meds/<dataset>)")
    if target.exists() and not target.is_dir():
        raise ExportError(f"--out {out}: exists and is not a folder")
    if target.is_dir() and any(target.iterdir()):
        if not overwrite:
            raise ExportError(f"{out}: folder exists and is not empty (pass --overwrite to replace a previous "
                              "medtx MEDS export)")
        if not is_medtx_export(target):
            raise ExportError(f"--out {out}: not a previous medtx MEDS export (only data/, metadata/, labels/ "
                              "with .parquet/.json files and metadata/dataset.json etl_name medtx may be "
                              "replaced); refusing to delete it")


def protected_paths(settings) -> tuple[Path, ...]:
    """What an export's --out must never be or contain, from medtx.settings.Settings: the warehouse, its
    folder, snapshot, WAL and writer files, the models, cache, results, exchange and Prefect folders (the same
    set as every other output: medtx.store.outputs.warehouse_paths)."""
    from medtx.store.outputs import warehouse_paths

    guard = warehouse_paths(settings)
    return (*guard.exact, *guard.folders)


def export_meds(
    con: duckdb.DuckDBPyConnection, dataset: str, out: Path, *, shard_rows: int = DEFAULT_SHARD_ROWS,
    labels: list[str] | None = None, overwrite: bool = False, protected: Sequence[Path] = (),
) -> ExportResult:
    """Write `dataset` as MEDS under `out`. `labels`: task names whose labels to write (see medtx.meds.labels).
    `protected`: folders/files `out` must never be or contain, besides the connection's warehouse file and its
    folder (the CLI adds the models, cache and results folders)."""
    out = Path(out)
    if shard_rows < 1:
        raise ExportError(f"shard rows must be >= 1, got {shard_rows}")
    warehouse = _warehouse_file(con)
    check_out_folder(out, overwrite, [*([warehouse, warehouse.parent] if warehouse else []), *protected])
    n_adm = con.execute("SELECT count(*) FROM raw.admissions WHERE dataset = ?", [dataset]).fetchall()[0][0]
    if not n_adm:
        raise ExportError(f"dataset {dataset!r} has no rows in raw.admissions: nothing to export")
    wanted = list(labels or [])
    known = label_tasks(con)
    unknown = [t for t in wanted if t not in known]
    if unknown:
        raise ExportError(f"--labels: no label export for task(s) {unknown}; available here: {sorted(known)}")
    for task in wanted:  # a task without samples would write no folder, and a MEDS tool would then find no file
        n = con.execute(f"SELECT count(*) FROM ({label_sql(con, task)})", {"dataset": dataset}).fetchall()[0][0]
        if not n:
            raise ExportError(f"--labels {task}: dataset {dataset!r} has no {task} samples; run `medtx build-samples "
                              f"--task {task} --dataset {dataset}` first (nothing was written)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        result = _write_tree(con, dataset, tmp, shard_rows, wanted)
        if out.exists():  # checked above: empty, or a previous medtx export with nothing else in it
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            out.rename(old / out.name)
            try:
                tmp.rename(out)
            except BaseException:
                (old / out.name).rename(out)
                raise
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for name in ("_meds_export", "_meds_shards", "_meds_subject_split"):
            con.execute(f"DROP TABLE IF EXISTS {quote_ident(name)}")
    result.out = out
    log.info("MEDS export [%s] -> %s: %d subjects, %d events in %d shard(s), %d codes",
             dataset, out, result.subjects, result.events, len(result.shards), result.codes)
    return result


def _write_tree(con, dataset: str, root: Path, shard_rows: int, labels: list[str]) -> ExportResult:
    (root / "data").mkdir()
    (root / "metadata").mkdir()
    params = {"dataset": dataset}
    con.execute(f"CREATE OR REPLACE TEMP TABLE _meds_export AS {events_sql()}", params)
    _write_splits(con, dataset, root)  # fills _meds_subject_split: the MEDS split of every exported subject
    # Shards by rows within each split: subjects in id order, a new shard when the running row count passes a
    # multiple of shard_rows; a subject is never cut (a subject bigger than shard_rows gets a shard of its own).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _meds_shards AS
        SELECT subject_id, split,
               dense_rank() OVER (PARTITION BY split ORDER BY raw_shard) - 1 AS shard
        FROM (SELECT subject_id, split,
                     CAST((sum(n) OVER (PARTITION BY split ORDER BY subject_id) - n) // {int(shard_rows)} AS INTEGER)
                         AS raw_shard
              FROM (SELECT subject_id, count(*) AS n FROM _meds_export GROUP BY 1)
              JOIN _meds_subject_split USING (subject_id))""")
    shard_ids = con.sql("SELECT DISTINCT split, shard FROM _meds_shards ORDER BY 1, 2").fetchall()
    columns_sql = ", ".join(map(quote_ident, ["subject_id", "time", "code", "numeric_value", "text_value",
                                               *EXTRA_COLUMNS]))
    shards = []
    for split, shard in shard_ids:
        name = f"data/{split}/{int(shard)}.parquet"
        (root / name).parent.mkdir(exist_ok=True)
        copy_parquet(con, f"""
            SELECT {columns_sql} FROM _meds_export JOIN _meds_shards USING (subject_id)
            WHERE split = $split AND shard = {int(shard)}
            ORDER BY subject_id, time NULLS FIRST, _ord, hadm_id, seq_num NULLS LAST, _row, code""",
                     root / name, DATA_ARROW_SCHEMA, {"split": split})
        shards.append(name)
    subjects, events = con.sql("SELECT count(DISTINCT subject_id), count(*) FROM _meds_export").fetchall()[0]
    codes = _write_codes(con, root, params)
    written = {task: _write_labels(con, dataset, task, root) for task in labels}
    _write_dataset_json(dataset, root)
    return ExportResult(dataset, root, subjects, events, shards, codes, written)


def _write_labels(con, dataset: str, task: str, root: Path) -> int:
    """labels/<task>/<split>/<k>.parquet: the task's labels, each in the shard named like its subject's data
    shard. Refused (nothing written) when a sample has no prediction time, its subject has no data, or a label
    could see its own outcome at or before its prediction time (medtx.meds.labels.outcome_leak)."""
    params = {"dataset": dataset}
    missing = missing_time_count(con, task, dataset)
    if missing:
        raise ExportError(f"--labels {task}: {missing} sample(s) of {dataset!r} have no prediction time; "
                          "nothing was written")
    con.execute(f"CREATE OR REPLACE TEMP TABLE _meds_labels AS {label_sql(con, task)}", params)
    try:
        orphans = con.sql("SELECT count(*), min(subject_id) FROM _meds_labels "
                          "WHERE subject_id NOT IN (SELECT subject_id FROM _meds_shards)").fetchall()[0]
        if orphans[0]:
            raise ExportError(f"--labels {task}: {orphans[0]} label(s) of subjects without exported events "
                              f"(first: subject {orphans[1]}); nothing was written")
        leak = outcome_leak(con, task, "_meds_labels", "_meds_export")
        if leak:
            raise ExportError(f"--labels {task}: {leak}; nothing was written")
        mismatch = split_mismatch(con, dataset, task)
        if mismatch:
            raise ExportError(f"--labels {task}: {mismatch}; nothing was written")
        folder = root / "labels" / task
        folder.mkdir(parents=True)
        n = 0
        for split, shard in con.sql("SELECT DISTINCT split, shard FROM _meds_labels JOIN _meds_shards "
                                    "USING (subject_id) ORDER BY 1, 2").fetchall():
            path = folder / split / f"{int(shard)}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            copy_parquet(con, f"""
                SELECT l.subject_id, l.prediction_time, l.boolean_value
                FROM _meds_labels l JOIN _meds_shards s USING (subject_id)
                WHERE s.split = $split AND s.shard = {int(shard)} ORDER BY 1, 2""",
                         path, LABEL_ARROW_SCHEMA, {"split": split})
            n += _count_rows(con, path)
        return n
    finally:
        con.execute("DROP TABLE IF EXISTS _meds_labels")


def _write_codes(con, root: Path, params: dict) -> int:
    """metadata/codes.parquet: every code of the data, plus the ATC levels above the mapped drugs.

    Descriptions: ICD-9 long titles, WHO ATC names, an NDC's most frequent drug name. parent_codes: an NDC's
    mapped ATC-3 class(es) as `ATC//<code>`, an ATC code's next level up (ATC-3 -> ATC-2 -> ATC-1)."""
    select_sql = """
        WITH used AS (SELECT DISTINCT code FROM _meds_export),
        ndc_atc AS (
            SELECT 'MEDICATION//NDC//' || trim(ndc) AS code, list(DISTINCT 'ATC//' || atc3 ORDER BY 'ATC//' || atc3) AS parents
            FROM core.prescriptions_atc3 WHERE dataset = $dataset AND ndc IS NOT NULL GROUP BY 1
        ), ndc_name AS (   -- the most frequent drug name of an NDC; a tie goes to the first name in sort order
            SELECT code, drug AS name FROM (
                SELECT 'MEDICATION//NDC//' || trim(ndc) AS code, drug, count(*) AS n
                FROM raw.prescriptions WHERE dataset = $dataset AND ndc IS NOT NULL AND drug IS NOT NULL GROUP BY 1, 2)
            QUALIFY row_number() OVER (PARTITION BY code ORDER BY n DESC, drug) = 1
        ), atc_used AS (   -- the mapped ATC-3 classes and every level above them
            SELECT DISTINCT a.atc_code, a.atc_name, a.level FROM ref.atc a
            JOIN (SELECT DISTINCT atc3 FROM core.prescriptions_atc3 WHERE dataset = $dataset) m
              ON a.level <= 3 AND starts_with(m.atc3, a.atc_code)
        )
        SELECT u.code,
               coalesce(dx.long_title, px.long_title, ndc_name.name,
                        CASE u.code WHEN $age_code THEN 'age in years at the admission (numeric_value)' END)
                   AS description,
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
    copy_parquet(con, select_sql, path, CODES_ARROW_SCHEMA, {**params, "age_code": AGE})
    return _count_rows(con, path)


def _to_meds_split_sql() -> str:
    """`WHEN medtx split THEN MEDS split` from the code constant TO_MEDS_SPLIT."""
    return " ".join(f"WHEN {sql_literal(k)} THEN {sql_literal(v)}" for k, v in TO_MEDS_SPLIT.items())


def subject_splits(con, dataset: str, subjects: Sequence[int]) -> dict[int, str]:
    """subject -> medtx split (train/val/test) for the exported subjects: the dataset's one patient split as the
    samples stage stored it (`samples.patient_splits`, the split of every medtx task), else (samples not built
    yet) the same draw the samples stage would make with the default seed. Subjects the stored split lacks (a
    patient ingested after the samples were built) get a seeded draw among themselves, logged."""
    stored = dict(con.execute("SELECT subject_id, split FROM samples.patient_splits WHERE dataset = ?",
                              [dataset]).fetchall())
    if not stored:
        return draw_patient_splits(con, dataset, DEFAULT_SEED)
    seed = con.execute("SELECT min(seed) FROM samples.patient_splits WHERE dataset = ?", [dataset]).fetchall()[0][0]
    rest = [s for s in subjects if s not in stored]
    if rest:
        log.warning("MEDS export [%s]: %d subject(s) have no stored patient split (ingested after the samples "
                    "were built; first: %s): drawn apart, rebuild the samples to fix", dataset, len(rest), rest[0])
    return {**stored, **assign_splits(rest, seed)}


def _write_splits(con, dataset: str, root: Path) -> None:
    """subject_splits.parquet (one MEDS split per subject: the dataset's patient split, the split of every medtx
    task) and medtx_task_splits.parquet (each EHR task's samples.splits rows; equal to it unless the dataset came
    from MEDS with per-task splits); leaves the temp table _meds_subject_split (subject_id, split as MEDS names
    it) for the sharding and the label check."""
    subjects = [r[0] for r in con.sql("SELECT DISTINCT subject_id FROM _meds_export ORDER BY 1").fetchall()]
    splits = subject_splits(con, dataset, subjects)
    frame = pa.table({"subject_id": pa.array(subjects, pa.int64()),
                      "split": [TO_MEDS_SPLIT[splits[s]] for s in subjects]})
    con.register("_meds_subject_split_frame", frame)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _meds_subject_split AS "
                    "SELECT subject_id, split FROM _meds_subject_split_frame")
    finally:
        con.unregister("_meds_subject_split_frame")
    copy_parquet(con, "SELECT subject_id, split FROM _meds_subject_split ORDER BY subject_id",
                 root / "metadata" / "subject_splits.parquet", SPLITS_ARROW_SCHEMA)
    ehr_tasks = [t.name for t in all_tasks() if t.family == "ehr" and t.lineage.build is not None]
    copy_parquet(con, f"SELECT subject_id, task, CASE split {_to_meds_split_sql()} END AS split "
                      "FROM samples.splits WHERE dataset = $dataset AND task IN (SELECT unnest($tasks)) "
                      "ORDER BY task, subject_id",
                 root / "metadata" / "medtx_task_splits.parquet", TASK_SPLITS_ARROW_SCHEMA,
                 {"dataset": dataset, "tasks": ehr_tasks})


def split_mismatch(con, dataset: str, task: str) -> str | None:
    """None, or one line: subjects whose split in the task (samples.splits of the task that builds its samples)
    differs from their MEDS split (`_meds_subject_split`), so that the task's labels would sit in another MEDS
    split than medtx's own train/val/test for them (samples built by an older medtx with per-task splits, or a
    dataset imported from MEDS with per-task splits)."""
    builder = get_task(task).samples_task
    n, first = con.execute(f"""
        SELECT count(*), min(t.subject_id) FROM samples.splits t JOIN _meds_subject_split m USING (subject_id)
        WHERE t.dataset = $dataset AND t.task = $task AND CASE t.split {_to_meds_split_sql()} END <> m.split""",
                           {"dataset": dataset, "task": builder}).fetchall()[0]
    if not n:
        return None
    return (f"{n} subject(s) sit in another split in task {builder!r} than in subject_splits.parquet (first: "
            f"subject {first}); rebuild the samples (`medtx build-samples`) so every task uses the dataset's one "
            "patient split")


def data_version(root: Path) -> str:
    """The exported data's fingerprint: SHA-256 over the data shards, codes and split files (names and bytes),
    labels left out. The export is byte-identical when the data are, so the same data give the same version."""
    from medtx.store.hashing import file_sha256

    files = sorted(p for p in [*(root / "data").rglob("*.parquet"), *(root / "metadata").glob("*.parquet")])
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(root).as_posix()}:{file_sha256(path)}\n".encode())
    return f"sha256:{digest.hexdigest()[:16]}"


def _write_dataset_json(dataset: str, root: Path) -> None:
    meta = {
        "dataset_name": dataset,
        "dataset_version": data_version(root),
        "etl_name": "medtx",
        "etl_version": medtx.__version__,
        "meds_version": MEDS_VERSION,
        "created_at": datetime.now().isoformat(timespec="seconds"),
        "raw_source_id_columns": ["hadm_id"],
        "other_extension_columns": [c for c in EXTRA_COLUMNS if c != "hadm_id"],
    }
    (root / "metadata" / "dataset.json").write_text(json.dumps(meta, indent=2) + "\n")
