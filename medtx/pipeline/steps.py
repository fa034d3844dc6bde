"""What each pipeline step does: one function per step kind, each a short call into the stage that owns
the work (ingest, synth, codes, samples, training, text). No Prefect here: flows/pipeline.py wraps each
function in a cached Prefect task, and tests can call them directly.

Every function takes the step's `spec` (dataset, task, model, params; see `Step.spec`) and `paths` (db,
cache_dir, data_dir, models_dir as strings), and returns a small JSON-able dict (Prefect persists it).
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

from medtx.store.db import open_warehouse

log = logging.getLogger("medtx.pipeline")

Spec = dict[str, Any]
Paths = dict[str, str]


def run_synth(spec: Spec, paths: Paths) -> dict[str, Any]:
    """Generate a synthetic MIMIC-III-format cohort (CSV files + oracle files) into params.out_dir."""
    from medtx.synth.generate import generate_mimic3

    p = spec["params"]
    summary = generate_mimic3(Path(p["out_dir"]), n_patients=p["n_patients"], seed=p["seed"], notes=p["notes"])
    return {"out_dir": str(summary.out_dir), "rows": summary.rows, "seconds": summary.seconds}


def run_ingest(spec: Spec, paths: Paths) -> dict[str, Any]:
    """Load a dataset's tables into raw.* as one unit (or the synth oracle files, or the MTSamples corpus)."""
    from medtx.ingest import ShrinkGuard, ingest_mimic3, ingest_mtsamples

    db, cache_dir, p = Path(paths["db"]), Path(paths["cache_dir"]), spec["params"]
    if p.get("table") == "oracle":
        from medtx.synth.oracle import load_oracle

        with open_warehouse(db) as con:
            return {"rows": load_oracle(con, Path(p["source"]), dataset=spec["dataset"])}
    guard = ShrinkGuard(p.get("allow_shrink", False), p.get("max_shrink", 0.5))
    policy = p.get("plausibility", "warn")
    if p.get("table") == "meds":
        from medtx.meds import ingest_meds

        meds = ingest_meds(db, p["source"], spec["dataset"], p.get("codes"), guard=guard, command="medtx pipeline",
                           plausibility=policy, cast_types=p.get("cast_types", False))
        return {"rows": meds.rows, "events": meds.events, "events_mapped": meds.events_mapped}
    if p.get("table") == "mtsamples":
        results = [ingest_mtsamples(db, p["source"], cache_dir, guard=guard, plausibility=policy)]
    else:
        results = ingest_mimic3(db, p["source"], spec["dataset"], cache_dir, p["tables"], guard=guard,
                                plausibility=policy)
    return {r.table: {"rows_loaded": r.rows_loaded, "rows_rejected": r.rows_rejected, "status": r.status}
            for r in results}


def run_reference(spec: Spec, paths: Paths) -> dict[str, Any]:
    """(Re)build the ref.* code dictionaries and drug maps from the bundled data."""
    from medtx.codes.reference import load_reference_tables

    with open_warehouse(paths["db"]) as con:
        return load_reference_tables(con, Path(paths["data_dir"]))


def run_codes(spec: Spec, paths: Paths) -> dict[str, Any]:
    """Map one dataset's prescriptions NDC -> ATC-3 into core.* (with the coverage report)."""
    from medtx.codes.mapping import map_prescriptions

    with open_warehouse(paths["db"]) as con:
        return {"mapped_rows": map_prescriptions(con, spec["dataset"])}


def run_samples(spec: Spec, paths: Paths) -> dict[str, Any]:
    """Build one task's samples, split, vocabularies and summary (for one dataset, or the text corpora).

    `params.options` may set `fractions` (train/val/test, default 70/10/20), `min_count` and `k_folds`.
    """
    from medtx.tasks.build import build_samples
    from medtx.tasks import get_task

    p, task = spec["params"], spec["task"]
    datasets = [spec["dataset"]] if get_task(task).family == "ehr" else None
    with open_warehouse(paths["db"]) as con:
        counts = build_samples(con, Path(paths["data_dir"]), [task], datasets, seed=p["seed"], **p["options"])
    return {"samples": sum(counts.values())}


def run_train(
    spec: Spec, paths: Paths, *, pipeline_run_id: str | None, device: str, torch_threads: int | None = None
) -> dict[str, Any]:
    """Train and evaluate one (dataset, task, model, seed) against the warehouse itself (the in-process
    experiments, no package; the pipeline trains from packages: `run_train_from_package`); returns the run ids it
    wrote to ml.runs.

    A failure is recorded in ml.runs (status 'failed', error text) and re-raised, so Prefect marks the task
    failed while the flow carries on with the other models. `torch_threads` caps torch's CPU threads (the
    setting is per process; trainings in one process run one after another unless train_concurrency > 1).
    """
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    from medtx.text.experiment import run_text_experiment
    from medtx.tasks import get_task
    from medtx.training.experiment import ExperimentOptions, run_ehr_experiment

    p, db = spec["params"], Path(paths["db"])
    try:
        task = get_task(spec["task"])  # the step's task name, resolved once: the Task travels from here
        if task.family != "ehr":  # text runner (notes, FAQ)
            overrides = {"device": device, **p["overrides"]}
            run_id = run_text_experiment(db, task, p["model"], p["seed"], overrides,
                                         dataset=spec["dataset"], pipeline_run_id=pipeline_run_id,
                                         models_dir=Path(paths["models_dir"]))
        else:
            options = ExperimentOptions(models_dir=Path(paths["models_dir"]), pipeline_run_id=pipeline_run_id)
            run_id = run_ehr_experiment(db, spec["dataset"], task, p["model"], p["seed"], p["overrides"],
                                        device=device, options=options)
    except Exception as exc:
        record_failure(db, spec, pipeline_run_id, device, exc)
        raise
    return {"run_ids": [run_id]}


def run_train_from_package(
    spec: Spec, package: str, result_dir: str, *, pipeline_run_id: str | None, device: str,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    """Worker side of a training step: train from a training package alone (never the warehouse) and publish a
    result package at `result_dir`, which the flow records (medtx.pipeline.exchange). Runs anywhere that mounts the
    exchange folder: the flow's process, a local Dask worker, another machine. Every run, EHR, notes or FAQ, goes
    through the worker's entry point (`medtx.worker.train_run`, what `python -m medtx.worker` calls: no DuckDB,
    no polars)."""
    from medtx import worker

    return worker.train_run(package, spec, result_dir, device=device, pipeline_run_id=pipeline_run_id,
                            torch_threads=torch_threads)


def train_here(db: Path | str, step: Any, exchange_dir: Path | str, models_dir: Path | str, *, device: str,
               torch_threads: int | None = None) -> list[str]:
    """`medtx train`: the pipeline's training path, in this process. Export the step's training package,
    train from it (the worker's entry point), then record the result package in one transaction — the only write
    to the warehouse. A failed training is recorded too (its failed run), then the error is raised."""
    import uuid

    from medtx.pipeline import runs
    from medtx.pipeline.exchange import export_training_package, package_key, record_result_package

    prints = runs.input_fingerprints(db, step)
    package = export_training_package(db, step.reads, step.scope, exchange_dir,
                                      package_key(step.reads, step.scope, prints))
    result_dir = Path(exchange_dir) / "results" / f"cli-{uuid.uuid4().hex[:12]}" / step.name
    try:
        return run_train_from_package(step.spec(), str(package), str(result_dir), pipeline_run_id=None,
                                      device=device, torch_threads=torch_threads)["run_ids"]
    finally:
        if (result_dir / "manifest.json").exists():
            record_result_package(db, result_dir, models_dir)


def record_failure(db: Path | str, spec: Spec, pipeline_run_id: str | None, device: str, exc: BaseException) -> None:
    """Make sure a failed training shows up in ml.runs: the experiment records its own failures once it has
    started a run; this covers a failure before that (bad config, missing samples)."""
    from medtx.training import records
    from medtx.training.runs import is_synthetic

    p = spec["params"]
    with open_warehouse(db) as con:
        already = con.execute(
            "SELECT count(*) FROM ml.runs WHERE pipeline_run_id IS NOT DISTINCT FROM ? AND task = ?"
            " AND model = ? AND dataset = ? AND seed = ? AND status = 'failed'",
            [pipeline_run_id, spec["task"], p["model"], spec["dataset"], p["seed"]],
        ).fetchall()[0][0]
        if already:
            return
        run_id = records.new_run_id(spec["task"], p["model"], spec["dataset"], p["seed"])
        records.start_run(
            con, run_id, task=spec["task"], model=p["model"], dataset=spec["dataset"], seed=p["seed"],
            config={"overrides": p["overrides"]}, device=device, pipeline_run_id=pipeline_run_id,
            is_synthetic=is_synthetic(con, spec["dataset"]),
        )
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        records.fail_run(con, run_id, error)
    log.warning("%s/%s/%s failed before recording a run: %s", spec["task"], spec["dataset"], p["model"], error)


RUNNERS = {
    "synth": run_synth,
    "ingest": run_ingest,
    "reference": run_reference,
    "codes": run_codes,
    "samples": run_samples,
}


def call_step(kind: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """Run one step from the keyword arguments the executor hands a backend (medtx.pipeline.executor): the data
    steps take (spec, paths), a training step (spec, package, result_dir, pipeline_run_id, device, torch_threads).
    `name` and `fingerprints` are for the backend's cache key and display only."""
    p = {k: v for k, v in parameters.items() if k not in ("name", "fingerprints")}
    if kind == "train":
        return run_train_from_package(p.pop("spec"), p.pop("package"), p.pop("result_dir"), **p)
    return RUNNERS[kind](p["spec"], p["paths"])
