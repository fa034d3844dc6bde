"""p50/p95 callback latency of every dashboard page against a full-scale warehouse (target p95 < 300 ms).

    python benchmarks/dashboard.py [--db var/dash-full/warehouse.duckdb] [--repeats 20]
    python benchmarks/dashboard.py --build --source var/synth/synth_46520   # build it first (~12-20 min)

The warehouse (kept outside git, `var/` is ignored) is built by `--build` with the pipeline's own stage
functions: `medtx synth mimic3 --patients 46520 --seed 0 --out var/synth/synth_46520` (46,520 synthetic
patients, 58.9k admissions, 5.3M prescriptions), then ingest it as `synth_46520` and all 4,999 MTSamples
notes, reference tables + NDC->ATC-3 mapping, drug_rec / next_visit / readmission / specialty samples, and
real runs: drug_rec most_frequent, copy_last, logreg and a 1-epoch transformer (predictions of every test
visit + attention of showcase visits), next_visit and readmission most_frequent, specialty majority,
tfidf_logreg and a tiny bert_scratch (token attention); then publish the snapshot (with the `dash.*` marts,
`medtx.publish.marts`). The same sequence through the CLI: `medtx ingest mimic3 --source DIR --dataset synth_46520`,
`medtx ingest mtsamples`, `medtx map-codes`, `medtx build-samples`, `medtx train --task T --model M ...`.

Replays, through Flask's test client, the exact callback requests the browser sends when a page loads
(each chained callback fed with the previous ones' outputs; `dashboard.warm`), so the figures include
Dash's JSON encoding and the figure building, not just SQL. Two passes per page: cold (every cache and
the snapshot reader dropped before each page load: the first visit after a publish if the background
warm-up had not run) and warm (caches filled, what visitors get once the warm-up ran). Prints a Markdown
table with the time spent in SQL and the JSON shipped, and the load average next to each page.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated
from urllib.parse import urlencode

import typer

# This file is named like the package it measures: drop its own folder from the path so that
# `import dashboard` finds the app, not this script.
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from dashboard import create_app, queries, resolve_snapshot
from dashboard.warm import PAGE_CALLBACKS, load_page, warm
from medtx.tasks import all_tasks, get_task, tasks_of_family


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] if len(samples) > 1 else samples[0]


# --- building the full-scale warehouse -------------------------------------------------------------------

DATA = Path(__file__).resolve().parent.parent / "data"
FULL_DATASET = "synth_46520"
# Small but real runs: every page gets full-scale content (predictions of ~3k test visits per EHR run,
# attention of showcase visits/notes) in ~20 min on 2 shared cores.
NEURAL_DRUG_REC = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "batch_size": 64, "num_threads": 1}
TINY_BERT = {"epochs": 1, "mlm_epochs": 1, "mlm_max_windows": 2, "hidden": 64, "layers": 2, "heads": 2,
             "max_len": 128, "max_chunks": 1, "vocab_size": 4000, "n_showcase": 5, "attention_max_tokens": 64}


def build_full_warehouse(folder: Path, source: Path, *, skip_ingest: bool = False) -> Path:
    """Build (once) the full-scale warehouse this benchmark reads and publish its snapshot; returns the db.

    Same stage functions as the pipeline, in the order of its steps: ingest the 46,520-patient synthetic
    cohort (`medtx synth mimic3 --patients 46520 --seed 0 --out SOURCE`) and all 4,999 MTSamples notes ->
    reference tables + NDC->ATC-3 -> drug_rec/next_visit/readmission/specialty samples -> runs -> publish.
    """
    import torch

    from medtx.codes.mapping import map_prescriptions
    from medtx.codes.reference import load_reference_tables
    from medtx.store.db import connect
    from medtx.ingest import ingest_mimic3, ingest_mtsamples
    from medtx.pipeline.runs import finish_pipeline_run, start_pipeline_run
    from medtx.publish.snapshot import publish_snapshot
    from medtx.tasks.build import build_samples
    from medtx.settings import snapshot_path
    from medtx.pipeline.steps import train_in_process

    torch.set_num_threads(1)  # one core of a shared 2-core machine
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "warehouse.duckdb"
    step = _stopwatch()
    start_pipeline_run(db, "dashboard-benchmark", {"purpose": "full-scale dashboard benchmark", "source": str(source)})
    if not skip_ingest:
        ingest_mimic3(db, source, FULL_DATASET)
        step("ingest EHR")
    ingest_mtsamples(db, DATA / "mtsamples" / "mtsamples.csv.gz")
    con = connect(db)
    try:
        load_reference_tables(con, DATA)
        map_prescriptions(con, FULL_DATASET)
        build_samples(con, DATA, tasks=["drug_rec", "next_visit", "readmission"], datasets=[FULL_DATASET])
        build_samples(con, DATA, tasks=["specialty"])
    finally:
        con.close()
    step("reference, mapping, samples")
    for task, model in (("drug_rec", "most_frequent"), ("drug_rec", "copy_last"), ("next_visit", "most_frequent"),
                        ("readmission", "most_frequent"), ("drug_rec", "logreg")):
        train_in_process(db, get_task(task), model, 0, dataset=FULL_DATASET, models_dir=folder / "models")
        step(f"{task} {model}")
    train_in_process(db, get_task("drug_rec"), "transformer", 0, {**NEURAL_DRUG_REC, "epochs": 1}, dataset=FULL_DATASET,
                     device="cpu", models_dir=folder / "models")
    step("drug_rec transformer (1 epoch)")
    for model, overrides in (("majority", None), ("tfidf_logreg", None), ("bert_scratch", TINY_BERT)):
        train_in_process(db, get_task("specialty"), model, 0, overrides)
        step(f"specialty {model}")
    finish_pipeline_run(db, "dashboard-benchmark", failed=[])
    publish_snapshot(db, snapshot_path(db))
    step("publish")
    return db


def _stopwatch():
    started = last = time.perf_counter()

    def step(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        print(f"build: {name} {now - last:.0f} s (total {now - started:.0f} s, load {os.getloadavg()[0]:.1f})",
              flush=True)
        last = now

    return step


@dataclass
class PassResult:
    """Latencies of one pass (cold or warm) over one page."""

    callbacks: list[float] = field(default_factory=list)  # seconds, every callback of every repetition
    pages: list[float] = field(default_factory=list)  # seconds, whole page load per repetition
    slowest: dict[str, float] = field(default_factory=dict)  # callback -> worst seconds
    sql_seconds: float = 0.0  # time inside DuckDB (cache misses only)
    response_bytes: int = 0  # JSON shipped to the browser per page load (last repetition)

    def p(self, q: int) -> float:
        return 1000 * percentile(self.callbacks, q)


class SqlClock:
    """Sums the time spent running SQL (query-cache misses) by wrapping `queries.query`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._query = queries.query

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return self._query(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        queries.query = timed


def measure(app, client, page: str, snapshot: Path, repeats: int, cold: bool, clock: SqlClock) -> PassResult:
    result = PassResult()
    load_page(app, client, page, snapshot)  # import/JIT warm-up, not measured
    clock.seconds = 0.0
    for _ in range(repeats):
        if cold:
            queries.clear_cache()
        timings = load_page(app, client, page, snapshot)
        result.callbacks += [t for _, t, _ in timings]
        result.pages.append(sum(t for _, t, _ in timings))
        result.response_bytes = sum(b for _, _, b in timings)
        for name, t, _ in timings:
            result.slowest[name] = max(result.slowest.get(name, 0.0), t)
    result.sql_seconds = clock.seconds / repeats
    return result


def every_run(app, client, snapshot: Path) -> list[tuple[str, int, list[float], str]]:
    """Cold load of the run-specific pages for EVERY run (not just the default one), the patient page also
    with the all-layers x all-heads attention view: (page, runs, callback seconds, slowest run)."""
    ehr = queries.explorer_runs(snapshot, tasks_of_family("ehr"))["run_id"].to_list()
    notes = [t for t in all_tasks() if t.classifies_text]
    sweeps = {("run_detail", "single"): queries.runs_index(snapshot)["run_id"].to_list(),
              ("patient", "single"): ehr, ("patient", "model"): ehr,
              ("notes", "single"): queries.explorer_runs(snapshot, notes)["run_id"].to_list()}
    rows = []
    for (page, view), run_ids in sweeps.items():
        seconds: list[float] = []
        worst = (0.0, "")
        for run_id in run_ids:
            queries.clear_cache()
            timings = load_page(app, client, page, snapshot, search=f"?{urlencode({'run_id': run_id})}", view=view)
            seconds += [t for _, t, _ in timings]
            worst = max(worst, (max(t for _, t, _ in timings), run_id))
        rows.append((page + (" (model view)" if view == "model" else ""), len(run_ids), seconds, worst[1]))
    return rows


def main(
    db: Annotated[Path, typer.Option(help="Live warehouse (its snapshot is read) or a snapshot file.")] = Path(
        "var/dash-full/warehouse.duckdb"),
    repeats: Annotated[int, typer.Option(help="Page loads per page and pass.")] = 20,
    build: Annotated[bool, typer.Option(help="Build and publish the full-scale warehouse at --db first.")] = False,
    source: Annotated[Path, typer.Option(help="With --build: the generated 46,520-patient cohort folder "
                                         "(`medtx synth mimic3 --patients 46520 --seed 0 --out DIR`).")] = Path(
        "var/synth/synth_46520"),
) -> None:
    if build:
        build_full_warehouse(db.parent, source)
    snapshot = resolve_snapshot(db)
    app = create_app(snapshot)
    client = app.server.test_client()
    clock = SqlClock()
    size = snapshot.stat().st_size / 1e6
    runs = queries.runs_index(snapshot).height
    print(f"snapshot {snapshot} ({size:.0f} MB, {runs} runs, datasets {', '.join(queries.datasets(snapshot))}); "
          f"{os.cpu_count()} CPUs, load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print("cold = caches emptied before every page load (the first visit after a publish, without warm-up); "
          "warm = caches filled. Latency per callback (one HTTP request of the page's chain).\n")
    queries.clear_cache()
    warm_up = warm(app, snapshot)
    print(f"warm-up after a publish (what `medtx dashboard` runs in the background on every new snapshot): "
          f"every page in {warm_up:.1f} s at load {os.getloadavg()[0]:.1f}\n")
    rows = []
    for page in PAGE_CALLBACKS:
        cold = measure(app, client, page, snapshot, repeats, True, clock)
        hot = measure(app, client, page, snapshot, repeats, False, clock)
        rows.append((page, cold, hot, os.getloadavg()[0]))
    sweep = every_run(app, client, snapshot)
    print("| page | callbacks | cold p50 ms | cold p95 ms | warm p50 ms | warm p95 ms "
          "| cold page load p50 ms (mean SQL ms) | warm page load ms | JSON KB | slowest cold callback | load avg |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for page, cold, hot, load in rows:
        worst = max(cold.slowest, key=cold.slowest.get)
        print(f"| {page} | {len(PAGE_CALLBACKS[page])} | {cold.p(50):.0f} | {cold.p(95):.0f} | {hot.p(50):.0f} | "
              f"{hot.p(95):.0f} | {1000 * statistics.median(cold.pages):.0f} ({1000 * cold.sql_seconds:.0f}) | "
              f"{1000 * statistics.median(hot.pages):.0f} | {cold.response_bytes / 1000:.0f} | "
              f"{worst} {1000 * cold.slowest[worst]:.0f} ms | {load:.1f} |")

    print("\nEvery run, cold (caches and reader dropped before each page load), at load "
          f"{os.getloadavg()[0]:.1f}:\n")
    print("| page | runs | cold p50 ms | cold p95 ms | max ms | slowest run |")
    print("|---|---:|---:|---:|---:|---|")
    for page, n, seconds, worst in sweep:
        print(f"| {page} | {n} | {1000 * percentile(seconds, 50):.0f} | {1000 * percentile(seconds, 95):.0f} | "
              f"{1000 * max(seconds):.0f} | {worst} |")


if __name__ == "__main__":
    typer.run(main)
