"""The MEDS 0.4 rules `medtx ingest meds` checks before it writes anything.

Every failure is one `MedsFormatError` line naming the file and the rule broken:
- layout: `data/` holds at least one parquet shard; `metadata/dataset.json` and `metadata/codes.parquet` exist;
- column types: subject_id 64-bit integer, time timestamp, code string, numeric_value float, text_value string;
- no null subject_id or code;
- each subject in exactly one shard;
- within a shard, a subject's events are contiguous and sorted by time (static, untimed events first).
The row-level rules run in DuckDB over the loaded events (one scan, no Python loop over rows).
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
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


def find_shards(root: Path) -> list[Path]:
    """The data shards of a MEDS root (`data/**/*.parquet`, sorted), after the layout checks."""
    if not root.is_dir():
        raise MedsFormatError(f"{root}: MEDS source folder does not exist")
    for rel in META_FILES:
        if not (root / rel).is_file():
            raise MedsFormatError(f"{root / rel}: missing (rule: a MEDS dataset has {' and '.join(META_FILES)})")
    shards = sorted((root / "data").rglob("*.parquet")) if (root / "data").is_dir() else []
    if not shards:
        raise MedsFormatError(f"{root / 'data'}: no parquet shard (rule: events live in data/**/*.parquet)")
    return shards


def read_dataset_json(root: Path) -> dict:
    path = root / "metadata" / "dataset.json"
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MedsFormatError(f"{path}: not valid JSON ({exc}) (rule: dataset metadata is a JSON object)") from exc
    if not isinstance(meta, dict):
        raise MedsFormatError(f"{path}: not a JSON object (rule: dataset metadata is a JSON object)")
    return meta


def check_columns(path: Path, required: tuple[str, ...] = REQUIRED) -> pa.Schema:
    """The shard's schema, after the column-type rule."""
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
    return schema


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
    names = set(table.column("split").to_pylist())
    unknown = sorted(str(n) for n in names - set(SPLIT_NAMES))
    if unknown:
        raise MedsFormatError(f"{path}: split value(s) {unknown} are not train/tuning/held_out "
                              "(rule: medtx needs the three MEDS sentinel splits)")
    medtx = pa.array([SPLIT_NAMES[s] for s in table.column("split").to_pylist()], pa.string())
    return table.set_column(table.schema.get_field_index("split"), "split", medtx)
