"""One EHR experiment end to end through the run skeleton (medtx.training.skeleton): samples + split + vocab
-> model -> (pre-train) -> fit -> threshold on validation -> test metrics -> everything into `ml.*`.

This is the in-process path, used by benchmarks and tests: `medtx train`, the pipeline and the GPU kit train
through a training package and `medtx.worker.train_run` instead (docs/ARCHITECTURE.md, "How a run trains"). It
opens the warehouse only for short reads and writes (never across training), so a long run does not lock the file.

Protocol (stated in ml.runs / ml.metrics and RESULTS.md): model selection on validation only: early stopping
on the validation `monitor` (PR-AUC for multi-label tasks, AUPRC for the binary ones: each task's `monitor`),
the threshold tuned on validation (medtx.training.ehr_evaluation); test metrics are the point estimate with a
95% patient-bootstrap interval (medtx.evaluation.uncertainty, when the run is recorded) and the SafeDrug-style 10 x 80%
subsample sd; set metrics both visit- and patient-averaged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from medtx.samples.vocab import Vocab, load_vocab
from medtx.store.db import quote_table
from medtx.store.fingerprint import tables_fingerprint
from medtx.tasks import Task
from medtx.training import records
from medtx.training.ehr_run import (  # noqa: F401  (re-exported: the EHR stage's API)
    TRAIN_KEYS,
    EhrSamples,
    ExperimentOptions,
    _split_overrides,
    ehr_samples_from_tables,
    split_samples,
    task_train_defaults,
    train_config,
    train_ehr,
)
from medtx.training.runs import oracle_exists
from medtx.training.skeleton import OnEpoch, RunPlan, execute_run
from medtx.training.trainer import resolve_device

# ----------------------------------------------------------------------------------------------- loading


def _scoped(con: duckdb.DuckDBPyConnection, table: str, **equal: Any) -> pa.Table:
    """The rows of `table` where each given column equals its value (columns the table lacks are skipped),
    as Arrow: what a training package holds of it (medtx.pipeline.exchange)."""
    schema, name = table.split(".")
    cols = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = ? "
                                      "AND table_name = ?", [schema, name]).fetchall()}
    used = {c: v for c, v in equal.items() if c in cols}
    where_sql = " AND ".join(f'"{c}" = ?' for c in used) or "true"
    return con.sql(f"SELECT * FROM {quote_table(table)} WHERE {where_sql}", params=list(used.values())).to_arrow_table()


def warehouse_tables(con: duckdb.DuckDBPyConnection, dataset: str, task: Task, model: str) -> dict[str, pa.Table]:
    """The tables an EHR run reads, restricted to its dataset and task, read through one connection."""
    from medtx.models.registry import reads_generator

    name = task.name
    tables = {f"samples.{task.table}": _scoped(con, f"samples.{task.table}", dataset=dataset,
                                               **({"task": name} if task.samples.shared else {})),
              "samples.splits": _scoped(con, "samples.splits", dataset=dataset, task=name),
              "samples.vocab": _scoped(con, "samples.vocab", dataset=dataset, task=name),
              # the leakage gate's record: a blocked task is refused before anything trains
              "samples.leakage_gate": _scoped(con, "samples.leakage_gate", dataset=dataset, task=name)}
    if "ref.ddi_atc3" in task.lineage.train_reads:
        tables["ref.ddi_atc3"] = _scoped(con, "ref.ddi_atc3")
    if reads_generator(model) and oracle_exists(con, f"synth_oracle_{name}"):
        tables[f"raw.synth_oracle_{name}"] = _scoped(con, f"raw.synth_oracle_{name}", dataset=dataset)
    return tables


def load_split_samples(con: duckdb.DuckDBPyConnection, dataset: str, task: Task) -> dict[str, pa.Table]:
    """The task's sample rows joined with the stored patient split, per split, in (subject, hadm) order."""
    tables = {f"samples.{task.table}": _scoped(con, f"samples.{task.table}", dataset=dataset,
                                               **({"task": task.name} if task.samples.shared else {})),
              "samples.splits": _scoped(con, "samples.splits", dataset=dataset, task=task.name)}
    return split_samples(tables, dataset, task)


def load_task_vocabs(con: duckdb.DuckDBPyConnection, dataset: str, task: Task, model: str
                     ) -> tuple[dict[str, Vocab], Vocab | None]:
    """The training vocabularies a model needs (none for baselines) and the task's label vocabulary
    (None for the binary readmission task), from samples.vocab."""
    from medtx.models.registry import ehr_neural_models, required_features

    features = required_features(model, task) if model in ehr_neural_models() else ()
    vocabs = {f: load_vocab(con, dataset, task.name, f) for f in features}
    label = task.samples.label_feature
    return vocabs, (load_vocab(con, dataset, task.name, label) if label else None)


def load_ehr_samples(con: duckdb.DuckDBPyConnection, dataset: str, task: Task, model: str) -> EhrSamples:
    """The run's samples per split, vocabularies, DDI pairs (tasks that read them) and oracle rows (oracle):
    the same rule as a worker's (`ehr_samples_from_tables`) on the same tables, read from the warehouse."""
    return ehr_samples_from_tables(warehouse_tables(con, dataset, task, model), dataset, task, model)


# ----------------------------------------------------------------------------------------------- running


def run_ehr_experiment(
    db: Path | str, dataset: str, task: Task, model: str, seed: int = 0, overrides: dict[str, Any] | None = None,
    *, epochs: int | None = None, device: str = "auto", options: ExperimentOptions | None = None,
) -> str:
    """Train (or fit) and evaluate one model on one dataset/task; returns the ml.runs run id. `task` is the
    record itself (`medtx.tasks.get_task(name)` where a name comes in): it travels, never its name.

    The run is recorded as `running` first and ends `completed` or `failed` (error text kept, then re-raised).
    """
    opts = options or ExperimentOptions()
    cfg, model_overrides = train_config(task, model, seed, overrides, epochs=epochs, device=device)

    def train(data: EhrSamples, folder: Path, on_epoch: OnEpoch) -> records.RunResults:
        return train_ehr(task, model, seed, cfg, model_overrides, opts, data, folder, on_epoch)

    plan = RunPlan(
        task.name, model, dataset, seed,
        load=lambda con: load_ehr_samples(con, dataset, task, model),
        describe=lambda data: {"overrides": overrides or {}},
        fingerprint=lambda con: tables_fingerprint(con, [f"samples.{task.table}", "samples.splits"],
                                                   {"dataset": dataset, "task": task.name}),
        train=train, run_id=opts.run_id, pipeline_run_id=opts.pipeline_run_id, models_dir=opts.models_dir,
        device=str(resolve_device(device)),
    )
    return execute_run(db, plan)
