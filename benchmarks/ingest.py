"""Ingest throughput: rows/s and peak RSS per MIMIC-III table, plus the five core tables in one process.

    python benchmarks/ingest.py                      # full MIMIC-III scale synthetic cohort (46,520 patients)
    python benchmarks/ingest.py --patients 2000      # smaller synthetic cohort
    python benchmarks/ingest.py --source DIR         # any MIMIC-III folder (e.g. your full MIMIC-III)

Each table is loaded in a fresh subprocess so its peak RSS is its own; then all five core tables are loaded
in one process, as `medtx ingest mimic3` does. Target (issue 2): < 60 s and < 2 GB peak RSS on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from medtx.ingest import CORE_MIMIC3_TABLES, ingest_mimic3_table
from medtx.settings import get_settings

FULL_MIMIC3_PATIENTS = 46_520


def _peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux carries that over from
    the parent across fork+exec, so a worker would report the (larger) parent's peak."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # elsewhere: KiB on Linux, bytes on macOS


def run_tables(db: Path, source: str, tables: list[str]) -> dict:
    """Ingest `tables` in this process; return rows, seconds and this process's peak RSS."""
    started = time.perf_counter()
    results = [ingest_mimic3_table(db, t, source, "bench", db.parent / "cache") for t in tables]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "rows": sum(r.rows_loaded for r in results),
        "rejected": sum(r.rows_rejected for r in results),
        "bytes": sum(r.file_bytes or 0 for r in results),
        "seconds": time.perf_counter() - started,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _in_subprocess(db: Path, source: str, tables: list[str]) -> dict:
    table_args = [arg for t in tables for arg in ("--table", t)]
    cmd = [sys.executable, __file__, "--worker", "--db", str(db), "--source", source, *table_args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def synthetic_source(n_patients: int) -> Path:
    """A cached synthetic cohort (generated once; the generator is deterministic by seed)."""
    from medtx.synth import generate_mimic3

    folder = get_settings().cache_dir / "bench" / f"synth_{n_patients}"  # under the writable root
    if not (folder / "PRESCRIPTIONS.csv.gz").exists():
        started = time.perf_counter()
        print(f"generating {n_patients:,} synthetic patients into {folder} ...", flush=True)
        generate_mimic3(folder, n_patients, seed=0)
        print(f"  generated in {time.perf_counter() - started:.0f} s", flush=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", help="MIMIC-III folder or URL prefix (default: synthetic cohort)")
    parser.add_argument("--patients", type=int, default=FULL_MIMIC3_PATIENTS, help="synthetic cohort size")
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--table", action="append", help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_tables(args.db, args.source, args.table)))
        return

    source = args.source or str(synthetic_source(args.patients))
    with tempfile.TemporaryDirectory(prefix="medtx-bench-") as tmp:
        db = Path(tmp) / "bench.duckdb"
        print(f"source {source}\n{'table':<16}{'rows':>12}{'rejected':>10}{'MB in':>9}{'seconds':>9}"
              f"{'rows/s':>12}{'CPU s':>8}{'peak RSS MB':>13}")
        for table in CORE_MIMIC3_TABLES:
            m = _in_subprocess(db, source, [table])
            print(f"{table:<16}{m['rows']:>12,}{m['rejected']:>10,}{m['bytes'] / 1e6:>9.1f}{m['seconds']:>9.2f}"
                  f"{m['rows'] / m['seconds']:>12,.0f}{m['cpu_seconds']:>8.1f}{m['peak_rss_mb']:>13,.0f}")
        db.unlink()
        m = _in_subprocess(db, source, list(CORE_MIMIC3_TABLES))
        print(f"{'all five, 1 proc':<16}{m['rows']:>12,}{m['rejected']:>10,}{m['bytes'] / 1e6:>9.1f}"
              f"{m['seconds']:>9.2f}{m['rows'] / m['seconds']:>12,.0f}{m['cpu_seconds']:>8.1f}"
              f"{m['peak_rss_mb']:>13,.0f}")
        verdict = "PASS" if m["seconds"] < 60 and m["peak_rss_mb"] < 2048 else "MISS"
        load = os.getloadavg()[0]
        print(f"target < 60 s and < 2,048 MB peak RSS: {verdict} (load average {load:.1f} on {os.cpu_count()} cores:"
              " wall time depends on what else runs; CPU s includes the import of medtx/duckdb)")


if __name__ == "__main__":
    main()
