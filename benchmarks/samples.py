"""Benchmark: code mapping + every EHR sample builder at full MIMIC-III scale (synthetic, 46,520 patients).

Generates (or reuses) a synthetic cohort with medtx.synth, ingests it into a fresh warehouse, then times
map_codes and build_samples (drug_rec, next_visit, readmission) and records peak RSS. It then times the plain
per-patient Python reference of drug_rec on the same warehouse and prints the speed-up of the set-based
builder. Targets: mapping + builders < 60 s, peak RSS < 4 GB, speed-up >= 20x.

    .venv/bin/python benchmarks/samples.py [--patients 46520] [--seed 0] [--workdir var/bench-samples]
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from medtx.codes import map_codes
from medtx.db import connect
from medtx.ingest import ingest_mimic3
from medtx.samples import build_samples
from medtx.samples.common import create_visits
from medtx.samples.drug_rec import build_drug_rec
from medtx.samples.reference import drug_rec_reference
from medtx.settings import BUNDLED_DATA
from medtx.synth import generate_mimic3


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=46_520)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-samples"))
    args = parser.parse_args()

    source = args.workdir / f"synth_{args.patients}_s{args.seed}"
    if not (source / "PRESCRIPTIONS.csv.gz").exists():
        t = time.perf_counter()
        generate_mimic3(source, args.patients, args.seed)
        print(f"generated {args.patients} patients in {time.perf_counter() - t:.1f}s -> {source}")
    db = args.workdir / "bench.duckdb"
    db.unlink(missing_ok=True)
    dataset = "synth_bench"
    t = time.perf_counter()
    ingest_mimic3(db, source, dataset, args.workdir / "cache")
    print(f"ingest (not part of the target): {time.perf_counter() - t:.1f}s")

    con = connect(db)
    counts = con.sql("SELECT (SELECT count(*) FROM raw.admissions), (SELECT count(*) FROM raw.prescriptions)").fetchall()
    print(f"cohort: {args.patients} patients, {counts[0][0]:,} admissions, {counts[0][1]:,} prescription rows")
    rss_before = peak_rss_gb()
    t0 = time.perf_counter()
    coverage = map_codes(con, BUNDLED_DATA, [dataset])[dataset]
    t1 = time.perf_counter()
    built = build_samples(con, BUNDLED_DATA, ["drug_rec", "next_visit", "readmission"], [dataset])
    t2 = time.perf_counter()
    print(f"map_codes: {t1 - t0:.1f}s ({100 * coverage['mapped'][2]:.1f}% of rows with an NDC mapped)")
    print(f"build_samples: {t2 - t1:.1f}s {dict((k[0], v) for k, v in built.items())}")
    print(f"TOTAL mapping + builders: {t2 - t0:.1f}s (target < 60 s); peak RSS {peak_rss_gb():.2f} GB "
          f"(before: {rss_before:.2f} GB; target < 4 GB)")

    # Speed-up: the drug_rec builder alone vs the per-patient Python reference, both reading the warehouse.
    t = time.perf_counter()
    create_visits(con, dataset)
    n_sql = build_drug_rec(con, dataset, seed=42, fractions=(0.7, 0.1, 0.2), min_count=1)
    sql_s = time.perf_counter() - t
    t = time.perf_counter()
    n_ref = len(drug_rec_reference(con, dataset))
    ref_s = time.perf_counter() - t
    print(f"drug_rec set-based: {sql_s:.2f}s ({n_sql} samples); per-patient Python reference: {ref_s:.2f}s "
          f"({n_ref} samples); speed-up {ref_s / sql_s:.1f}x (target >= 20x)")
    con.close()


if __name__ == "__main__":
    main()
