"""The EHR results table: every model and baseline on a synthetic cohort, mean ± sd over training seeds.

    nice .venv/bin/python benchmarks/results.py --patients 10000 --seeds 0,1,2      # prepare + train + write
    .venv/bin/python benchmarks/results.py --render-only                             # rewrite RESULTS.md only

Steps: (1) generate `synth_<N>` with the synth stage, ingest it, load its oracle, map codes, build samples
(skipped when the samples exist); (2) run every (task, model, seed) through `train_in_process` with a fixed
run id `results.<task>.<model>.<dataset>.s<seed>`, skipping runs already completed with the same config,
so an interrupted run resumes; (3) render `benchmarks/RESULTS.md`'s section between `<!-- BEGIN ehr -->`
and `<!-- END ehr -->` from ml.* (other sections, e.g. the text stage's, are kept as they are).

Protocol: the split is fixed by the samples stage (patient-level 70/10/20, its own seed); training seeds
vary. Each cell is the mean ± sd over seeds of the per-run test value, the point estimate on the whole test
split (its 95% patient-bootstrap interval and the 10×80% subsample sd are in ml.metrics).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_config import (  # noqa: E402
    BASELINES, HEADLINE, MODEL_OVERRIDES, TASK_MODEL_OVERRIDES, TASK_MODELS, TRAIN, run_id_for,
)
from benchmarks.results_intervals import comparison_lines, recompute  # noqa: E402
from benchmarks.results_paired import paired_ahead_share, paired_lines, per_visit_scores  # noqa: E402, F401
from benchmarks.results_render import render, write_results  # noqa: E402
from medtx.store.db import open_warehouse, quote_table  # noqa: E402  (waits out a parallel run's lock)

log = logging.getLogger("medtx.benchmarks")


# ----------------------------------------------------------------------------------------------- prepare


def prepare_cohort(db: Path, n_patients: int, seed: int, workdir: Path) -> str:
    """Generate, ingest, map and build samples for `synth_<n>` unless its samples already exist."""
    from medtx.synth.generate import dataset_name

    dataset = dataset_name(n_patients)
    with open_warehouse(db) as con:
        done = con.execute("SELECT count(*) FROM samples.drug_rec WHERE dataset = ?", [dataset]).fetchall()[0][0]
    if done:
        log.info("samples of %s exist; not rebuilding", dataset)
        return dataset
    from medtx.codes.mapping import map_prescriptions
    from medtx.codes.reference import load_reference_tables, reference_loaded
    from medtx.ingest import CORE_MIMIC3_TABLES, ingest_mimic3_table
    from medtx.tasks.build import build_samples
    from medtx.settings import get_settings
    from medtx.synth.generate import generate_mimic3
    from medtx.synth.oracle import load_oracle

    source = workdir / dataset
    started = time.perf_counter()
    if not (source / "ADMISSIONS.csv.gz").exists():
        generate_mimic3(source, n_patients=n_patients, seed=seed, notes=False)
    for table in CORE_MIMIC3_TABLES:
        ingest_mimic3_table(db, table, source, dataset, workdir / "cache")
    data_dir = get_settings().data_dir
    with open_warehouse(db) as con:
        load_oracle(con, source, dataset)
        if not reference_loaded(con):
            load_reference_tables(con, data_dir)
        map_prescriptions(con, dataset)
        build_samples(con, data_dir, list(TASK_MODELS), [dataset])
    log.info("prepared %s in %.0fs", dataset, time.perf_counter() - started)
    return dataset


# ----------------------------------------------------------------------------------------------- train


def overrides_for(model: str, task: str | None = None) -> dict:
    if model in BASELINES:
        return {}
    return {**TRAIN, **MODEL_OVERRIDES.get(model, {}), **TASK_MODEL_OVERRIDES.get((task, model), {})}


def config_matches(config_json: str | None, overrides: dict) -> bool:
    """Whether a run's recorded config (ml.runs.config "train"/"model") has every current override
    (num_threads excepted: it changes speed, not the model). Baselines have no overrides: always True."""
    if not overrides:
        return True
    config = json.loads(config_json or "{}")
    # "model"/"train" are a neural run's config parts; a baseline's "model" may be its name (lightgbm)
    recorded = {k: v for part in ("model", "train") if isinstance(config.get(part), dict) for k, v in config[part].items()}
    missing = object()
    return all(_same(recorded.get(k, missing), v) for k, v in overrides.items() if k != "num_threads")


def _same(recorded: object, wanted: object) -> bool:
    """JSON turns tuples into lists: compare sequences element-wise."""
    if isinstance(recorded, (list, tuple)) and isinstance(wanted, (list, tuple)):
        return list(recorded) == list(wanted)
    return recorded == wanted


def already_done(db: Path, run_id: str, overrides: dict) -> bool:
    with open_warehouse(db, read_only=True) as con:
        rows = con.execute("SELECT status, config FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()
    return bool(rows) and rows[0][0] == "completed" and config_matches(rows[0][1], overrides)


def forget_run(db: Path, run_id: str) -> None:
    """Delete a run's rows (a result package never replaces a recorded run: the benchmark's cells have fixed ids)."""
    from medtx.store.db import transaction
    from medtx.training.records import RUN_TABLES

    with open_warehouse(db) as con, transaction(con):
        con.execute("DELETE FROM ml.comparisons WHERE reference_run_id = ?", [run_id])
        for table in RUN_TABLES:
            con.execute(f"DELETE FROM {quote_table(table)} WHERE run_id = ?", [run_id])


def run_all(db: Path, dataset: str, tasks: list[str], models: list[str] | None, seeds: list[int],
            device: str, threads: int | None, rerun: tuple[str, ...] = ()) -> None:
    from medtx.tasks import get_task
    from medtx.pipeline.steps import train_in_process

    # Cheap baselines first (all seeds), then the neural models seed by seed, so an interrupted run
    # still leaves complete comparisons for the first seeds.
    for task in tasks:
        order = [(s, m) for s in seeds for m in TASK_MODELS[task] if m in BASELINES]
        order += [(s, m) for s in seeds for m in TASK_MODELS[task] if m not in BASELINES]
        for seed, model in order:
            if models and model not in models:
                continue
            run_id = run_id_for(task, model, dataset, seed)
            overrides = overrides_for(model, task)
            if threads and model not in BASELINES:
                overrides["num_threads"] = threads
            if model not in rerun and already_done(db, run_id, overrides):
                continue
            forget_run(db, run_id)  # a failed or outdated cell is trained again under its fixed run id
            started = time.perf_counter()
            try:
                train_in_process(db, get_task(task), model, seed, overrides, dataset=dataset, device=device,
                                 run_id=run_id, models_dir=db.parent / "models")
            except Exception as exc:  # recorded as failed in ml.runs; the table says so
                log.error("%s failed: %s", run_id, exc)
            log.info("%s done in %.0fs", run_id, time.perf_counter() - started)


# ----------------------------------------------------------------------------------------------- render


def collect(db: Path, dataset: str) -> dict:
    """{(task, model): {"runs": n, "failed": n, "collapsed": n, "metrics": {(metric, averaging): [values]},
    "boot_sd": {...}, "threshold": [...], "device": ..., "seconds": [...]}} for the results runs."""
    with open_warehouse(db, read_only=True) as con:
        runs = con.execute(
            "SELECT run_id, task, model, status, collapsed, threshold, threshold_source, device, train_seconds, "
            "best_epoch, config FROM ml.runs WHERE run_id LIKE 'results.%' AND dataset = ?", [dataset]).fetchall()
        metrics = con.execute(
            "SELECT m.run_id, m.metric, m.averaging, m.value, m.sd, m.ci_low, m.ci_high FROM ml.metrics m "
            "JOIN ml.runs r USING (run_id) "
            "WHERE r.run_id LIKE 'results.%' AND r.dataset = ? AND r.status = 'completed' AND m.split = 'test'",
            [dataset]).fetchall()
        summary = dict(con.execute("SELECT task || '.' || metric, value FROM samples.task_summary WHERE dataset = ?",
                                   [dataset]).fetchall())
    out: dict = {}
    by_run = {}
    for run_id, task, model, status, collapsed, thr, thr_src, device, seconds, best_epoch, config in runs:
        cell = out.setdefault((task, model), {"runs": 0, "failed": 0, "collapsed": 0, "metrics": {}, "boot_sd": {},
                                              "threshold": [], "source": set(), "device": set(), "seconds": [],
                                              "epochs": [], "stale": 0})
        if status != "completed":
            cell["failed"] += status == "failed"
            continue
        if not config_matches(config, overrides_for(model, task)):  # trained under an older config
            cell["stale"] += 1
            continue
        cell["runs"] += 1
        cell["collapsed"] += bool(collapsed)
        cell["threshold"].append(thr)
        cell["source"].add(thr_src)
        cell["device"].add(device)
        cell["seconds"].append(seconds or 0.0)
        if best_epoch:
            cell["epochs"].append(best_epoch)
        by_run[run_id] = cell
    for run_id, metric, averaging, value, sd, lo, hi in metrics:
        if run_id in by_run and value is not None:
            by_run[run_id]["metrics"].setdefault((metric, averaging), []).append(value)
            by_run[run_id]["boot_sd"].setdefault((metric, averaging), []).append(sd or 0.0)
            if lo is not None and hi is not None:
                by_run[run_id].setdefault("ci", {}).setdefault((metric, averaging), []).append((lo, hi))
    out["_summary"] = summary
    out["_paired"] = paired_lines(db, dataset)
    out["_comparisons"] = {task: comparison_lines(db, dataset, task) for task in HEADLINE}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", type=Path, default=ROOT / "var" / "results" / "warehouse.duckdb")
    ap.add_argument("--patients", type=int, default=10_000)
    ap.add_argument("--synth-seed", type=int, default=0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--tasks", default=",".join(HEADLINE))
    ap.add_argument("--models", default=None, help="comma-separated subset (default: all of each task)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--intervals", action="store_true",
                    help="(re)compute the patient-bootstrap intervals and paired comparisons of every completed run "
                         "of the dataset before rendering (runs recorded before issue 14 have none)")
    ap.add_argument("--rerun", default="", help="comma-separated models to re-run even when completed")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    seeds = [int(s) for s in args.seeds.split(",")]
    tasks = args.tasks.split(",")
    args.db.parent.mkdir(parents=True, exist_ok=True)
    from medtx.synth.generate import dataset_name

    dataset = dataset_name(args.patients)
    if not args.render_only:
        dataset = prepare_cohort(args.db, args.patients, args.synth_seed, args.db.parent)
        run_all(args.db, dataset, tasks, args.models.split(",") if args.models else None, seeds, args.device,
                args.threads, tuple(filter(None, args.rerun.split(","))))
    if args.intervals:
        recompute(args.db, dataset, tasks)
    write_results(args.out, render(collect(args.db, dataset), dataset, seeds))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
