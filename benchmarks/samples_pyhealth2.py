"""Benchmark: drug_rec sample building, medtx vs PyHealth 2.1.0, end to end from the same CSV files, side by side.

medtx: ingest the five core tables + reference tables + map codes + build drug_rec, in a fresh child process and
warehouse (`medtx_from_csv`, per stage). PyHealth 2.1.0: `benchmarks/pyhealth2_drug_rec.py` in its own interpreter
(`--pyhealth2-python`, Python >= 3.12): `MIMIC3Dataset` + `set_task(DrugRecommendationMIMIC3())`, its defaults.
Both read the same folder: symlinks to the cohort's `.csv.gz` files plus a header-only `ICUSTAYS.csv.gz`
(PyHealth's MIMIC3Dataset always loads icustays; medtx does not read it). Runs alternate (medtx, PyHealth,
medtx, PyHealth, ...); the load average is printed beside every timing. Memory is the peak of the summed RSS (and
PSS) of each side's whole process tree (the process and every descendant: PyHealth 2 runs a Dask worker process),
sampled every 0.1 s.

Mapping. PyHealth 2.1.0's task maps NDC -> ATC-3 itself from files it downloads; here it reads a local
NDC_to_ATC.csv written (untimed, after medtx's first run) from medtx's own choices for this cohort
(`core.prescriptions_atc3`: every (raw NDC, ATC-3) pair medtx assigned), so both sides label with the same
classes. medtx chooses one ATC-3 per prescription row (by NDC and route), PyHealth maps an NDC to every class
listed for it; an NDC given two classes by route would make the definitions differ (the printout counts them).

Equality (`compare`): the same samples, keyed (patient, visit), and per sample the same per-visit code SETS of
conditions, procedures and drugs_hist over the history, and the same label set. Sets, because PyHealth's
per-visit lists keep duplicate codes and an order that ties on the visit's timestamp; medtx's lists are the
distinct codes by seq_num. Empty/null codes are not codes on either side.

    .venv/bin/python benchmarks/samples_pyhealth2.py --pyhealth2-python /tmp/pyhealth2-venv/bin/python \\
        (--patients 10000 [--seed 0] | --source FOLDER) [--repeats 1] [--workdir var/bench-ph2]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import multiprocessing
import os
import platform
import queue as queue_module
import resource
import subprocess
import threading
import time
from pathlib import Path

DATASET = "synth_bench"
SHIM_HEADER = ("ROW_ID,SUBJECT_ID,HADM_ID,ICUSTAY_ID,DBSOURCE,FIRST_CAREUNIT,LAST_CAREUNIT,FIRST_WARDID,"
               "LAST_WARDID,INTIME,OUTTIME,LOS\n")
FIELDS = ("conditions", "procedures", "drugs_hist")


class TreePeak:
    """Peaks of the summed RSS and PSS (bytes) of a process and all its descendants, sampled every `every` seconds.
    RSS counts a shared page (a library mapped by several processes, e.g. PyHealth's Dask worker) once per process;
    PSS splits it among them."""

    def __init__(self, pid: int, every: float = 0.1) -> None:
        self.pid, self.every, self.peak, self.peak_pss = pid, every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> tuple[int, int]:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0, 0
        rss = pss = 0
        for proc in procs:
            try:
                info = proc.memory_full_info()
                rss, pss = rss + info.rss, pss + info.pss
            except psutil.Error:
                continue
        return rss, pss

    def _loop(self) -> None:
        while not self._stop.is_set():
            rss, pss = self._read()
            self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)
            self._stop.wait(self.every)

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def shared_csv_folder(source: Path, target: Path) -> Path:
    """The folder both sides read: symlinks to the cohort's core .csv.gz files + a header-only ICUSTAYS.csv.gz."""
    from medtx.ingest import CORE_MIMIC3_TABLES

    target.mkdir(parents=True, exist_ok=True)
    for table in CORE_MIMIC3_TABLES:
        name = f"{table.upper()}.csv.gz"
        link = target / name
        if not (source / name).exists():
            raise SystemExit(f"{source}: no {name} (the cohort folder needs the five core MIMIC-III tables)")
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to((source / name).resolve())
    with gzip.open(target / "ICUSTAYS.csv.gz", "wt") as f:
        f.write(SHIM_HEADER)
    return target


def medtx_from_csv(csv_dir: Path, db: Path, results) -> None:
    """medtx side (child process): CSV files -> samples.drug_rec in a fresh warehouse, each stage timed."""
    from medtx.codes.mapping import map_prescriptions
    from medtx.codes.reference import load_reference_tables
    from medtx.ingest import CORE_MIMIC3_TABLES, ingest_mimic3
    from medtx.settings import BUNDLED_DATA
    from medtx.store.db import connect
    from medtx.tasks.build import build_samples

    def peak_gb() -> float:  # this process's peak RSS so far (Linux: KiB)
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2

    db.unlink(missing_ok=True)
    stages, peaks = {}, {}
    t = start = time.perf_counter()
    ingest_mimic3(db, csv_dir, DATASET, db.parent / f"cache-{db.stem}", tables=CORE_MIMIC3_TABLES)
    stages["ingest"], peaks["ingest"], t = time.perf_counter() - t, peak_gb(), time.perf_counter()
    con = connect(db)
    load_reference_tables(con, BUNDLED_DATA)
    stages["reference"], peaks["reference"], t = time.perf_counter() - t, peak_gb(), time.perf_counter()
    map_prescriptions(con, DATASET)
    stages["map"], peaks["map"], t = time.perf_counter() - t, peak_gb(), time.perf_counter()
    built = build_samples(con, BUNDLED_DATA, ["drug_rec"], [DATASET])
    stages["build"], peaks["build"] = time.perf_counter() - t, peak_gb()
    total = time.perf_counter() - start
    con.close()
    results.put({"total_s": total, "stages": stages, "peaks": peaks, "samples": sum(built.values())})


def run_medtx(csv_dir: Path, db: Path) -> dict:
    """One medtx run in a fresh spawned child; adds its tree's peak RSS and the load average at the end."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=medtx_from_csv, args=(csv_dir, db, queue))
    child.start()
    with TreePeak(child.pid) as peak:
        out = None
        while out is None and (child.is_alive() or not queue.empty()):
            try:
                out = queue.get(timeout=1)
            except queue_module.Empty:
                continue
        child.join()
    if out is None or child.exitcode != 0:
        raise SystemExit(f"medtx run failed (exit code {child.exitcode})")
    return {**out, "peak_gb": peak.peak / 1024**3, "pss_gb": peak.peak_pss / 1024**3, "load": os.getloadavg()[0]}


def run_pyhealth2(python: str, csv_dir: Path, cache: Path, mapping: Path, dump: Path | None, workers: int) -> dict:
    """One PyHealth 2.1.0 run in its own interpreter; adds its tree's peak RSS and the load average at the end."""
    script = Path(__file__).with_name("pyhealth2_drug_rec.py")
    cmd = [python, str(script), str(csv_dir), "--cache", str(cache), "--mapping", str(mapping),
           "--workers", str(workers)] + (["--dump", str(dump)] if dump else [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with TreePeak(proc.pid) as peak:
        stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"PyHealth 2 run failed ({python}, exit code {proc.returncode}):\n{stderr[-3000:]}")
    out = json.loads(stdout.strip().splitlines()[-1])
    return {**out, "peak_gb": peak.peak / 1024**3, "pss_gb": peak.peak_pss / 1024**3, "load": os.getloadavg()[0]}


def write_mapping(db: Path, out: Path) -> dict[str, int]:
    """medtx's NDC -> ATC-3 choices for the cohort as PyHealth's NDC_to_ATC.csv (columns NDC, ATC), keyed by the
    raw NDC string of PRESCRIPTIONS.csv; returns counts (NDCs, pairs, NDCs given more than one class)."""
    from medtx.codes.ndc import ndc_sql
    from medtx.store.db import connect

    con = connect(db, read_only=True)
    pairs = con.execute(f"""
        WITH raw_ndc AS (
            SELECT DISTINCT trim(ndc) AS raw, {ndc_sql('ndc')} AS ndc FROM raw.prescriptions WHERE dataset = $d
        ), chosen AS (SELECT DISTINCT ndc, atc3 FROM core.prescriptions_atc3 WHERE dataset = $d AND ndc IS NOT NULL)
        SELECT r.raw, c.atc3 FROM raw_ndc r JOIN chosen c USING (ndc) ORDER BY 1, 2""", {"d": DATASET}).fetchall()
    con.close()
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["NDC", "ATC"])
        writer.writerows(pairs)
    per_ndc: dict[str, int] = {}
    for ndc, _ in pairs:
        per_ndc[ndc] = per_ndc.get(ndc, 0) + 1
    return {"ndcs": len(per_ndc), "pairs": len(pairs), "multi_class_ndcs": sum(n > 1 for n in per_ndc.values())}


def _codes(values) -> frozenset[str]:
    """A visit's codes as a set: trimmed, without null/empty."""
    return frozenset(str(v).strip() for v in values if v is not None and str(v).strip())


def normalize(patient, visit, conditions, procedures, drugs_hist, drugs) -> tuple[tuple[int, int], tuple]:
    """One sample, either side, in the common definition: (patient, visit) -> per-visit code sets + label set."""
    history = tuple(tuple(_codes(v) for v in field) for field in (conditions, procedures, drugs_hist))
    return (int(patient), int(visit)), (*history, _codes(drugs))


def medtx_samples(db: Path) -> dict:
    """samples.drug_rec of the benchmark warehouse, normalized."""
    from medtx.store.db import connect

    con = connect(db, read_only=True)
    rows = con.execute("SELECT subject_id, hadm_id, conditions, procedures, drugs_hist, drugs FROM samples.drug_rec "
                       "WHERE dataset = $d", {"d": DATASET}).fetchall()
    con.close()
    return dict(normalize(*r) for r in rows)


def pyhealth_samples(dump: Path) -> dict:
    """PyHealth's dumped task samples (JSON lines), normalized."""
    out = {}
    with dump.open() as f:
        for line in f:
            s = json.loads(line)
            key, value = normalize(s["patient_id"], s["visit_id"], s["conditions"], s["procedures"],
                                   s["drugs_hist"], s["drugs"])
            if key in out:
                raise ValueError(f"{dump}: two PyHealth samples for patient {key[0]} visit {key[1]}")
            out[key] = value
    return out


def compare(ours: dict, theirs: dict) -> dict:
    """Sample-by-sample comparison in the common definition; `equal` only when every sample matches."""
    common = ours.keys() & theirs.keys()
    differ = {name: sum(ours[k][i] != theirs[k][i] for k in common)
              for i, name in enumerate((*FIELDS, "drugs"))}
    return {"equal": ours == theirs, "medtx": len(ours), "pyhealth": len(theirs), "common": len(common),
            "only_medtx": len(ours.keys() - common), "only_pyhealth": len(theirs.keys() - common),
            "samples_differing": sum(ours[k] != theirs[k] for k in common), "differ_by_field": differ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyhealth2-python", required=True, help="interpreter with pyhealth==2.1.0")
    parser.add_argument("--patients", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=Path, default=None, help="an existing cohort folder (read only)")
    parser.add_argument("--workdir", type=Path, default=Path("var/bench-ph2"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pyhealth2-workers", type=int, default=1, help="PyHealth num_workers (its default: 1)")
    args = parser.parse_args()

    args.workdir.mkdir(parents=True, exist_ok=True)
    source = args.source or args.workdir / f"synth_{args.patients}_s{args.seed}"
    if not (source / "PRESCRIPTIONS.csv.gz").exists():
        if args.source is not None:
            raise SystemExit(f"{source}: no PRESCRIPTIONS.csv.gz")
        from medtx.synth import generate_mimic3

        generate_mimic3(source, args.patients, args.seed)
    csv_dir = shared_csv_folder(source, args.workdir / f"{source.name}_shared")
    with gzip.open(source / "PATIENTS.csv.gz", "rt") as f:
        patients = sum(1 for _ in f) - 1
    version = subprocess.run([args.pyhealth2_python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    print(f"cohort {source} ({patients:,} patients), same CSV folder {csv_dir}; cpus {os.cpu_count()}; "
          f"medtx Python {platform.python_version()}, PyHealth Python {version}; "
          f"PyHealth num_workers {args.pyhealth2_workers}; load average {os.getloadavg()[0]:.1f}")

    db = args.workdir / f"{source.name}_medtx.duckdb"
    mapping = args.workdir / f"{source.name}_NDC_to_ATC.csv"
    dump = args.workdir / f"{source.name}_pyhealth2_samples.jsonl"
    rows = []
    for i in range(args.repeats):
        ours = run_medtx(csv_dir, db)
        if i == 0:
            counts = write_mapping(db, mapping)
            print(f"NDC_to_ATC.csv for PyHealth from medtx's choices: {counts['ndcs']:,} NDCs, {counts['pairs']:,} "
                  f"pairs, {counts['multi_class_ndcs']} NDCs with more than one ATC-3 (untimed)")
        theirs = run_pyhealth2(args.pyhealth2_python, csv_dir, args.workdir / f"{source.name}_ph2cache", mapping,
                               dump if i == 0 else None, args.pyhealth2_workers)
        st = ours["stages"]
        pk = " / ".join(f"{v:.2f}" for v in ours["peaks"].values())
        print(f"run {i + 1}: medtx {ours['total_s']:.1f}s (ingest {st['ingest']:.1f} + reference {st['reference']:.1f} "
              f"+ map {st['map']:.1f} + build {st['build']:.1f}), {ours['samples']:,} samples, peak RSS (tree) "
              f"{ours['peak_gb']:.2f} GB, PSS {ours['pss_gb']:.2f} GB (process peak after each stage {pk} GB), "
              f"load {ours['load']:.1f} | PyHealth {theirs['pyhealth']} "
              f"{theirs['total_s']:.1f}s (parse {theirs['parse_s']:.1f} + task {theirs['task_s']:.1f}), "
              f"{theirs['samples']:,} samples, peak RSS (tree) {theirs['peak_gb']:.2f} GB, PSS {theirs['pss_gb']:.2f} GB, "
              f"load {theirs['load']:.1f} | speed-up {theirs['total_s'] / ours['total_s']:.1f}x, memory ratio "
              f"{theirs['peak_gb'] / ours['peak_gb']:.1f}x (PSS {theirs['pss_gb'] / ours['pss_gb']:.1f}x)")
        rows.append((ours, theirs))
        if i == 0:
            result = compare(medtx_samples(db), pyhealth_samples(dump))
            print(f"samples: medtx {result['medtx']:,}, PyHealth {result['pyhealth']:,}, common {result['common']:,}, "
                  f"only medtx {result['only_medtx']}, only PyHealth {result['only_pyhealth']}, differing "
                  f"{result['samples_differing']} {result['differ_by_field']}; equal: {result['equal']}")
    best_ours = min(r[0]["total_s"] for r in rows)
    best_theirs = min(r[1]["total_s"] for r in rows)
    print(f"best of {len(rows)}: medtx {best_ours:.1f}s, PyHealth {best_theirs:.1f}s, speed-up "
          f"{best_theirs / best_ours:.1f}x (target >= 20x); peak RSS medtx {max(r[0]['peak_gb'] for r in rows):.2f} GB "
          f"vs PyHealth {max(r[1]['peak_gb'] for r in rows):.2f} GB; PSS {max(r[0]['pss_gb'] for r in rows):.2f} vs "
          f"{max(r[1]['pss_gb'] for r in rows):.2f} GB (target <= 1/4)")


if __name__ == "__main__":
    main()
