"""Benchmark: MEDS export and re-import of the 46,520-patient synthetic cohort (full MIMIC-III scale).

Prepares (once, reused from --workdir) the cohort as the README says — `medtx synth mimic3 --patients 46520`,
ingest, map-codes, build-samples — then runs, each in a fresh child process so its peak RSS is its own:
  1. `export_meds` of the dataset (+ readmission labels) into a MEDS folder;
  2. `ingest_meds` of that folder as a second dataset into the same warehouse.
Targets: each < 60 s wall and < 2 GB peak RSS on 2 cores. Also checks that every raw table came back with the
same row count. Prints the load average beside the figures: the machine may be shared.

    .venv/bin/python benchmarks/meds.py [--patients 46520] [--seed 0] [--workdir var/bench-meds]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import time
from pathlib import Path

DATASET = "synth_bench"
COPY = "synth_bench_meds"
TABLES = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions")


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process: on a shared machine, wall time / CPU time says how much
    of the wall time was waiting for a core."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def prepare(source: Path, db: Path, patients: int, seed: int) -> None:
    """Cohort generated when missing, then ingest + map-codes + build-samples into a fresh warehouse."""
    from medtx.codes import map_codes
    from medtx.store.db import connect
    from medtx.ingest import ingest_mimic3
    from medtx.tasks import names_of_family
    from medtx.tasks.build import build_samples
    from medtx.settings import BUNDLED_DATA
    from medtx.synth import generate_mimic3

    if not (source / "PRESCRIPTIONS.csv.gz").exists():
        generate_mimic3(source, patients, seed)
    db.unlink(missing_ok=True)
    t = time.perf_counter()
    ingest_mimic3(db, source, DATASET, db.parent / "cache")
    con = connect(db)
    try:
        map_codes(con, BUNDLED_DATA, [DATASET])
        build_samples(con, BUNDLED_DATA, list(names_of_family("ehr")), [DATASET])
    finally:
        con.close()
    print(f"prepared (ingest + map-codes + build-samples, not timed for the target): {time.perf_counter() - t:.1f}s")


def export_child(db: Path, out: Path, queue) -> None:
    from medtx.store.db import connect
    from medtx.meds import export_meds

    t = time.perf_counter()
    con = connect(db)
    try:
        r = export_meds(con, DATASET, out, labels=["readmission"], overwrite=True)
    finally:
        con.close()
    queue.put({"seconds": time.perf_counter() - t, "cpu_s": _cpu_s(), "peak_gb": _peak_rss_gb(), "subjects": r.subjects,
               "events": r.events, "shards": len(r.shards), "codes": r.codes, "labels": r.labels})


def import_child(db: Path, out: Path, queue) -> None:
    from medtx.meds import ingest_meds

    t = time.perf_counter()
    r = ingest_meds(db, out, COPY)
    queue.put({"seconds": time.perf_counter() - t, "cpu_s": _cpu_s(), "peak_gb": _peak_rss_gb(), "events": r.events,
               "mapped": r.events_mapped, "rows": r.rows})


def in_child(target, *args) -> dict:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    result = queue.get()
    proc.join()
    if proc.exitcode:
        raise SystemExit(f"{target.__name__} failed with exit code {proc.exitcode}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=46_520)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-meds"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    source = args.workdir / f"synth_{args.patients}_seed{args.seed}"
    db, out = args.workdir / "warehouse.duckdb", args.workdir / "meds"
    prep = multiprocessing.get_context("spawn").Process(target=prepare, args=(source, db, args.patients, args.seed))
    prep.start()
    prep.join()
    if prep.exitcode:
        raise SystemExit("prepare failed")
    shutil.rmtree(out, ignore_errors=True)
    exp = in_child(export_child, db, out)
    size_mb = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1024**2
    print(f"export: {exp['subjects']:,} subjects, {exp['events']:,} events, {exp['shards']} shard(s), "
          f"{exp['codes']:,} codes, labels {exp['labels']}, {size_mb:.0f} MB on disk")
    print(f"  wall {exp['seconds']:.1f}s ({exp['cpu_s']:.1f} CPU-s), peak RSS {exp['peak_gb']:.2f} GB (target < 60 s, < 2 GB)")
    imp = in_child(import_child, db, out)
    print(f"import: {imp['events']:,} events, {imp['mapped']:,} mapped; rows {imp['rows']}")
    print(f"  wall {imp['seconds']:.1f}s ({imp['cpu_s']:.1f} CPU-s), peak RSS {imp['peak_gb']:.2f} GB (target < 60 s, < 2 GB)")
    from medtx.store.db import connect, quote_table

    con = connect(db, read_only=True)
    try:
        for table in TABLES:
            a, b = (con.execute(f"SELECT count(*) FROM {quote_table('raw.' + table)} WHERE dataset = ?", [d]).fetchall()[0][0]
                    for d in (DATASET, COPY))
            print(f"  raw.{table}: original {a:,}, re-imported {b:,}{'' if a == b else '  <-- DIFFERS'}")
    finally:
        con.close()
    print(f"load average {os.getloadavg()} on {os.cpu_count()} cores (shared machine)")


if __name__ == "__main__":
    main()
