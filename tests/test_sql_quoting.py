"""Issue 12, case 6: no SQL is built by string formatting from values. Values are bound as parameters;
identifiers and the few literals DuckDB takes no parameter for go through the one quoting helper in
medtx/store/db.py. A scan of the code (AST) fails on any f-string, `.format` or `%` SQL that interpolates
anything else; and publish works from a warehouse whose path holds quotes."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from medtx.store.db import connect, quote_ident, quote_table, sql_literal
from tests.conftest import REPO_ROOT

SCANNED = ("medtx", "flows", "dashboard", "benchmarks")
_SQL = re.compile(
    r"\b(SELECT|INSERT|DELETE|UPDATE|CREATE|DROP|ATTACH|DETACH|COPY|ALTER|FROM|WHERE|PRAGMA|SET|USE|"
    r"VALUES|JOIN|read_csv)\b"
)
# What may be interpolated: the quoting helpers, bind-marker lists, int()/float() numbers, SQL fragments that
# are code constants (UPPER_CASE names), or built from code (never from values) by `*_sql()` functions or held
# in `*_sql` variables: the suffix is the promise a reviewer checks.
_HELPERS = {"quote_ident", "quote_table", "sql_literal", "param_marks", "int", "float"}


def _allowed(node: ast.expr) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        # ", ".join(...) of allowed parts: map(helper, xs), a generator of allowed items, or a constant list
        arg = node.args[0] if node.args else None
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "map":
            return isinstance(arg.args[0], ast.Name) and arg.args[0].id in _HELPERS
        if isinstance(arg, (ast.GeneratorExp, ast.ListComp)):
            return _allowed(arg.elt)
        return arg is not None and _allowed(arg)
    if isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        return name in _HELPERS or name.endswith("_sql")
    if isinstance(node, ast.Name):  # a code constant, or a variable named as a trusted SQL fragment
        return node.id.isupper() or node.id.endswith("_sql")
    if isinstance(node, ast.Attribute):
        return node.attr.isupper() or node.attr.endswith("_sql")
    if isinstance(node, ast.IfExp):  # f"{'a' if x else 'b'}": both branches must be allowed
        return _allowed(node.body) and _allowed(node.orelse)
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.JoinedStr):  # a nested f-string is checked on its own
        return True
    return False


def _interpolations(node: ast.JoinedStr) -> list[ast.expr]:
    return [v.value for v in node.values if isinstance(v, ast.FormattedValue)]


def violations(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO_ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
                bad = [v for v in _interpolations(node) if not _allowed(v)]
                if _SQL.search(text) and bad:
                    found.append(f"{where}: f-string SQL interpolates {ast.unparse(bad[0])}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
                  and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)
                  and _SQL.search(node.func.value.value)):
                found.append(f"{where}: .format() builds SQL")
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
                  and any(isinstance(side, ast.Constant) and isinstance(side.value, str) and _SQL.search(side.value)
                          for side in (node.left, node.right))
                  and not all(_allowed(side) or isinstance(side, ast.BinOp) for side in (node.left, node.right))):
                found.append(f"{where}: + concatenation builds SQL from {ast.unparse(node)[:60]}")
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant)
                  and isinstance(node.left.value, str) and _SQL.search(node.left.value)):
                found.append(f"{where}: %-formatting builds SQL")
    return found


def _code_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (REPO_ROOT / d).rglob("*.py"))


def test_no_sql_is_formatted_from_values() -> None:
    found = violations(_code_files())
    assert found == [], "\n".join(found)


def test_the_scan_catches_formatted_values(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(con, path, table, n):\n"
        "    con.execute(f\"ATTACH '{path}' AS s\")\n"
        "    con.execute(\"SELECT * FROM {}\".format(table))\n"
        "    con.execute(\"DELETE FROM t WHERE a = '%s'\" % path)\n"
        "    con.execute(f\"SELECT * FROM {quote_table(table)} LIMIT {int(n)}\")\n"
        "    con.execute(\"SELECT * FROM t WHERE \" + path)\n"
        "    print(f'loaded {n} rows from {path}')\n"
    )
    bad = bad.rename(REPO_ROOT / "tests" / f"_scan_probe_{tmp_path.name}.py")
    try:
        found = violations([bad])
    finally:
        bad.unlink()
    assert [f.split(": ", 1)[1] for f in found] == [
        "f-string SQL interpolates path", ".format() builds SQL", "%-formatting builds SQL",
        "+ concatenation builds SQL from 'SELECT * FROM t WHERE ' + path"]


def test_quoting_helpers() -> None:
    assert sql_literal("it's") == "'it''s'"
    assert quote_ident('a"b') == '"a""b"'
    assert quote_table("raw.patients") == '"raw"."patients"'
    con = connect(":memory:", migrate_schema=False)
    assert con.execute(f"SELECT {sql_literal(chr(39) + ' OR 1=1 --')}").fetchall() == [("' OR 1=1 --",)]


def test_publish_and_dashboard_open_a_warehouse_whose_path_has_quotes(tmp_path: Path) -> None:
    from dashboard.queries import open_snapshot as open_dash
    from medtx.publish.snapshot import open_snapshot, publish_snapshot

    folder = tmp_path / "it's \"quoted\""
    folder.mkdir()
    db = folder / "w'h.duckdb"
    with connect(db) as con:
        con.execute("INSERT INTO raw.mtsamples (note_id, medical_specialty) VALUES (1, 'x')")
    snap = publish_snapshot(db, folder / "w'h.snapshot.duckdb")
    with open_snapshot(snap.path) as con:
        assert con.sql("SELECT count(*) FROM raw.mtsamples").fetchall() == [(1,)]
    con = open_dash(snap.path)
    try:
        assert con.sql("SELECT count(*) FROM raw.mtsamples").fetchall() == [(1,)]
    finally:
        con.close()


def test_meds_copy_parquet_writes_to_a_path_with_quotes(tmp_path: Path) -> None:
    """The COPY target and the embedded Arrow schema are bound parameters: a quote in the path is just a path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from medtx.meds.export import _count_rows, copy_parquet

    folder = tmp_path / "it's \"quoted\"'); DROP TABLE x; --"
    folder.mkdir()
    path = folder / "a'b.parquet"
    schema = pa.schema([("subject_id", pa.int64()), ("code", pa.large_string())])
    con = connect(":memory:", migrate_schema=False)
    copy_parquet(con, "SELECT CAST(range AS BIGINT) AS subject_id, 'C' || range AS code FROM range($n)", path,
                 schema, {"n": 3})
    assert _count_rows(con, path) == 3
    assert pq.read_schema(path).field("code").type == pa.large_string()  # the bound KV_METADATA schema took
