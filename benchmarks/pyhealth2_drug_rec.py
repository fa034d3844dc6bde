"""PyHealth 2.1.0's own drug-recommendation path, timed: `MIMIC3Dataset` parse + `set_task(DrugRecommendationMIMIC3())`.

Run by `benchmarks/samples.py --pyhealth2-python PY` in a separate interpreter (PyHealth 2.x requires
Python >= 3.12, medtx's venv is 3.11). The venv used for the figures in benchmarks/README.md:

    /root/.pyenv/versions/3.12.1/bin/python3.12 -m venv /tmp/pyhealth2-venv
    /tmp/pyhealth2-venv/bin/pip install torch==2.13.0
    /tmp/pyhealth2-venv/bin/pip install pyhealth==2.1.0 torch==2.13.0

(all of pyhealth 2.1.0's dependencies resolve from PyPI; the only torch wheel served for cp312 is PyPI's
CUDA build, torch 2.13.0+cu130 with its nvidia-* wheels, ~4.7 GB in the venv; it runs on the CPU here.)

What runs, all PyHealth's own code, with its defaults (num_workers=1: a one-worker Dask LocalCluster for the
event table, then the task in-process):
- parse: `MIMIC3Dataset(root, tables=["diagnoses_icd", "procedures_icd", "prescriptions"], cache_dir=...)`
  + `global_event_df` (CSV -> parquet per table, joins, the sorted global event table, written to the cache);
- task: `set_task(DrugRecommendationMIMIC3())` (per-patient task into `task_df.ld`, processors fitted,
  processed samples written).

Two shims, both outside PyHealth's code:
- MIMIC3Dataset always loads `icustays` besides the tables asked for; the synthetic cohort has none, so the
  caller gives a header-only `ICUSTAYS.csv.gz` (medtx never reads it; 0 events).
- The 2.x task maps every NDC to ATC-3 itself (`CrossMap.load("NDC", "ATC")`), which downloads
  `NDC_to_ATC.csv`, `NDC.csv` and `ATC.csv` from PyHealth's bucket into `~/.cache/pyhealth/medcode`. Nothing
  downloads here: `--mapping CSV` (columns NDC, ATC) is written into a private HOME's
  `.cache/pyhealth/medcode/NDC_to_ATC.csv` (+ `NDC.csv`/`ATC.csv` listing its codes) before pyhealth is
  imported, and `pyhealth.utils.download_file` is replaced by a function that raises. samples.py writes that
  CSV from medtx's own NDC -> ATC-3 choices for the same cohort, so both sides label with the same classes.
  PyHealth's mapping load (CSV -> dict -> pickle) runs inside the timed task, as it would on a first run.

Prints one JSON line (timings exclude the imports, as medtx's side does) and, with `--dump FILE`, writes the
samples of `task_df.ld` (PyHealth's raw task output: patient/visit ids and the per-visit code lists) as JSON
lines, after the clock stops.

    python benchmarks/pyhealth2_drug_rec.py CSV_FOLDER --cache DIR --mapping NDC_ATC.csv [--dump FILE]
"""

import argparse
import json
import os
import pickle
import resource
import shutil
import sys
import time
from pathlib import Path

TABLES = ["diagnoses_icd", "procedures_icd", "prescriptions"]


def private_home(cache: Path, mapping: Path) -> Path:
    """A HOME whose PyHealth medcode cache holds the local NDC -> ATC mapping (and the code lists it needs)."""
    import csv

    home = cache / "home"
    medcode = home / ".cache" / "pyhealth" / "medcode"
    medcode.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mapping, medcode / "NDC_to_ATC.csv")
    with mapping.open(newline="") as f:
        rows = list(csv.DictReader(f))
    for vocabulary in ("NDC", "ATC"):
        with (medcode / f"{vocabulary}.csv").open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["code", "name"])
            out.writerows([code, code] for code in sorted({r[vocabulary] for r in rows}))
    return home


def no_download(url, *args, **kwargs):
    raise RuntimeError(f"PyHealth tried to download {url}: this benchmark runs offline (see the docstring)")


def dump_samples(task_df: Path, out: Path) -> int:
    """PyHealth's raw task samples (task_df.ld) as JSON lines; returns how many."""
    import litdata

    dataset = litdata.StreamingDataset(str(task_df), transform=lambda x: pickle.loads(x["sample"]))
    n = 0
    with out.open("w") as f:
        for sample in dataset:
            f.write(json.dumps({k: sample[k] for k in ("patient_id", "visit_id", "conditions", "procedures",
                                                        "drugs_hist", "drugs")}) + "\n")
            n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder with the MIMIC-III CSV(.gz) files")
    parser.add_argument("--cache", type=Path, required=True, help="fresh folder for PyHealth's caches (emptied)")
    parser.add_argument("--mapping", type=Path, required=True, help="CSV with columns NDC, ATC")
    parser.add_argument("--dump", type=Path, default=None, help="write the samples here (JSON lines)")
    parser.add_argument("--workers", type=int, default=1, help="PyHealth num_workers (default: its default, 1)")
    args = parser.parse_args()

    shutil.rmtree(args.cache, ignore_errors=True)
    args.cache.mkdir(parents=True)
    os.environ["HOME"] = str(private_home(args.cache, args.mapping))  # before pyhealth computes its cache path

    import pyhealth
    import pyhealth.datasets.base_dataset
    import pyhealth.medcode.utils
    import pyhealth.utils
    from pyhealth.datasets import MIMIC3Dataset
    from pyhealth.tasks import DrugRecommendationMIMIC3

    for module in (pyhealth.utils, pyhealth.medcode.utils, pyhealth.datasets.base_dataset):
        module.download_file = no_download

    start = time.perf_counter()
    dataset = MIMIC3Dataset(root=str(args.root), tables=TABLES, cache_dir=args.cache / "datasets",
                            num_workers=args.workers)
    dataset.global_event_df  # noqa: B018 - builds the event table (the parse)
    parsed = time.perf_counter()
    samples = dataset.set_task(DrugRecommendationMIMIC3(), num_workers=args.workers)
    done = time.perf_counter()
    n = len(samples)

    dumped = None
    if args.dump is not None:
        (task_df,) = (args.cache / "datasets").glob("*/tasks/DrugRecommendationMIMIC3_*/task_df.ld")
        dumped = dump_samples(task_df, args.dump)
    print(json.dumps({
        "pyhealth": pyhealth.__version__, "python": sys.version.split()[0],
        "parse_s": parsed - start, "task_s": done - parsed, "total_s": done - start, "samples": n,
        "dumped": dumped, "workers": args.workers,
        "self_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
        "children_peak_rss_gb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024**2,
    }))


if __name__ == "__main__":
    main()
