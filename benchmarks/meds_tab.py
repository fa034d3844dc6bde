"""Benchmark: what MEDS-Tab (XGBoost, 0.2.0) reaches on medtx's MEDS export of a synthetic cohort (issue 33).

Prepares (reused from --workdir) `synth:<patients>` - generate, ingest, map-codes, build-samples - exports it with
the task's labels, then runs MEDS-Tab as a researcher would on the export as written: describe, tabularize
(static + time series, windows 1d/30d/365d/full), cache the task, XGBoost with an Optuna sweep of --trials.
Prints MEDS-Tab's held-out AUROC with a 95% patient-bootstrap interval (1,000 resamples over held-out subjects).

`--at-discharge` is the leak control: the same stays labelled at their discharge (the old mortality definition's
prediction time), where HOSPITAL_DISCHARGE//DIED and MEDS_DEATH are visible - MEDS-Tab should then find the
outcome (the issue measured 0.995-0.998 on the old export).

MEDS-Tab comes from the pinned venv tests/test_meds_tools.py builds (tests/meds_tools/requirements-tab.txt, cached
under ~/.cache/medtx/meds-tools); give its bin folder with --tools when it lives elsewhere.

    .venv/bin/python benchmarks/meds_tab.py [--patients 2000] [--seed 42] [--task mortality] [--trials 20]
                                            [--at-discharge] [--workdir var/bench-meds-tab] [--tools BIN]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parent.parent
WINDOWS = "[1d,30d,365d,full]"
# static/first needs a static code with a numeric value; the export's only static code is GENDER
AGGS = "[static/present,code/count,value/count,value/sum,value/sum_sqd,value/min,value/max]"


def _default_tools() -> Path:
    pins = REPO / "tests" / "meds_tools" / "requirements-tab.txt"
    digest = hashlib.sha256(pins.read_bytes()).hexdigest()[:16]
    return Path.home() / ".cache" / "medtx" / "meds-tools" / f"tab-{digest}" / "bin"


def prepare(workdir: Path, patients: int, seed: int, task: str) -> tuple[Path, str, Path]:
    from medtx.codes import map_codes
    from medtx.ingest import ingest_mimic3
    from medtx.meds import export_meds
    from medtx.tasks.build import build_samples
    from medtx.store.db import connect
    from medtx.synth import generate_mimic3

    dataset = f"synth_{patients}"
    db = workdir / "warehouse.duckdb"
    if not db.exists():
        generate_mimic3(workdir / "synth", n_patients=patients, seed=seed)
        ingest_mimic3(db, workdir / "synth", dataset, workdir / "cache")
        con = connect(db)
        try:
            map_codes(con, REPO / "data", [dataset])
            build_samples(con, REPO / "data", [task], [dataset])
        finally:
            con.close()
    out = workdir / "meds"
    con = connect(db)
    try:
        export_meds(con, dataset, out, labels=[task], overwrite=True)
    finally:
        con.close()
    return db, dataset, out


def discharge_labels(db: Path, dataset: str, export: Path, task: str, folder: Path) -> Path:
    """The task's labels moved to their stay's discharge (same stays, same outcomes), shard for shard."""
    import duckdb

    from medtx.store.db import quote_table
    from medtx.tasks import get_task

    with duckdb.connect(str(db), read_only=True) as con:
        stays = pl.from_arrow(con.execute("SELECT subject_id, hadm_id, dischtime FROM raw.admissions "
                                          "WHERE dataset = ?", [dataset]).to_arrow_table())
        spec = get_task(task)
        shared_sql = " AND task = $task" if spec.samples.shared else ""
        samples = con.execute("SELECT subject_id, hadm_id, CAST(prediction_time AS TIMESTAMP) AS prediction_time "
                              f"FROM {quote_table(spec.samples.table)} WHERE dataset = $dataset{shared_sql}",
                              {"dataset": dataset, **({"task": task} if spec.samples.shared else {})}).to_arrow_table()
        samples = pl.from_arrow(samples)
    moved = samples.join(stays, on=["subject_id", "hadm_id"])
    for path in (export / "labels" / task).rglob("*.parquet"):
        labels = pl.read_parquet(path).join(moved, on=["subject_id", "prediction_time"], how="left")
        assert labels["dischtime"].null_count() == 0, path
        target = folder / path.relative_to(export / "labels" / task)
        target.parent.mkdir(parents=True, exist_ok=True)
        labels.select("subject_id", pl.col("dischtime").alias("prediction_time"), "boolean_value").write_parquet(target)
    return folder


def run_meds_tab(tools: Path, export: Path, labels: Path, task: str, out: Path, trials: int) -> dict[str, float]:
    common = [f"input_dir={export / 'data'}", f"output_dir={out}", "tabularization.min_code_inclusion_count=10",
              f"tabularization.window_sizes={WINDOWS}", f"tabularization.aggs={AGGS}"]
    steps = {
        "describe": [tools / "meds-tab-describe", f"input_dir={export / 'data'}", f"output_dir={out}"],
        "tabularize_static": [tools / "meds-tab-tabularize-static", *common],
        "tabularize_time_series": [tools / "meds-tab-tabularize-time-series", *common],
        "cache_task": [tools / "meds-tab-cache-task", *common, f"input_label_dir={labels}", f"task_name={task}"],
        "xgboost": [tools / "meds-tab-xgboost", "--multirun", *common, f"output_model_dir={out / ('model_' + task)}",
                    f"task_name={task}", f"hydra.sweeper.n_trials={trials}", "hydra.sweeper.n_jobs=1"],
    }
    seconds = {}
    for name, cmd in steps.items():
        t = time.perf_counter()
        done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"MEDS-Tab {name} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        seconds[name] = round(time.perf_counter() - t, 1)
    return seconds


def held_out_auroc(out: Path, task: str, n_boot: int = 1000, seed: int = 0) -> tuple[float, float, float, int, int, int]:
    from sklearn.metrics import roc_auc_score

    path = sorted(out.glob(f"model_{task}/*/best_trial/held_out_predictions.parquet"))[-1]
    frame = pl.read_parquet(path)
    y = frame["boolean_value"].to_numpy()
    p = frame["predicted_boolean_probability"].to_numpy()
    subjects = frame["subject_id"].to_numpy()
    units = np.unique(subjects)
    rows = {u: np.flatnonzero(subjects == u) for u in units}
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_boot):
        pick = np.concatenate([rows[u] for u in rng.choice(units, len(units))])
        if 0 < y[pick].sum() < len(pick):
            values.append(roc_auc_score(y[pick], p[pick]))
    low, high = np.percentile(values, [2.5, 97.5])
    return float(roc_auc_score(y, p)), float(low), float(high), len(y), int(y.sum()), len(units)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patients", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--task", default="mortality")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--at-discharge", action="store_true", help="leak control: labels at the discharge")
    parser.add_argument("--workdir", type=Path, default=REPO / "var" / "bench-meds-tab")
    parser.add_argument("--tools", type=Path, default=None, help="bin folder of a venv with MEDS-Tab 0.2.0")
    args = parser.parse_args()
    tools = args.tools or _default_tools()
    if not (tools / "meds-tab-xgboost").exists():
        raise SystemExit(f"{tools}: no MEDS-Tab here; run tests/test_meds_tools.py once, or pass --tools")
    args.workdir.mkdir(parents=True, exist_ok=True)
    db, dataset, export = prepare(args.workdir, args.patients, args.seed, args.task)
    name = f"{args.task}_at_discharge" if args.at_discharge else args.task
    labels = (discharge_labels(db, dataset, export, args.task, args.workdir / "labels_at_discharge")
              if args.at_discharge else export / "labels" / args.task)
    out = args.workdir / "tab"  # shared by the tasks: MEDS-Tab tabularizes once and keeps a folder per task
    seconds = run_meds_tab(tools, export, labels, name, out, args.trials)
    auroc, low, high, n, positives, patients = held_out_auroc(out, name)
    print(f"MEDS-Tab XGBoost ({args.trials} trials), {name} on {dataset}: held-out AUROC {auroc:.3f} "
          f"(95% CI {low:.3f}-{high:.3f}; {n} stays, {positives} positive, {patients} patients); seconds {seconds}")


if __name__ == "__main__":
    main()
