"""Do two warehouses hold the same samples? Every samples.* table compared row for row (EXCEPT ALL both ways),
for checking that a refactor of the samples stage changed no sample, split, vocabulary, summary or gate verdict.

    .venv/bin/python benchmarks/compare_samples.py BEFORE.duckdb AFTER.duckdb

Typical use: one warehouse with the data ingested and codes mapped, copied twice; `build_samples` run on each copy
by a different checkout (two git worktrees, each with PYTHONPATH pointing at it); then compare. Prints per table
the rows on each side and how many are only before / only after; exits 1 when anything differs. The wall-clock
column `created_at` (when a row was written) is left out.
"""

from __future__ import annotations

import argparse
import sys

import duckdb

from medtx.store.db import quote_ident, sql_literal

WALL_CLOCK = ("created_at",)


def _count(con: duckdb.DuckDBPyConnection, query: str) -> int:
    return con.execute(query).fetchall()[0][0]


def compare(before: str, after: str) -> bool:
    """Print the per-table comparison; True when every samples.* table is equal row for row."""
    con = duckdb.connect()
    con.execute(f"ATTACH {sql_literal(before)} AS a (READ_ONLY)")
    con.execute(f"ATTACH {sql_literal(after)} AS b (READ_ONLY)")
    tables = {}
    for side in ("a", "b"):
        tables[side] = {t for (t,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = ? AND table_schema = 'samples' "
            "AND table_type = 'BASE TABLE'", [side]).fetchall()}
    same = tables["a"] == tables["b"]
    if not same:
        print("tables on one side only:", sorted(tables["a"] ^ tables["b"]))
    total = 0
    for table in sorted(tables["a"] & tables["b"]):
        columns = [c for (c,) in con.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = 'a' AND table_schema = 'samples' "
            "AND table_name = ? ORDER BY ordinal_position", [table]).fetchall() if c not in WALL_CLOCK]
        columns_sql = ", ".join(quote_ident(c) for c in columns)
        a_sql, b_sql = (f"a.samples.{quote_ident(table)}", f"b.samples.{quote_ident(table)}")
        n_a, n_b = _count(con, f"SELECT count(*) FROM {a_sql}"), _count(con, f"SELECT count(*) FROM {b_sql}")
        only_a = _count(con, f"SELECT count(*) FROM (SELECT {columns_sql} FROM {a_sql} "
                             f"EXCEPT ALL SELECT {columns_sql} FROM {b_sql})")
        only_b = _count(con, f"SELECT count(*) FROM (SELECT {columns_sql} FROM {b_sql} "
                             f"EXCEPT ALL SELECT {columns_sql} FROM {a_sql})")
        total += n_a
        same = same and n_a == n_b and only_a == 0 and only_b == 0
        print(f"samples.{table:<22} rows {n_a:>9,} | {n_b:>9,}  only before {only_a}  only after {only_b}  "
              f"({len(columns)} columns)")
    print(f"{len(tables['a'] & tables['b'])} tables, {total:,} rows compared: {'identical' if same else 'DIFFERENT'}")
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    return 0 if compare(args.before, args.after) else 1


if __name__ == "__main__":
    sys.exit(main())
