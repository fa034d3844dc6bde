"""Issue 12, kill test: kill -9 an ingest (8 points) and a build-samples (6 points) at seeded random moments.

Each point starts from a copy of one base warehouse (dataset `cohort` = the bundled demo, codes mapped,
drug_rec samples built with split seed 42). The killed process (forked, so the kill lands inside the work
rather than in interpreter start-up) either re-ingests `cohort` from a changed source (10% fewer patients,
admissions and diagnoses) or rebuilds its samples with seed 7. After SIGKILL: the warehouse opens, every
table of the dataset is wholly the old or wholly the new version (all of them the same one), and the
rerun completes and gives exactly the new version.
"""

from __future__ import annotations

import gzip
import multiprocessing
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from medtx.codes import map_codes
from medtx.store.db import connect
from medtx.store.fingerprint import table_fingerprint
from medtx.ingest import ingest_mimic3
from medtx.tasks.build import build_samples
from tests.conftest import DATA

pytestmark = pytest.mark.slow

DEMO = DATA / "mimic3_demo"
RAW = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents")
SAMPLES = ("samples.drug_rec", "samples.splits", "samples.vocab", "samples.task_summary")
SEED = 20261124


def raw_state(db: Path) -> tuple:
    with connect(db) as con:  # read-write open: also proves the warehouse opens after the kill
        prints = tuple(table_fingerprint(con, f"raw.{t}", "dataset = ?", ["cohort"]) for t in RAW)
        logged = con.execute("SELECT count(*) FROM raw.ingest_log WHERE dataset = 'cohort'").fetchall()[0][0]
    return (*prints, logged)


def samples_state(db: Path) -> tuple:
    with connect(db) as con:
        return tuple(table_fingerprint(con, t, "dataset = ?", ["cohort"]) for t in SAMPLES)


def _ingest(db: Path, source: Path) -> None:
    ingest_mimic3(db, source, "cohort", db.parent / "cache")


def _samples(db: Path, seed: int) -> None:
    with connect(db) as con:
        build_samples(con, DATA, ["drug_rec"], ["cohort"], seed=seed)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("kill")
    changed = root / "changed"
    changed.mkdir()
    for path in DEMO.glob("*.csv.gz"):
        lines = gzip.open(path, "rt").read().splitlines()
        if path.name.split(".")[0].lower() in ("patients", "admissions", "diagnoses_icd"):
            lines = lines[: int(len(lines) * 0.9)]
        with gzip.open(changed / path.name, "wt") as fh:
            fh.write("\n".join(lines) + "\n")
    base = root / "base.duckdb"
    _ingest(base, DEMO)
    with connect(base) as con:
        map_codes(con, DATA, ["cohort"])
    _samples(base, 42)
    # the "new" versions, and how long each job takes here (the kill points are spread over that time)
    ref = root / "expected.duckdb"  # (not ref.duckdb: a catalog named like the ref schema is ambiguous)
    shutil.copy(base, ref)
    clock = time.perf_counter()
    _ingest(ref, changed)
    ingest_s = time.perf_counter() - clock
    new_raw = raw_state(ref)
    shutil.copy(base, ref)
    clock = time.perf_counter()
    _samples(ref, 7)
    samples_s = time.perf_counter() - clock
    return {"root": root, "base": base, "changed": changed, "old_raw": raw_state(base), "new_raw": new_raw,
            "old_samples": samples_state(base), "new_samples": samples_state(ref),
            "ingest_s": ingest_s, "samples_s": samples_s}


def kill_at(target, args: tuple, delay: float) -> int | None:
    """Run `target(*args)` in a forked process and SIGKILL it after `delay` s; its exit code (None: killed)."""
    proc = multiprocessing.get_context("fork").Process(target=target, args=args)
    proc.start()
    proc.join(delay)
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        return None
    return proc.exitcode


def test_kill_ingest_and_build_samples_at_random_points(setup: dict) -> None:
    rng = random.Random(SEED)
    outcomes = []
    jobs = [("ingest", i) for i in range(8)] + [("samples", i) for i in range(6)]
    for kind, i in jobs:
        db = setup["root"] / f"{kind}{i}.duckdb"
        shutil.copy(setup["base"], db)
        if kind == "ingest":
            delay = rng.uniform(0.05, setup["ingest_s"] * 0.9)  # within the measured run: kills land mid-work
            code = kill_at(_ingest, (db, setup["changed"]), delay)
            state = raw_state(db)
            assert state in (setup["old_raw"], setup["new_raw"]), f"ingest killed at {delay:.2f}s: mixed state"
            outcomes.append((kind, round(delay, 2), code, state == setup["new_raw"]))
            _ingest(db, setup["changed"])  # the rerun completes and gives the new version
            assert raw_state(db)[:-1] == setup["new_raw"][:-1]
        else:
            delay = rng.uniform(0.05, setup["samples_s"] * 0.9)
            code = kill_at(_samples, (db, 7), delay)
            state = samples_state(db)
            assert state in (setup["old_samples"], setup["new_samples"]), f"samples killed at {delay:.2f}s: mixed"
            outcomes.append((kind, round(delay, 2), code, state == setup["new_samples"]))
            _samples(db, 7)
            assert samples_state(db) == setup["new_samples"]
        db.unlink()
    print("kill points (kind, delay s, exit code or None=killed, new version):", outcomes)
    # the seeded points must really interrupt work, not only land before or after it
    assert sum(1 for o in outcomes if o[2] is None) >= 10
