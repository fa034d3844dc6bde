"""Re-analyse every completed run of a warehouse with this checkout's code and compare the analysis tables with
what the warehouse stores: a check that an analysis speed-up changed no figure.

    python benchmarks/reanalyse_equal.py WAREHOUSE.duckdb [--digits 9]

Works on a copy (the warehouse is only read). Runs `analyse_run` on each completed run in start order, then for
each of the ten analysis tables counts rows that differ bit for bit, and rows that differ once every DOUBLE column
is rounded to `--digits` decimals (every other column compared exactly), both ways (`EXCEPT ALL`); prints up to 3
differing rows each way. Exit status 1 when any row differs beyond the rounding.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from medtx.evaluation.analysis import analyse_run  # noqa: E402
from medtx.store.db import connect, quote_ident, quote_table  # noqa: E402

TABLES = ("ml.subgroups", "ml.subgroup_gaps", "ml.calibration", "ml.reliability", "ml.operating_points",
          "ml.recalibration", "ml.operating_targets", "ml.decision_curve", "ml.comparisons", "ml.metrics")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("warehouse", type=Path)
    parser.add_argument("--digits", type=int, default=9)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="medtx-reanalyse-"))
    try:
        shutil.copy(args.warehouse, work / "w.duckdb")
        con = connect(work / "w.duckdb")
        runs = [r for r, in con.execute(
            "SELECT run_id FROM ml.runs WHERE status = 'completed' ORDER BY started_at").fetchall()]
        started = time.perf_counter()
        for run_id in runs:
            analyse_run(con, run_id)
        print(f"analysed {len(runs)} runs in {time.perf_counter() - started:.1f} s")
        con.execute("ATTACH ? AS stored (READ_ONLY)", [str(args.warehouse.resolve())])
        differ = 0
        for table in TABLES:
            schema, name = table.split(".")
            cols = con.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_catalog = "
                               "current_database() AND table_schema = ? AND table_name = ? ORDER BY ordinal_position",
                               [schema, name]).fetchall()
            proj_sql = ", ".join(f"round({quote_ident(c)}, {int(args.digits)}) AS {quote_ident(c)}"
                                 if kind == "DOUBLE" else quote_ident(c) for c, kind in cols)
            new_sql, old_sql = quote_table(table), quote_table(f"stored.{table}")
            bits = con.execute(f"SELECT count(*) FROM (SELECT * FROM {new_sql} EXCEPT ALL "
                               f"SELECT * FROM {old_sql})").fetchall()[0][0]
            ways = []
            for a_sql, b_sql in ((new_sql, old_sql), (old_sql, new_sql)):
                diff_sql = f"SELECT {proj_sql} FROM {a_sql} EXCEPT ALL SELECT {proj_sql} FROM {b_sql}"
                ways.append((con.execute(f"SELECT count(*) FROM ({diff_sql})").fetchall()[0][0],
                             con.execute(f"{diff_sql} LIMIT 3").fetchall()))
            differ += ways[0][0] + ways[1][0]
            rows = con.execute(f"SELECT count(*) FROM {new_sql}").fetchall()[0][0]
            print(f"{table}: {rows} rows; bit-different {bits}; beyond {args.digits} digits: new-not-stored "
                  f"{ways[0][0]}, stored-not-new {ways[1][0]}")
            for count, examples in ways:
                for row in examples if count else ():
                    print("   ", str(row)[:300])
        con.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("DIFFERENT" if differ else f"SAME to {args.digits} digits")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
