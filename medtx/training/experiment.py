"""One EHR experiment end to end through the run skeleton (medtx.training.skeleton): samples + split + vocab
-> model -> (pre-train) -> fit -> threshold on validation -> test metrics -> everything into `ml.*`.

`run_ehr_experiment` is what `medtx train`, the pipeline's train steps and the benchmarks call. It opens the
warehouse only for short reads and writes (never across training), so a long run does not lock the file.

Protocol (stated in ml.runs / ml.metrics and RESULTS.md): model selection on validation only: early stopping
on the validation `monitor` (PR-AUC for multi-label tasks, AUPRC for the binary ones: each task's `monitor`),
the threshold tuned on validation (medtx.training.ehr_evaluation); test metrics are the point estimate with a
95% patient-bootstrap interval (medtx.evaluation.uncertainty, when the run is recorded) and the SafeDrug-style 10 x 80%
subsample sd; set metrics both visit- and patient-averaged.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import torch

from medtx.store.db import quote_table
from medtx.store.fingerprint import tables_fingerprint
from medtx.metrics.bootstrap import N_BOOT
from medtx.models.baselines import BASELINE_MODELS, build_baseline
from medtx.models.ehr_data import LabelSpace, task_spec
from medtx.models.encoded import EncodedSet
from medtx.samples.vocab import Vocab, load_vocab
from medtx.tasks import get_task, tasks_of_family
from medtx.training import records
from medtx.training.ehr_evaluation import Outcome, evaluate, showcase_items, validation_score
from medtx.training.runs import attention_frame, oracle_exists
from medtx.training.skeleton import OnEpoch, RunPlan, execute_run
from medtx.training.trainer import TrainConfig, fit, predict, resolve_device, set_seed

# Views of the task registry (medtx/tasks/).
EHR_TASKS = tuple(t.name for t in tasks_of_family("ehr"))
MONITOR = {t.name: t.monitor for t in tasks_of_family("ehr")}


@dataclass
class ExperimentOptions:
    """Knobs of one run that are not model hyper-parameters."""

    n_boot: int = N_BOOT
    threshold: float | None = None  # None = tune on validation (or the model's own rule)
    n_showcase: int = 5  # test samples whose attention weights are stored
    max_attention_tokens: int = 48  # bound on stored query/key positions per module
    models_dir: Path | None = None  # checkpoints go to <models_dir>/<run_id>/ (default: settings models_dir)
    pretrain_epochs: int | None = None  # BEHRT MLM epochs (default: the fine-tuning epochs)
    pipeline_run_id: str | None = None
    run_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class EhrSamples:
    """Everything a run reads from the warehouse, read through one short connection before training."""

    parts: dict[str, pl.DataFrame]  # train / val / test sample rows
    vocabs: dict[str, Vocab]
    label_vocab: Vocab | None
    labels: LabelSpace
    ddi_pairs: list
    oracle_rows: pl.DataFrame | None


# ----------------------------------------------------------------------------------------------- loading

def load_split_samples(con: duckdb.DuckDBPyConnection, dataset: str, task: str) -> dict[str, pl.DataFrame]:
    """The task's sample rows joined with the stored patient split, per split, in (subject, hadm) order."""
    spec = task_spec(task)
    # A table shared by several tasks is filtered on its `task` column (the column itself is dropped).
    own_sql = " AND s.task = $task" if spec.shared else ""
    frame = con.sql(
        f"""SELECT s.*{' EXCLUDE (task)' if spec.shared else ''}, sp.split FROM {quote_table('samples.' + spec.table)} s
            JOIN samples.splits sp ON sp.dataset = s.dataset AND sp.task = $task AND sp.subject_id = s.subject_id
            WHERE s.dataset = $dataset{own_sql} ORDER BY s.subject_id, s.hadm_id""",
        params={"task": task, "dataset": dataset},
    ).pl()
    if frame.height == 0:
        n = con.execute(f"SELECT count(*) FROM {quote_table('samples.' + spec.table)} s WHERE s.dataset = $dataset{own_sql}",
                        {"dataset": dataset, **({"task": task} if spec.shared else {})}).fetchall()[0][0]
        why = "no samples.splits rows for it" if n else f"no samples.{spec.table} rows"
        raise ValueError(f"dataset {dataset!r}, task {task!r}: nothing to train on ({why}); "
                         f"run `medtx map-codes --dataset {dataset}` then "
                         f"`medtx build-samples --task {task} --dataset {dataset}`")
    splits = {name: frame.filter(pl.col("split") == name) for name in ("train", "val", "test")}
    for name, part in splits.items():
        if part.height == 0:
            raise ValueError(f"dataset {dataset!r}, task {task!r}: the {name} split is empty "
                             f"({frame.height} samples in all); use a larger cohort or other split fractions")
    return splits


def load_task_vocabs(con: duckdb.DuckDBPyConnection, dataset: str, task: str, model: str
                     ) -> tuple[dict[str, Vocab], Vocab | None]:
    """The training vocabularies a model needs (none for baselines) and the task's label vocabulary
    (None for the binary readmission task), from samples.vocab."""
    from medtx.models.registry import EHR_NEURAL_MODELS, label_feature, required_features

    features = required_features(model, task) if model in EHR_NEURAL_MODELS else ()
    vocabs = {f: load_vocab(con, dataset, task, f) for f in features}
    label = label_feature(task)
    return vocabs, (load_vocab(con, dataset, task, label) if label else None)


def load_ddi_pairs(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """ref.ddi_atc3 pairs (empty when the reference tables are not loaded)."""
    return [tuple(r) for r in con.sql("SELECT atc3_a, atc3_b FROM ref.ddi_atc3").fetchall()]


def load_oracle_rows(con: duckdb.DuckDBPyConnection, dataset: str, task: str) -> pl.DataFrame:
    """raw.synth_oracle_<task> rows of the dataset (empty frame when the table or rows are missing)."""
    if not oracle_exists(con, f"synth_oracle_{task}"):
        return pl.DataFrame()
    return con.sql(f"SELECT * FROM {quote_table('raw.synth_oracle_' + task)} WHERE dataset = ?", params=[dataset]).pl()


def load_ehr_samples(con: duckdb.DuckDBPyConnection, dataset: str, task: str, model: str) -> EhrSamples:
    """The run's samples per split, vocabularies, DDI pairs (tasks that read them) and oracle rows (oracle)."""
    parts = load_split_samples(con, dataset, task)
    vocabs, label_vocab = load_task_vocabs(con, dataset, task, model)
    ddi_pairs = load_ddi_pairs(con) if "ref.ddi_atc3" in get_task(task).train_reads else []
    labels = LabelSpace.from_vocab(label_vocab, task_spec(task).binary, task_spec(task).label_name)
    oracle_rows = load_oracle_rows(con, dataset, task) if model == "oracle" else None
    return EhrSamples(parts, vocabs, label_vocab, labels, ddi_pairs, oracle_rows)


# ----------------------------------------------------------------------------------------------- running


TRAIN_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig))  # the trainer's keys (epochs, lr, ...)


def _split_overrides(overrides: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trainer keys (epochs, lr, batch_size, ...) vs model keys (d_model, n_layers, ...)."""
    overrides = dict(overrides or {})
    return ({k: v for k, v in overrides.items() if k in TRAIN_KEYS},
            {k: v for k, v in overrides.items() if k not in TRAIN_KEYS})


def task_train_defaults(task: str, model: str) -> dict[str, Any]:
    """The task's trainer defaults for the model (`Task.train_defaults`); a key TrainConfig lacks is an error."""
    defaults = get_task(task).train_defaults_for(model)
    unknown = sorted(set(defaults) - TRAIN_KEYS)
    if unknown:
        raise ValueError(f"task {task!r}: train_defaults for {model!r} name {unknown}, which are no TrainConfig fields")
    return defaults


def _run_baseline(task: str, model: str, data: EhrSamples, overrides: dict[str, Any]) -> Outcome:
    parts = data.parts
    baseline = build_baseline(model, task, data.labels, data.oracle_rows, overrides).fit(parts["train"], parts["val"])
    return Outcome(baseline.predict_proba(parts["val"]), baseline.predict_proba(parts["test"]),
                   baseline.fixed_threshold, dict(baseline.config))


def _run_neural(task: str, model: str, data: EhrSamples, cfg: TrainConfig, model_overrides: dict[str, Any],
                opts: ExperimentOptions, out_dir: Path, on_epoch: OnEpoch) -> Outcome:
    from medtx.models.registry import build_ehr_model, sigmoid_proba  # imported late to keep baselines light

    # Seed before the model exists: its initial weights must depend on the run's seed alone, not on whatever
    # this process drew before (fit() seeds again for shuffling and dropout).
    set_seed(cfg.seed)
    bundle = build_ehr_model(model, task, data.vocabs, data.label_vocab, model_overrides or None)
    items = {name: bundle.encode(frame) for name, frame in data.parts.items()}
    # Each split collated to tensors once, reused by the data-dependent start, every epoch, validation and
    # prediction (and pre-training).
    encoded = {name: EncodedSet(split, bundle.collate) for name, split in items.items()}
    if bundle.init_from_train is not None:  # e.g. the transformer's output bias from training label frequencies
        bundle.init_from_train(encoded["train"])
    checkpoints: dict[str, tuple] = {}
    if bundle.mlm is not None:
        from medtx.training.pretrain import pretrain_mlm

        pre_cfg = dataclasses.replace(cfg, monitor="loss", epochs=opts.pretrain_epochs or cfg.epochs)
        pre = pretrain_mlm(bundle.mlm, encoded["train"], items["val"], pre_cfg, out_dir / "pretrain")
        checkpoints["pretrained"] = (str(pre.best_dir), pre.best_epoch, "mlm_loss", pre.best_value)
    # The trainer's default (sigmoid of the forward's logits) avoids a second forward pass per batch.
    proba = None if bundle.predict_proba is sigmoid_proba else bundle.predict_proba
    result = fit(bundle.model, encoded["train"], encoded["val"], bundle.collate, cfg, out_dir,
                 score=validation_score(task), predict_proba=proba, on_epoch=on_epoch)
    _write_vocab_files(result.best_dir, data.vocabs, data.label_vocab)
    checkpoints["best"] = (str(result.best_dir), result.best_epoch, cfg.monitor, result.best_value)
    checkpoints["last"] = (str(result.last_dir), len(result.history))
    device = resolve_device(cfg.device)
    batch = cfg.eval_batch_size or 2 * cfg.batch_size
    p_val = predict(bundle.model, encoded["val"], bundle.collate, device, proba, batch).probs
    p_test = predict(bundle.model, encoded["test"], bundle.collate, device, proba, batch).probs
    # The attention export is its own pass over the few showcase items (explicit attention, weights kept).
    shown = predict(bundle.model, showcase_items(items["test"], opts.n_showcase, opts.max_attention_tokens),
                    bundle.collate, device, proba, batch, output_attentions=True)
    config = {"model": dataclasses.asdict(bundle.config) if dataclasses.is_dataclass(bundle.config)
              else bundle.config, "train": dataclasses.asdict(cfg)}
    return Outcome(p_val, p_test, None, config, sum(p.numel() for p in bundle.model.parameters()),
                   result.best_epoch, result.device,
                   attention_frame(shown.sample_ids, shown.attentions, opts.max_attention_tokens, keep="last"),
                   checkpoints)


def _write_vocab_files(folder: Path, vocabs: dict[str, Vocab], label_vocab: Vocab | None) -> None:
    """vocab.json beside the weights: the token lists the checkpoint's ids refer to."""
    import json

    payload = {"features": {f: v.tokens for f, v in vocabs.items()},
               "labels": label_vocab.tokens if label_vocab is not None else None}
    (folder / "vocab.json").write_text(json.dumps(payload))


def run_ehr_experiment(
    db: Path | str, dataset: str, task: str, model: str, seed: int = 0, overrides: dict[str, Any] | None = None,
    *, epochs: int | None = None, device: str = "auto", options: ExperimentOptions | None = None,
) -> str:
    """Train (or fit) and evaluate one model on one dataset/task; returns the ml.runs run id.

    The run is recorded as `running` first and ends `completed` or `failed` (error text kept, then re-raised).
    """
    if task not in EHR_TASKS:
        raise ValueError(f"unknown EHR task {task!r}; expected one of {EHR_TASKS}")
    opts = options or ExperimentOptions()
    train_overrides, model_overrides = _split_overrides(overrides)
    if epochs is not None:
        train_overrides["epochs"] = epochs
    cfg = TrainConfig(**{"monitor": MONITOR[task], "seed": seed, "device": device, **task_train_defaults(task, model),
                         **train_overrides})

    def train(data: EhrSamples, folder: Path, on_epoch: OnEpoch) -> records.RunResults:
        started = time.perf_counter()
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        if model in BASELINE_MODELS:
            outcome = _run_baseline(task, model, data, model_overrides)
        else:
            outcome = _run_neural(task, model, data, cfg, model_overrides, opts, folder, on_epoch)
        return evaluate(task, model, seed, data.parts, data.labels, data.ddi_pairs, outcome, opts.n_boot,
                        opts.threshold, time.perf_counter() - started)

    plan = RunPlan(
        task, model, dataset, seed,
        load=lambda con: load_ehr_samples(con, dataset, task, model),
        describe=lambda data: {"overrides": overrides or {}},
        fingerprint=lambda con: tables_fingerprint(con, [f"samples.{task_spec(task).table}", "samples.splits"],
                                                   {"dataset": dataset, "task": task}),
        train=train, run_id=opts.run_id, pipeline_run_id=opts.pipeline_run_id, models_dir=opts.models_dir,
        device=str(resolve_device(device)),
    )
    return execute_run(db, plan)
