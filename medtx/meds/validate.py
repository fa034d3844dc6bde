"""The MEDS 0.4 rules `medtx ingest meds` checks before it writes anything.

Every failure is one `MedsFormatError` line naming the file and the rule broken:
- layout: `data/` holds at least one parquet shard (sub-folders reached through symlinks included: read, never
  skipped; a dangling link or a link cycle is an error); `metadata/dataset.json` and `metadata/codes.parquet` exist;
- column types: subject_id 64-bit integer, time timestamp[us] without a time zone, code string, numeric_value
  float32, text_value string, as meds' DataSchema validates them; with `cast_types` (`--cast-types`) also what
  meds' `DataSchema.align` casts: tz-aware -> UTC wall time, nanoseconds only when whole microseconds, float64;
- every shard's rows all read (its parquet footer's row count);
- no null subject_id or code;
- each subject in exactly one shard;
- within a shard, a subject's events are contiguous and sorted by time (static, untimed events first);
- one admission time and one subject per stay (hadm_id): a second admission event at another time would
  silently move the stay;
- split files: no null subject_id or split, one split per subject (per task).
The row-level rules run in DuckDB over the loaded events (one scan, no Python loop over rows).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medtx.store.db import quote_table

META_FILES = ("metadata/dataset.json", "metadata/codes.parquet")
SPLIT_NAMES = {"train": "train", "tuning": "val", "held_out": "test"}


class MedsFormatError(ValueError):
    """A MEDS dataset breaks a rule; the message names the file and the rule. Nothing was written."""


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


# column -> (check, what MEDS asks for)
_TYPES = {
    "subject_id": (lambda t: pa.types.is_int64(t), "int64"),
    "time": (pa.types.is_timestamp, "timestamp"),
    "code": (_is_string, "string"),
    "numeric_value": (pa.types.is_floating, "float32"),
    "text_value": (_is_string, "string"),
}
REQUIRED = ("subject_id", "time", "code")
# What meds' DataSchema itself validates (0.4.1) where _TYPES is wider: `time` exactly timestamp[us] without a time
# zone, `numeric_value` float32. A shard that is only castable is refused unless the import is told to cast.
_EXACT = {
    "time": (lambda t: pa.types.is_timestamp(t) and t.unit == "us" and t.tz is None, "timestamp[us] (no time zone)"),
    "numeric_value": (pa.types.is_float32, "float32"),
}


def find_shards(root: Path) -> list[Path]:
    """The data shards of a MEDS root (`data/**/*.parquet`, sorted), after the layout checks."""
    if not root.is_dir():
        raise MedsFormatError(f"{root}: MEDS source folder does not exist")
    for rel in META_FILES:
        if not (root / rel).is_file():
            raise MedsFormatError(f"{root / rel}: missing (rule: a MEDS dataset has {' and '.join(META_FILES)})")
    shards = shard_files(root / "data") if (root / "data").is_dir() else []
    if not shards:
        raise MedsFormatError(f"{root / 'data'}: no parquet shard (rule: events live in data/**/*.parquet)")
    return shards


def shard_files(data: Path) -> list[Path]:
    """Every `*.parquet` under `data`, following symlinked folders and files (Path.rglob skips symlinked
    folders before Python 3.13: 100 -> 47 patients without a word); a dangling link or a cycle is an error."""
    found: list[Path] = []
    seen: set[str] = set()
    for folder, dirs, files in os.walk(data, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            raise MedsFormatError(f"{folder}: a symlink loop leads back to {real} (rule: events live in "
                                  "data/**/*.parquet)")
        seen.add(real)
        for name in dirs + files:
            path = Path(folder) / name
            if path.is_symlink() and not path.exists():
                raise MedsFormatError(f"{path}: a symlink to {os.readlink(path)}, which does not exist "
                                      "(rule: events live in data/**/*.parquet)")
        found += [Path(folder) / f for f in files if f.endswith(".parquet")]
    return sorted(found)


def read_dataset_json(root: Path) -> dict:
    path = root / "metadata" / "dataset.json"
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MedsFormatError(f"{path}: not valid JSON ({exc}) (rule: dataset metadata is a JSON object)") from exc
    if not isinstance(meta, dict):
        raise MedsFormatError(f"{path}: not a JSON object (rule: dataset metadata is a JSON object)")
    return meta


def check_columns(path: Path, required: tuple[str, ...] = REQUIRED, exact: bool = False) -> pa.Schema:
    """The shard's schema, after the column-type rule; `exact`: also the types meds' DataSchema validates (a
    tz-aware or nanosecond `time`, a float64 `numeric_value` is refused, naming the column and the opt-in)."""
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise MedsFormatError(f"{path}: not a readable parquet file ({exc})") from exc
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise MedsFormatError(f"{path}: missing column(s) {', '.join(missing)} (rule: MEDS data has subject_id, "
                              "time, code)")
    for name, (ok, want) in _TYPES.items():
        if name in schema.names and not ok(schema.field(name).type):
            raise MedsFormatError(f"{path}: column {name!r} is {schema.field(name).type}, MEDS needs {want} "
                                  "(rule: column types)")
    for name, (ok, want) in _EXACT.items() if exact else ():
        if name in schema.names and not ok(schema.field(name).type):
            raise MedsFormatError(f"{path}: column {name!r} is {schema.field(name).type}, meds' DataSchema expects "
                                  f"{want} (rule: column types; pass --cast-types to cast it as meds' "
                                  "DataSchema.align does)")
    return schema


def check_times(path: Path, schema: pa.Schema) -> None:
    """A `time` in nanoseconds is accepted only when every value is a whole microsecond: meds' DataSchema.align
    refuses the lossy cast, and DuckDB would round silently. (Other units and tz-aware times align exactly.)"""
    kind = schema.field("time").type
    if kind.unit != "ns":
        return
    times = pq.read_table(path, columns=["time"]).column("time")
    ints = pc.cast(times, pa.int64())
    lossy = pc.not_equal(pc.remainder(ints, 1000), 0)
    if pc.any(lossy).as_py():
        row = pc.index(lossy, True).as_py()
        ns = ints[row].as_py()
        shown = f"{datetime(1970, 1, 1) + timedelta(seconds=ns // 10**9):%Y-%m-%d %H:%M:%S}.{ns % 10**9:09d}"
        raise MedsFormatError(f"{path}: row {row + 1}: time {shown} has nanoseconds, MEDS times are microseconds "
                              f"(column 'time' is {kind}; rule: column types — meds refuses the lossy cast)")


def check_row_counts(con: duckdb.DuckDBPyConnection, table: str, shards: list[Path]) -> None:
    """Every shard's rows were read: the loaded count per shard equals its parquet footer's row count."""
    loaded = dict(con.sql(f"SELECT _shard, count(*) FROM {quote_table(table)} GROUP BY 1").fetchall())
    for k, path in enumerate(shards):
        want = pq.ParquetFile(path).metadata.num_rows
        if loaded.get(k, 0) != want:
            raise MedsFormatError(f"{path}: {loaded.get(k, 0):,} rows read, its footer says {want:,} "
                                  "(rule: every row of a shard is read)")


def check_stays(con: duckdb.DuckDBPyConnection, shards: list[Path]) -> None:
    """One admission time and one subject per stay, over the loaded events and `_meds_stays` (medtx.meds.tables):
    two admission events of one hadm_id at different times would silently move the stay's admittime."""
    def where(eid: int) -> str:
        return f"{shards[eid >> 40]}: row {(eid & ((1 << 40) - 1)) + 1}"

    row = con.sql("""
        SELECT hadm_id, list(DISTINCT subject_id ORDER BY subject_id), max(_eid)
        FROM _meds_mapped WHERE _target = 'admissions' GROUP BY hadm_id HAVING count(DISTINCT subject_id) > 1
        ORDER BY 3 LIMIT 1""").fetchall()
    if row:
        hadm, subjects, eid = row[0]
        raise MedsFormatError(f"{where(eid)}: stay (hadm_id) {hadm} is admitted for subjects "
                              f"{', '.join(map(str, subjects))} (rule: a stay belongs to one subject)")
    for target, what in (("admissions", "admission"), ("discharges", "discharge")):
        row = con.execute("""
            SELECT subject_id, hadm_id, list(DISTINCT time ORDER BY time), max(_eid)
            FROM _meds_mapped WHERE _target = ? AND hadm_id IS NOT NULL
            GROUP BY subject_id, hadm_id HAVING count(DISTINCT time) > 1 ORDER BY 4 LIMIT 1""", [target]).fetchall()
        if row:
            sid, hadm, times, eid = row[0]
            raise MedsFormatError(
                f"{where(eid)} (subject {sid}): stay (hadm_id) {hadm} has {len(times)} {what} events at different "
                f"times ({', '.join(str(t) for t in times[:3])}); medtx keeps one {what} time per stay, so the "
                f"stay would silently move (rule: one {what} per stay)")


def check_codes_file(root: Path) -> None:
    path = root / "metadata" / "codes.parquet"
    schema = check_columns(path, ("code",))
    if not _is_string(schema.field("code").type):
        raise MedsFormatError(f"{path}: column 'code' is {schema.field('code').type}, MEDS needs string "
                              "(rule: column types)")


def check_events(con: duckdb.DuckDBPyConnection, table: str, shards: list[Path]) -> None:
    """Row rules over the loaded events (columns subject_id, time, code, _shard = index into `shards`,
    _eid = shard << 40 | row in file). Grouped checks first; one window pass for the time order."""
    def where(shard: int, eid: int) -> str:
        return f"{shards[shard]}: row {(eid & ((1 << 40) - 1)) + 1}"

    bad = con.sql(f"SELECT _shard, _eid FROM {quote_table(table)} WHERE subject_id IS NULL OR code IS NULL LIMIT 1").fetchall()
    if bad:
        raise MedsFormatError(f"{where(*bad[0])} has a null subject_id or code (rule: subject_id and code are never null)")
    row = con.sql(f"""
        SELECT subject_id, min(_shard), max(_shard), min(_eid), count(*) = max(_eid) - min(_eid) + 1
        FROM {quote_table(table)} GROUP BY subject_id
        HAVING min(_shard) <> max(_shard) OR count(*) <> max(_eid) - min(_eid) + 1
        ORDER BY min(_shard) <> max(_shard) DESC, min(_eid) LIMIT 1""").fetchall()
    if row:
        sid, first, last, eid, contiguous = row[0]
        if first != last:
            raise MedsFormatError(f"{shards[last]}: subject {sid} also appears in {shards[first]} "
                                  "(rule: each subject sits in exactly one shard)")
        raise MedsFormatError(f"{where(first, eid)} (subject {sid}) breaks the rule: a subject's events are "
                              "contiguous in its shard")
    row = con.sql(f"""
        SELECT _shard, _eid, subject_id FROM (
            SELECT _shard, _eid, subject_id, time, lag(time) OVER w AS prev_time, row_number() OVER w AS pos
            FROM {quote_table(table)} WINDOW w AS (PARTITION BY subject_id ORDER BY _eid))
        WHERE pos > 1 AND ((time IS NULL AND prev_time IS NOT NULL) OR time < prev_time)
        ORDER BY _eid LIMIT 1""").fetchall()
    if row:
        shard, eid, sid = row[0]
        raise MedsFormatError(f"{where(shard, eid)} (subject {sid}) breaks the rule: a subject's events are sorted "
                              "by time, untimed (static) events first")


def split_rows(path: Path, with_task: bool) -> pa.Table:
    """subject_splits.parquet (or medtx_task_splits.parquet) checked and with medtx split names."""
    need = ("subject_id", "task", "split") if with_task else ("subject_id", "split")
    schema = check_columns(path, need)
    if not _is_string(schema.field("split").type):
        raise MedsFormatError(f"{path}: column 'split' is {schema.field('split').type}, MEDS needs string "
                              "(rule: column types)")
    table = pq.read_table(path, columns=list(need))
    for col in need:
        nulls = pc.is_null(table.column(col))
        if pc.any(nulls).as_py():
            row = pc.index(nulls, True).as_py()
            raise MedsFormatError(f"{path}: row {row + 1} has a null {col} ({pc.sum(nulls).as_py():,} null(s) in all; "
                                  f"rule: {', '.join(need)} are never null)")
    keys = ["subject_id", "task"] if with_task else ["subject_id"]
    counts = table.group_by(keys).aggregate([("split", "count_distinct")])
    many = counts.filter(pc.greater(counts.column("split_count_distinct"), 1))
    if many.num_rows:
        raise MedsFormatError(f"{path}: subject {many.column('subject_id')[0]} has more than one split "
                              "(rule: one split per subject)")
    names = set(table.column("split").to_pylist())
    unknown = sorted(str(n) for n in names - set(SPLIT_NAMES))
    if unknown:
        raise MedsFormatError(f"{path}: split value(s) {unknown} are not train/tuning/held_out "
                              "(rule: medtx needs the three MEDS sentinel splits)")
    medtx = pa.array([SPLIT_NAMES[s] for s in table.column("split").to_pylist()], pa.string())
    return table.set_column(table.schema.get_field_index("split"), "split", medtx)
