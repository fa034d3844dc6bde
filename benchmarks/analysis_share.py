"""What share of the default pipeline's wall the per-run analysis takes, for two checkouts side by side (issue 42:
"the whole per-run analysis stays under 10% of each pipeline's wall").

    python benchmarks/analysis_share.py --before /tmp/wt-before --after . [--rounds 1] [--config config/default.yaml]

Runs `medtx pipeline` exactly as a user does (the CLI in a subprocess) with each checkout's code on a fresh
warehouse, caches and Prefect home in a temporary folder, alternating before/after `--rounds` times (the machine
is shared: interleaved runs see the same neighbours). From each run's log it sums the writer's per-run analysis
(`analysis: run R in X s (Y s CPU)`: intervals, paired comparisons, trust figures; wall seconds, and the CPU
seconds of the thread that ran it, which a busy machine inflates less; DuckDB's and BLAS's own threads are not in
it) and the reference-change recomputes inside it (`trust: the reference of T/D is now R: N other run(s)
recomputed in X s`), and prints them beside the pipeline's wall time and the 1-minute load average at start and
end. Both checkouts must log the wall seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.cli_pipeline import run_cli_pipeline  # noqa: E402
ANALYSIS = re.compile(r"analysis: run \S+ in ([0-9.]+) s(?: \(([0-9.]+) s CPU\))?")
RECOMPUTE = re.compile(r"trust: the reference of \S+ is now \S+: (\d+) other run\(s\) recomputed in ([0-9.]+) s")


def run_pipeline(checkout: Path, config: Path, timeout_s: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="medtx-bench-share-"))
    load_before = os.getloadavg()[0]
    try:
        run = run_cli_pipeline(checkout, config, work, timeout_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    analysed = [(float(s), float(c) if c else float("nan")) for s, c in ANALYSIS.findall(run.logs)]
    recomputes = [(int(n), float(s)) for n, s in RECOMPUTE.findall(run.logs)]
    return {"exit": run.exit, "wall": run.wall, "runs": len(analysed), "analysis": sum(s for s, _ in analysed),
            "cpu": sum(c for _, c in analysed),
            "recomputes": len(recomputes), "recomputed_runs": sum(n for n, _ in recomputes),
            "recompute_s": sum(s for _, s in recomputes), "load": (load_before, os.getloadavg()[0]),
            "final": run.final}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the code before the change")
    parser.add_argument("--after", type=Path, default=REPO, help="checkout of the code after it (default: this one)")
    parser.add_argument("--config", type=Path, default=REPO / "config" / "default.yaml")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=3600.0)
    args = parser.parse_args()
    print(f"config {args.config}, {os.cpu_count()} CPU cores; before {args.before}, after {args.after}", flush=True)
    header = (f"{'side':<7}{'exit':>5}{'wall s':>9}{'runs':>6}{'analysis s':>12}{'share':>8}{'CPU s':>8}"
              f"{'share':>8}{'recomputes':>12}"
              f"{'(runs)':>8}{'recompute s':>13}{'load start/end':>17}")
    rows = []
    for _ in range(args.rounds):
        for side, checkout in (("before", args.before), ("after", args.after)):
            r = run_pipeline(checkout.resolve(), args.config.resolve(), args.timeout_s)
            rows.append((side, r))
            print(f"{side}: {r['final']}", flush=True)
    print(header)
    for side, r in rows:
        print(f"{side:<7}{r['exit']:>5}{r['wall']:>9.1f}{r['runs']:>6}{r['analysis']:>12.1f}"
              f"{r['analysis'] / r['wall']:>8.1%}{r['cpu']:>8.1f}{r['cpu'] / r['wall']:>8.1%}"
              f"{r['recomputes']:>12}{r['recomputed_runs']:>8}"
              f"{r['recompute_s']:>13.1f}{r['load'][0]:>9.2f}/{r['load'][1]:.2f}")
    return max(r["exit"] for _, r in rows)


if __name__ == "__main__":
    sys.exit(main())
