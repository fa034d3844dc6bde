"""Synthetic cohort generator: wall time and peak memory at 1k, 10k and 46,520 patients (full MIMIC-III size).

Each size runs in a fresh Python process so its peak RSS is its own. Usage:
    nice .venv/bin/python benchmarks/synth.py [--sizes 1000 10000 46520] [--notes] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from medtx.synth import generate_mimic3
t = time.perf_counter()
s = generate_mimic3(Path(sys.argv[1]), int(sys.argv[2]), seed=0, notes=sys.argv[3] == "1")
print(json.dumps({"seconds": time.perf_counter() - t, "rows": s.rows,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_one(out: Path, n_patients: int, notes: bool) -> dict:
    """Generate one cohort in a child process; its time, peak RSS, rows and bytes on disk."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(out), str(n_patients), "1" if notes else "0"],
                          check=True, capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["mb_on_disk"] = sum(p.stat().st_size for p in out.iterdir()) / 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 46_520])
    parser.add_argument("--notes", action="store_true", help="also write NOTEEVENTS")
    parser.add_argument("--out", type=Path, default=None, help="keep the cohorts here (default: temp, deleted)")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="medtx-synth-bench-"))
    header = ("patients", "admissions", "prescriptions", "seconds", "peak RSS MB", "MB on disk")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (9, 10, 13, 8, 11, 10), strict=True)))
    try:
        for n in args.sizes:
            r = run_one(root / f"synth_{n}", n, args.notes)
            print(f"{n:>9,} {r['rows']['ADMISSIONS']:>10,} {r['rows']['PRESCRIPTIONS']:>13,} {r['seconds']:>8.1f} "
                  f"{r['peak_rss_mb']:>11.0f} {r['mb_on_disk']:>10.1f}", flush=True)
    finally:
        if args.out is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
