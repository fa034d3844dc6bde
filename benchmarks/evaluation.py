"""Per-run evaluation of full-scale binary runs, before vs after, side by side (issue 35).

    git worktree add /tmp/evalbase <base commit>
    python benchmarks/evaluation.py --db /tmp/fs-work2/warehouse.duckdb --base /tmp/evalbase \\
        --run mortality.most_frequent.synth_46520.s0.dee3832f --run mortality.transformer.synth_46520.s0.7a26162a \\
        --stale-run mortality.gru.synth_46520.s0.d4140db2 --stale-run mortality.transformer.synth_46520.s0.7a26162a \\
        --stale-run mortality.oracle.synth_46520.s0.322a6236 --repeats 2

What the writer does when it records a run (`medtx.evaluation.analysis.analyse_run`: the test intervals, the paired
comparisons against the reference baseline, the subgroups, calibration, operating points and decision curve),
timed on a private copy of a warehouse a full-scale pipeline filled, once with the code of `--base` (a worktree of
the commit before) and once with this checkout, in child processes (PYTHONPATH selects the code; imports are not
timed), interleaved base/head/head/base... `--stale-run`: one more case, the first `--run` recorded while these
runs' per-group verdicts name another reference (what happens in a pipeline when a new reference baseline is
recorded: their verdicts are recomputed). Every case's result rows (ml.metrics, ml.comparisons and the six trust
tables of the runs concerned) are compared between base and head, bit for bit. Prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("metrics", "comparisons", "subgroups", "subgroup_gaps", "calibration", "reliability", "operating_points",
          "decision_curve")


def child(db: Path, run_id: str, stale: list[str], out: Path) -> None:
    """Time analyse_run(run_id) on `db` (after marking `stale` runs' verdicts as naming another reference) and
    write the rows it concerns to `out`; prints {"seconds", "cpu"} as JSON."""
    import duckdb

    from medtx.evaluation.analysis import analyse_run
    from medtx.store.db import quote_table

    con = duckdb.connect(str(db))
    try:
        if stale:
            con.execute("UPDATE ml.subgroups SET reference_run_id = 'old', diff = NULL, verdict = NULL "
                        "WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [stale])
        started, cpu = time.perf_counter(), time.process_time()
        analyse_run(con, run_id)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        ids = [run_id, *stale]
        out.mkdir(parents=True, exist_ok=True)
        for table in TABLES:
            con.sql(f"SELECT * FROM {quote_table('ml.' + table)} WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
                    "ORDER BY ALL", params=[ids]).pl().write_parquet(out / f"{table}.parquet")
    finally:
        con.close()
    print(json.dumps({"seconds": seconds, "cpu": cpu}))


def identical(a: Path, b: Path) -> tuple[bool, int]:
    """(every table's rows equal bit for bit, NaN equal to NaN; rows compared)."""
    import numpy as np
    import polars as pl

    same, rows = True, 0
    for table in TABLES:
        x, y = pl.read_parquet(a / f"{table}.parquet"), pl.read_parquet(b / f"{table}.parquet")
        rows += x.height
        if x.shape != y.shape or x.columns != y.columns:
            return False, rows
        for column in x.columns:
            if x[column].dtype.is_float():
                u, v = x[column].to_numpy(), y[column].to_numpy()
                same &= bool(np.array_equal(u.view(np.int64), v.view(np.int64)) or np.array_equal(u, v, equal_nan=True))
            else:
                same &= x[column].to_list() == y[column].to_list()
    return same, rows


def timed(code: Path, db: Path, run_id: str, stale: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--db", str(db), "--run", run_id,
           "--out", str(out), *(a for s in stale for a in ("--stale-run", s))]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=code)
    if done.returncode != 0:
        raise SystemExit(f"{code}: analyse_run {run_id} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["load"] = os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, required=True, help="a warehouse a full-scale pipeline filled (read only)")
    parser.add_argument("--base", type=Path, help="a worktree of the commit to compare with")
    parser.add_argument("--run", action="append", required=True, help="a recorded binary run (repeatable)")
    parser.add_argument("--stale-run", action="append", default=[])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.db, args.run[0], args.stale_run, args.out)
    if args.base is None:
        parser.error("--base is required")
    cases = [(r, []) for r in args.run] + ([(args.run[0], args.stale_run)] if args.stale_run else [])
    sides = {"base": args.base.resolve(), "head": ROOT}
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    base = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=args.base).stdout
    print(f"# per-run evaluation (analyse_run), base {base.strip()} vs head {head.strip()} (+ uncommitted), "
          f"{os.cpu_count()} CPUs; start: {uptime}")
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="evalbench-") as tmp:
        for repeat in range(args.repeats):
            for c, (run_id, stale) in enumerate(cases):
                order = ("base", "head") if (repeat + c) % 2 == 0 else ("head", "base")
                for side in order:
                    db = Path(tmp) / f"{side}.duckdb"
                    shutil.copy(args.db, db)  # a fresh copy: every timing starts from the stored state
                    out = Path(tmp) / f"{side}-{c}-{repeat}"
                    results.setdefault((c, side), []).append(timed(sides[side], db, run_id, stale, out))
                    db.unlink()
        rows = []
        for c, (run_id, stale) in enumerate(cases):
            same = [identical(Path(tmp) / f"base-{c}-{r}", Path(tmp) / f"head-{c}-{r}") for r in range(args.repeats)]
            rows.append((c, run_id, stale, all(s for s, _ in same), same[0][1]))
    print("\n| case | base s (each repeat) | head s (each repeat) | base CPU s | head CPU s | speed-up | rows identical |")
    print("|---|---|---|---:|---:|---:|---|")
    for c, run_id, stale, same, n_rows in rows:
        b, h = results[(c, "base")], results[(c, "head")]
        name = run_id + (f" + {len(stale)} stale runs' verdicts" if stale else "")
        best_b, best_h = min(x["seconds"] for x in b), min(x["seconds"] for x in h)
        walls = [" / ".join(f"{x['seconds']:.1f}" for x in side) for side in (b, h)]
        print(f"| {name} | {walls[0]} | {walls[1]} | {min(x['cpu'] for x in b):.1f} | {min(x['cpu'] for x in h):.1f} "
              f"| {best_b / best_h:.1f}x | {'yes' if same else 'NO'} ({n_rows} rows) |")
    loads = [x["load"] for v in results.values() for x in v]
    end = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\nload average (1 min) after each timing: {min(loads):.2f}-{max(loads):.2f}; end: {end}")


if __name__ == "__main__":
    main()
