"""Do two warehouses hold the same results? Every ml.metrics row and every prediction, keyed by (task, dataset,
model, seed), compared exactly — for checking that a refactor changed no number.

    .venv/bin/python benchmarks/compare_runs.py BEFORE.duckdb AFTER.duckdb

Typical use: run `medtx pipeline --config config/default.yaml --db X/warehouse.duckdb` on two checkouts (e.g. two
git worktrees, each with PYTHONPATH pointing at it), then compare. Prints the counts, how many rows are identical,
and the first differing rows; exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import sys

import duckdb

from medtx.store.db import quote_ident

METRICS = ("SELECT r.task, r.dataset, r.model, r.seed, m.* EXCLUDE (run_id) "
           "FROM ml.metrics m JOIN ml.runs r USING (run_id)")


def _load(path: str) -> tuple[list[str], list[tuple], int | None, int, list[tuple]]:
    with duckdb.connect(path, read_only=True) as con:
        rel = con.sql(METRICS)
        columns, rows = [c[0] for c in rel.description], rel.fetchall()
        pcols = [c[0] for c in con.sql("SELECT * FROM ml.predictions LIMIT 0").description if c[0] != "run_id"]
        columns_sql = ", ".join(f"p.{quote_ident(c)}" for c in pcols)
        digest = con.sql(f"SELECT sum(hash(r.task, r.dataset, r.model, r.seed, {columns_sql})) "
                         "FROM ml.predictions p JOIN ml.runs r USING (run_id)").fetchall()[0][0]
        n_pred = con.sql("SELECT count(*) FROM ml.predictions").fetchall()[0][0]
        runs = con.sql("SELECT status, count(*) FROM ml.runs GROUP BY 1 ORDER BY 1").fetchall()
    return columns, sorted(rows, key=repr), digest, n_pred, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    cols, before, digest_b, n_b, runs_b = _load(args.before)
    cols_a, after, digest_a, n_a, runs_a = _load(args.after)
    if cols != cols_a:
        print(f"ml.metrics columns differ: {cols} vs {cols_a}")
        return 1
    only_b, only_a = set(before) - set(after), set(after) - set(before)
    test = sum(1 for r in before if r[cols.index("split")] == "test")
    print(f"runs:        {runs_b}  |  {runs_a}")
    print(f"metric rows: {len(before):,} | {len(after):,} (test rows {test:,}); "
          f"identical {len(set(before) & set(after)):,}, only before {len(only_b)}, only after {len(only_a)}")
    print(f"predictions: {n_b:,} | {n_a:,}; content hash {'equal' if digest_b == digest_a else 'DIFFERENT'}")
    for row in sorted(only_b, key=repr)[:10]:
        print("  before:", row)
    for row in sorted(only_a, key=repr)[:10]:
        print("  after: ", row)
    return 0 if not only_a and not only_b and digest_a == digest_b and n_a == n_b else 1


if __name__ == "__main__":
    sys.exit(main())
