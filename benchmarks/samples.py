"""Benchmark: code mapping + every EHR sample builder at full MIMIC-III scale (synthetic, 46,520 patients).

Generates (or reuses) a synthetic cohort with medtx.synth and ingests it into a fresh warehouse in a child
process (so the peak RSS printed is that of mapping + builders alone). Then, in this process:
- the reference tables (`ref.*`, dataset-independent, loaded once per warehouse: the pipeline's `reference`
  step) are timed on their own;
- the target: `map_prescriptions` + `build_samples(drug_rec, next_visit, readmission)`, < 60 s, peak RSS < 4 GB;
- the speed-up of the set-based drug_rec over the plain per-patient Python reference, compared two ways:
  A. end to end from the warehouse: both read raw.* + core.prescriptions_atc3 and produce every sample
     (set-based: create_visits + DRUG_REC_SQL into a temp table; reference: fetch rows + per-patient loops);
  B. task function only, from the same in-memory per-visit input (the visits table built once; set-based:
     DRUG_REC_SQL over it; reference: `drug_recommendation_fn` over the same visits fetched into Python).
  Both sides' samples are checked equal. Target >= 20x.
- optionally (`--pyhealth-python PY`, an interpreter with PyHealth 1.1.6, see benchmarks/pyhealth_drug_rec.py):
  C. end to end from the same plain CSV files: medtx (ingest the five tables + reference tables + map codes +
     build drug_rec, in a fresh child process and warehouse) against PyHealth 1.1.6 itself (`MIMIC3Dataset` +
     `drug_recommendation_mimic3_fn`, without its NDC->ATC mapping, which needs the network: a lower bound).
  The same comparison with PyHealth 2.1.0 (Python >= 3.12), side by side with sample equality checked:
  benchmarks/samples_pyhealth2.py.

    .venv/bin/python benchmarks/samples.py [--patients 46520] [--seed 0] [--workdir var/bench-samples]
                                           [--pyhealth-python /tmp/pyhealth-venv/bin/python]
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from medtx.codes.mapping import map_prescriptions
from medtx.codes.reference import load_reference_tables
from medtx.store.db import connect
from medtx.ingest import CORE_MIMIC3_TABLES
from medtx.tasks.build import build_samples
from medtx.samples.common import VISITS_TABLE, create_visits
from medtx.tasks.drug_rec import DRUG_REC_SQL
from medtx.samples.reference import drug_rec_reference, drug_recommendation_fn
from medtx.settings import BUNDLED_DATA

DATASET = "synth_bench"
COLS = ("subject_id", "hadm_id", "visit_index", "conditions", "procedures", "drugs_hist", "drugs")


def peak_rss_gb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def prepare(source: Path, db: Path, cache: Path, patients: int, seed: int) -> None:
    """Generate the cohort when missing and ingest it into a fresh warehouse (child process)."""
    from medtx.ingest import ingest_mimic3
    from medtx.synth import generate_mimic3

    if not (source / "PRESCRIPTIONS.csv.gz").exists():
        t = time.perf_counter()
        generate_mimic3(source, patients, seed)
        print(f"generated {patients} patients in {time.perf_counter() - t:.1f}s -> {source}")
    db.unlink(missing_ok=True)
    t = time.perf_counter()
    ingest_mimic3(db, source, DATASET, cache)
    print(f"ingest (not part of the target): {time.perf_counter() - t:.1f}s")


def timed(fn):
    """(result, seconds) of calling fn()."""
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def sql_samples(con) -> list[dict]:
    """The temp table `_bench_drug_rec` as comparable dicts (untimed)."""
    rows = con.sql(f"SELECT {', '.join(COLS)} FROM _bench_drug_rec ORDER BY subject_id, visit_index").fetchall()
    return [dict(zip(COLS, r, strict=True)) for r in rows]


def reference_from_visits(visits: list[tuple]) -> list[dict]:
    """Comparison B, Python side: PyHealth's per-patient task function over already-fetched visits."""
    patients: dict[int, list[dict]] = defaultdict(list)
    for subject_id, hadm_id, admittime, conditions, procedures, drugs in visits:
        patients[subject_id].append({"subject_id": subject_id, "hadm_id": hadm_id, "admittime": admittime,
                                     "conditions": conditions, "procedures": procedures, "drugs": drugs})
    samples = []
    for subject_id in sorted(patients):
        samples.extend(drug_recommendation_fn(patients[subject_id]))  # visits arrive in admittime order
    return samples


def speedup(con) -> None:
    """Both comparisons of the set-based drug_rec with the per-patient Python reference."""
    params = {"dataset": DATASET}

    def set_based_end_to_end() -> int:
        create_visits(con, DATASET)
        con.execute(f"CREATE OR REPLACE TEMP TABLE _bench_drug_rec AS {DRUG_REC_SQL}", params)
        return con.sql("SELECT count(*) FROM _bench_drug_rec").fetchall()[0][0]

    n_sql, sql_s = timed(set_based_end_to_end)
    ref, ref_s = timed(lambda: drug_rec_reference(con, DATASET))
    same = sql_samples(con) == [{c: s[c] for c in COLS} for s in ref]
    print(f"A. end to end from the warehouse (raw.* + core): set-based {sql_s:.2f}s ({n_sql} samples), "
          f"per-patient Python {ref_s:.2f}s ({len(ref)} samples), equal: {same}; "
          f"speed-up {ref_s / sql_s:.1f}x (target >= 20x)")

    # B: the same per-visit input, already in memory on both sides; only the task function is timed.
    visits = con.sql(f"""SELECT subject_id, hadm_id, admittime, conditions, procedures, drugs FROM {VISITS_TABLE}
                         ORDER BY subject_id, admittime NULLS LAST, hadm_id""").fetchall()
    n_sql, sql_s = timed(lambda: con.execute(f"CREATE OR REPLACE TEMP TABLE _bench_drug_rec AS {DRUG_REC_SQL}",
                                             params).fetchall())
    ref, ref_s = timed(lambda: reference_from_visits(visits))
    same = sql_samples(con) == [{c: s[c] for c in COLS} for s in ref]
    print(f"B. task function only, same in-memory visits ({len(visits):,}): set-based {sql_s:.2f}s, "
          f"per-patient Python {ref_s:.2f}s ({len(ref)} samples), equal: {same}; speed-up {ref_s / sql_s:.1f}x")
    con.execute("DROP TABLE IF EXISTS _bench_drug_rec")


def plain_csv(source: Path, target: Path) -> Path:
    """The cohort's five core tables as plain CSV files (PyHealth 1.1.6 reads only `.csv`); untimed."""
    target.mkdir(parents=True, exist_ok=True)
    for table in CORE_MIMIC3_TABLES:
        out = target / f"{table.upper()}.csv"
        if not out.exists():
            with gzip.open(source / f"{table.upper()}.csv.gz", "rb") as src, out.open("wb") as dst:
                shutil.copyfileobj(src, dst)
    return target


def medtx_from_csv(csv_dir: Path, db: Path, results) -> None:
    """Comparison C, medtx side (child process): CSV files -> samples.drug_rec in a fresh warehouse."""
    from medtx.ingest import ingest_mimic3

    db.unlink(missing_ok=True)
    start = time.perf_counter()
    ingest_mimic3(db, csv_dir, DATASET, db.parent / "cache-c", tables=CORE_MIMIC3_TABLES)
    con = connect(db)
    load_reference_tables(con, BUNDLED_DATA)
    map_prescriptions(con, DATASET)
    built = build_samples(con, BUNDLED_DATA, ["drug_rec"], [DATASET])
    con.close()
    results.put({"total_s": time.perf_counter() - start, "samples": sum(built.values()),
                 "peak_rss_gb": peak_rss_gb()})


def versus_pyhealth(source: Path, workdir: Path, python: str) -> None:
    """Comparison C: medtx and PyHealth 1.1.6, each end to end from the same CSV files, one after the other."""
    csv_dir = plain_csv(source, workdir / f"{source.name}_csv")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=medtx_from_csv, args=(csv_dir, workdir / "bench_c.duckdb", queue))
    child.start()
    ours = queue.get()
    child.join()
    script = Path(__file__).with_name("pyhealth_drug_rec.py")
    done = subprocess.run([python, str(script), str(csv_dir)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"PyHealth run failed ({python}):\n{done.stderr[-2000:]}")
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"C. end to end from the same CSV files: medtx (ingest + reference + map + drug_rec) {ours['total_s']:.1f}s "
          f"({ours['samples']} samples, peak RSS {ours['peak_rss_gb']:.2f} GB); PyHealth 1.1.6 (parse "
          f"{theirs['parse_s']:.1f}s + task {theirs['task_s']:.1f}s, no ATC mapping) {theirs['total_s']:.1f}s "
          f"({theirs['samples']} samples, peak RSS {theirs['peak_rss_gb']:.2f} GB); "
          f"speed-up {theirs['total_s'] / ours['total_s']:.1f}x (load average {os.getloadavg()[0]:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=46_520)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-samples"))
    parser.add_argument("--pyhealth-python", default=None,
                        help="interpreter with PyHealth 1.1.6 installed: adds comparison C")
    args = parser.parse_args()

    source = args.workdir / f"synth_{args.patients}_s{args.seed}"
    db = args.workdir / "bench.duckdb"
    child = multiprocessing.get_context("spawn").Process(
        target=prepare, args=(source, db, args.workdir / "cache", args.patients, args.seed))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise SystemExit(f"generating/ingesting the cohort failed (exit code {child.exitcode})")

    con = connect(db)
    threads = con.sql("SELECT current_setting('threads')").fetchall()[0][0]
    counts = con.sql("SELECT (SELECT count(*) FROM raw.admissions), (SELECT count(*) FROM raw.prescriptions)"
                     ).fetchall()
    print(f"cohort: {args.patients} patients, {counts[0][0]:,} admissions, {counts[0][1]:,} prescription rows; "
          f"DuckDB threads {threads}, cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    _, ref_s = timed(lambda: load_reference_tables(con, BUNDLED_DATA))
    print(f"reference tables (once per warehouse, not per dataset): {ref_s:.1f}s")

    mapped, map_s = timed(lambda: map_prescriptions(con, DATASET))
    pct = con.execute("SELECT pct_rows FROM core.mapping_coverage WHERE dataset = ? AND kind = 'route' "
                      "AND route = 'mapped'", [DATASET]).fetchall()[0][0]
    built, build_s = timed(lambda: build_samples(con, BUNDLED_DATA, ["drug_rec", "next_visit", "readmission"],
                                                 [DATASET]))
    print(f"map_prescriptions: {map_s:.1f}s ({mapped:,} rows, one per mapped prescription; "
          f"{100 * pct:.1f}% of rows with an NDC mapped)")
    print(f"build_samples: {build_s:.1f}s { {k[0]: v for k, v in built.items()} }")
    print(f"TOTAL mapping + builders: {map_s + build_s:.1f}s (target < 60 s; with the reference tables "
          f"{ref_s + map_s + build_s:.1f}s); peak RSS {peak_rss_gb():.2f} GB (target < 4 GB)")
    speedup(con)
    con.close()
    if args.pyhealth_python:
        versus_pyhealth(source, args.workdir, args.pyhealth_python)


if __name__ == "__main__":
    main()
