"""Run a command and record the memory of every process of its tree, per process, every second (issue 35).

    .venv/bin/python benchmarks/proctree_memory.py --csv var/mem.csv -- .venv/bin/medtx pipeline --config C --db W

Each second: RSS and PSS (`/proc/<pid>/smaps_rollup`; PSS splits a page shared by n processes n ways, summed RSS
counts it n times) of the command and each descendant, with the 1-minute load average, into the CSV. At the end it
prints the tree's peak PSS with each process's share at that moment, and each process's own peaks. Roles are told
from the command lines: the pipeline process, the Prefect server, the spawned training processes.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path


def descendants(pid: int) -> list[int]:
    try:
        kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in descendants(k)]


def rollup(pid: int) -> tuple[int, int, str] | None:
    """(RSS MiB, PSS MiB, command line) of a live process, else None."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) >> 10
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) >> 10
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return rss, pss, cmd[:160]


def role(cmd: str) -> str:
    for needle, name in (("prefect.server", "prefect server"), ("watchdog", "watchdog"),
                         ("resource_tracker", "mp tracker"), ("spawn_main", "training process")):
        if needle in cmd:
            return name
    return "command" if "pipeline" in cmd or "medtx" in cmd else cmd[:40]


def sample(root: int, out: csv.writer, started: float) -> list[tuple]:
    now, load = round(time.monotonic() - started, 1), os.getloadavg()[0]
    rows = []
    for pid in [root, *descendants(root)]:
        got = rollup(pid)
        if got:
            rows.append((now, pid, got[0], got[1], load, role(got[2])))
    out.writerows(rows)
    return rows


def report(sweeps: list[list[tuple]]) -> str:
    sweeps = [s for s in sweeps if s]
    top = max(sweeps, key=lambda s: sum(r[3] for r in s))
    lines = [f"tree peak PSS {sum(r[3] for r in top):,} MiB (RSS {sum(r[2] for r in top):,}) at t={top[0][0]} s, "
             f"load {top[0][4]:.2f}"]
    lines += [f"  {r[5]:17s} pid {r[1]:>7}  RSS {r[2]:>6,}  PSS {r[3]:>6,}" for r in sorted(top, key=lambda r: -r[3])]
    peaks: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for s in sweeps:
        for r in s:
            p = peaks[(r[1], r[5])]
            p[0], p[1] = max(p[0], r[2]), max(p[1], r[3])
    lines.append("each process's peak (MiB):")
    lines += [f"  {name:17s} pid {pid:>7}  RSS {p[0]:>6,}  PSS {p[1]:>6,}"
              for (pid, name), p in sorted(peaks.items(), key=lambda kv: -kv[1][1])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, required=True, help="where the per-process samples go")
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    started = time.monotonic()
    proc = subprocess.Popen(command)
    sweeps = []
    with args.csv.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["t", "pid", "rss_mib", "pss_mib", "load1", "role"])
        while proc.poll() is None:
            sweeps.append(sample(proc.pid, out, started))
            f.flush()
            time.sleep(args.every)
    print(f"exit {proc.returncode} after {time.monotonic() - started:.0f} s; load now {os.getloadavg()[0]:.2f}")
    print(report(sweeps))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
