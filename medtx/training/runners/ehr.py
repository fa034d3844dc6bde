"""The EHR runner (medtx.training.runners): the runs of the neural EHR models and the EHR baselines, from the
tables of their training package, with no warehouse.

- `ehr_samples_from_tables`: the run's samples from the tables a training step reads (`samples.<table>`,
  `samples.splits`, `samples.vocab`, the task's `train_reads`, the oracle tables), each an Arrow table already
  restricted to the step's dataset and task: joined with the patient split, in (subject, hadm) order;
- `train_ehr`: fit (or train) the model, predict validation and test (and score the training split once, for
  its apparent performance), evaluate: a `RunResults`;
- `EhrRunner` / `EhrRun`: the runner protocol over them (`RUNNER`).

Imports numpy, pyarrow, torch and scikit-learn, never polars or DuckDB (the import contract in pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from medtx.metrics.bootstrap import N_BOOT
from medtx.models import frames
from medtx.models.baselines import build_baseline
from medtx.models.registry import model_names, reads_generator
from medtx.models.ehr_data import LabelSpace
from medtx.models.encoded import EncodedSet
from medtx.models.frames import Frame
from medtx.samples.tokens import Vocab
from medtx.tasks import Task, tasks_of_family
from medtx.training.ehr_evaluation import (
    Outcome,
    evaluate,
    showcase_items,
    validation_score,
)
from medtx.training.packages import ORACLE_PREFIX, package_table, rows_where
from medtx.training.results import RunResults, attention_frame
from medtx.training.runners import OnEpoch
from medtx.training.trainer import TrainConfig, fit, predict, resolve_device, set_seed



@dataclass
class RunOptions:
    """Knobs of one run that are not model hyper-parameters; a run's overrides may set them (RUN_KEYS)."""

    n_boot: int = N_BOOT
    threshold: float | None = None  # None = tune on validation (or the model's own rule)
    n_showcase: int = 5  # test samples whose attention weights are stored
    max_attention_tokens: int = 48  # bound on stored query/key positions per module
    pretrain_epochs: int | None = None  # BEHRT MLM epochs (default: the fine-tuning epochs)


@dataclass
class EhrSamples:
    """Everything a run reads: its sample rows per split (Arrow), vocabularies, label space, DDI pairs and oracle
    rows, from a training package (`ehr_samples_from_tables`)."""

    parts: dict[str, Frame]  # train / val / test sample rows
    vocabs: dict[str, Vocab]
    label_vocab: Vocab | None
    labels: LabelSpace
    ddi_pairs: list
    oracle_rows: Frame | None



# ----------------------------------------------------------------------------------------------- loading


def split_samples(tables: Mapping[str, pa.Table], dataset: str, task: Task) -> dict[str, pa.Table]:
    """The task's sample rows with their stored patient split, per split, in (subject, hadm) order (the rows of
    `samples.<table>` whose subject has a `samples.splits` row for the task; a shared table's `task` column is
    filtered on and dropped)."""
    tname = task.name
    samples = package_table(tables, f"samples.{task.table}")
    samples = rows_where(samples, dataset=dataset, **({"task": tname} if task.samples.shared else {}))
    if task.samples.shared and "task" in samples.column_names:
        samples = samples.drop_columns(["task"])
    splits = rows_where(package_table(tables, "samples.splits"), dataset=dataset, task=tname)
    subjects = splits.column("subject_id").combine_chunks()
    if len(pc.unique(subjects)) != len(subjects):
        raise ValueError(f"dataset {dataset!r}, task {tname!r}: samples.splits holds a patient twice")
    at = pc.index_in(samples.column("subject_id"), value_set=subjects.cast(samples.column("subject_id").type))
    keep = pc.is_valid(at)
    frame = samples.filter(keep).append_column(
        "split", pc.take(splits.column("split").combine_chunks(), pc.drop_null(at)))
    if frame.num_rows == 0:
        why = "no samples.splits rows for it" if samples.num_rows else f"no samples.{task.table} rows"
        raise ValueError(f"dataset {dataset!r}, task {tname!r}: nothing to train on ({why}); "
                         f"run `medtx map-codes --dataset {dataset}` then "
                         f"`medtx build-samples --task {tname} --dataset {dataset}`")
    frame = frame.sort_by([("subject_id", "ascending"), ("hadm_id", "ascending")])
    parts = {name: frames.where(frame, "split", name) for name in ("train", "val", "test")}
    for name, part in parts.items():
        if part.num_rows == 0:
            raise ValueError(f"dataset {dataset!r}, task {task.name!r}: the {name} split is empty "
                             f"({frame.num_rows} samples in all); use a larger cohort or other split fractions")
    return parts


def vocab_from_table(vocab: pa.Table, dataset: str, task: Task, feature: str) -> Vocab:
    """One stored vocabulary (rows of samples.vocab), in index order."""
    rows = rows_where(vocab, dataset=dataset, task=task.name, feature=feature).sort_by("idx")
    if rows.num_rows == 0:
        raise LookupError(f"no vocabulary for dataset={dataset!r} task={task.name!r} feature={feature!r}: "
                          f"run `medtx build-samples --task {task.name}` first")
    return Vocab(rows.column("token").to_pylist())


def ehr_samples_from_tables(tables: Mapping[str, pa.Table], dataset: str, task: Task, model: str) -> EhrSamples:
    """The run's samples per split, vocabularies (those the model needs), DDI pairs (tasks that read them) and
    oracle rows (the oracle baseline), from the tables of its training step (see the module docstring). A task
    the leakage gate blocked, or never checked, is refused before any model is built (medtx.tasks.verdict.check_gate_rows: the step's
    samples.leakage_gate rows, one line naming task, dataset and first offending row)."""
    from medtx.models.registry import ehr_neural_models, required_features
    from medtx.tasks.verdict import check_gate_rows, samples_fingerprint

    parts = split_samples(tables, dataset, task)  # no samples at all: "nothing to train on", with the commands
    gate_rows = package_table(tables, "samples.leakage_gate").to_pylist()
    check_gate_rows(gate_rows, task, dataset)  # before any model exists
    # ... and the samples must be those the gate judged (their fingerprint is in its record)
    check_gate_rows(gate_rows, task, dataset, samples_fingerprint(package_table(tables, f"samples.{task.table}"),
                                                                  package_table(tables, "samples.splits"), task, dataset))
    vocab = package_table(tables, "samples.vocab")
    features = required_features(model, task) if model in ehr_neural_models() else ()
    vocabs = {f: vocab_from_table(vocab, dataset, task, f) for f in features}
    label = task.samples.label_feature
    label_vocab = vocab_from_table(vocab, dataset, task, label) if label else None
    ddi_pairs: list = []
    if "ref.ddi_atc3" in task.lineage.train_reads:
        ddi = package_table(tables, "ref.ddi_atc3")
        ddi_pairs = list(zip(ddi.column("atc3_a").to_pylist(), ddi.column("atc3_b").to_pylist(), strict=True))
    oracle_rows = None
    if reads_generator(model):
        name = f"{ORACLE_PREFIX}{task.name}"
        oracle_rows = rows_where(frames.arrow(tables[name]), dataset=dataset) if name in tables else pa.table({})
    labels = LabelSpace.from_vocab(label_vocab, task.binary, task.samples.label_name)
    return EhrSamples(parts, vocabs, label_vocab, labels, ddi_pairs, oracle_rows)


# ----------------------------------------------------------------------------------------------- running


TRAIN_KEYS = frozenset(f.name for f in dataclasses.fields(TrainConfig))  # the trainer's keys (epochs, lr, ...)
# The run's own knobs a run's overrides may set (RunOptions): how much it stores and how it is evaluated.
RUN_KEYS = frozenset(f.name for f in dataclasses.fields(RunOptions))


def run_options(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The run-option keys of a run's overrides (RUN_KEYS: n_boot, n_showcase ...), RunOptions fields."""
    return {k: v for k, v in (overrides or {}).items() if k in RUN_KEYS}


def _split_overrides(overrides: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trainer keys (epochs, lr, batch_size, ...) vs model keys (d_model, n_layers, ...); run options apart."""
    overrides = {k: v for k, v in (overrides or {}).items() if k not in RUN_KEYS}
    return ({k: v for k, v in overrides.items() if k in TRAIN_KEYS},
            {k: v for k, v in overrides.items() if k not in TRAIN_KEYS})


def task_train_defaults(task: Task, model: str) -> dict[str, Any]:
    """The task's trainer defaults for the model (`Task.train_defaults`); a key TrainConfig lacks is an error."""
    defaults = task.train_defaults_for(model)
    unknown = sorted(set(defaults) - TRAIN_KEYS)
    if unknown:
        raise ValueError(f"task {task.name!r}: train_defaults for {model!r} name {unknown}, which are no TrainConfig fields")
    return defaults


def _run_baseline(task: Task, model: str, data: EhrSamples, overrides: dict[str, Any], seed: int = 0) -> Outcome:
    parts = data.parts
    baseline = build_baseline(model, task, data.labels, data.oracle_rows, overrides, seed).fit(parts["train"],
                                                                                              parts["val"])
    started = time.perf_counter()
    p_train = baseline.predict_proba(parts["train"])  # the apparent (training-split) performance
    return Outcome(baseline.predict_proba(parts["val"]), baseline.predict_proba(parts["test"]),
                   baseline.fixed_threshold, dict(baseline.config), p_train=p_train,
                   train_seconds=time.perf_counter() - started)


def _run_neural(task: Task, model: str, data: EhrSamples, cfg: TrainConfig, model_overrides: dict[str, Any],
                opts: RunOptions, out_dir: Path, on_epoch: OnEpoch) -> Outcome:
    from medtx.models.registry import (  # imported late to keep baselines light
        build_ehr_model,
        sigmoid_proba,
    )

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
    started = time.perf_counter()  # one eval pass over the training split: the apparent performance
    p_train = predict(bundle.model, encoded["train"], bundle.collate, device, proba, batch).probs
    train_seconds = time.perf_counter() - started
    # The attention export is its own pass over the few showcase items (explicit attention, weights kept).
    shown = predict(bundle.model, showcase_items(items["test"], opts.n_showcase, opts.max_attention_tokens),
                    bundle.collate, device, proba, batch, output_attentions=True)
    config = {"model": dataclasses.asdict(bundle.config) if dataclasses.is_dataclass(bundle.config)
              else bundle.config, "train": dataclasses.asdict(cfg)}
    return Outcome(p_val, p_test, None, config, sum(p.numel() for p in bundle.model.parameters()),
                   result.best_epoch, result.device,
                   attention_frame(shown.sample_ids, shown.attentions, opts.max_attention_tokens, keep="last"),
                   checkpoints, p_train=p_train, train_seconds=train_seconds)


def _write_vocab_files(folder: Path, vocabs: dict[str, Vocab], label_vocab: Vocab | None) -> None:
    """vocab.json beside the weights: the token lists the checkpoint's ids refer to."""
    payload = {"features": {f: v.tokens for f, v in vocabs.items()},
               "labels": label_vocab.tokens if label_vocab is not None else None}
    (folder / "vocab.json").write_text(json.dumps(payload))


def train_config(task: Task, model: str, seed: int, overrides: dict[str, Any] | None, *, epochs: int | None = None,
                 device: str = "auto") -> tuple[TrainConfig, dict[str, Any]]:
    """(trainer config, model overrides): the task's monitor and trainer defaults < the run's overrides."""
    if task.family != "ehr":
        ehr_tasks = tuple(t.name for t in tasks_of_family("ehr"))
        raise ValueError(f"unknown EHR task {task.name!r}; expected one of {ehr_tasks}")
    train_overrides, model_overrides = _split_overrides(overrides)
    if epochs is not None:
        train_overrides["epochs"] = epochs
    cfg = TrainConfig(**{"monitor": task.scoring.monitor, "seed": seed, "device": device, **task_train_defaults(task, model),
                         **train_overrides})
    return cfg, model_overrides


def train_ehr(task: Task, model: str, seed: int, cfg: TrainConfig, model_overrides: dict[str, Any],
              opts: RunOptions, data: EhrSamples, folder: Path, on_epoch: OnEpoch) -> RunResults:
    """Fit or train one model on the run's samples, predict validation and test, evaluate: its `RunResults`."""
    started = time.perf_counter()
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    if model in model_names("ehr_baseline"):  # the four in baselines.py and any in its own file (gbm.py)
        outcome = _run_baseline(task, model, data, model_overrides, seed)
    else:
        outcome = _run_neural(task, model, data, cfg, model_overrides, opts, folder, on_epoch)
    return evaluate(task, model, seed, data.parts, data.labels, data.ddi_pairs, outcome, opts.n_boot,
                    opts.threshold, time.perf_counter() - started)


# ----------------------------------------------------------------------------------------------- the runner


@dataclass(frozen=True)
class EhrRun:
    """One EHR run, its settings checked (medtx.training.runners.Run)."""

    task: Task
    model: str
    seed: int
    cfg: TrainConfig
    model_overrides: dict[str, Any]
    opts: RunOptions
    overrides: dict[str, Any]  # as given: what ml.runs.config records until the model's own config replaces it

    def samples(self, tables: Mapping[str, pa.Table], dataset: str) -> EhrSamples:
        return ehr_samples_from_tables(tables, dataset, self.task, self.model)

    def describe(self, samples: EhrSamples) -> dict[str, Any]:
        return {"overrides": self.overrides}

    def train(self, samples: EhrSamples, folder: Path, on_epoch: OnEpoch, cache: Path | None = None) -> RunResults:
        return train_ehr(self.task, self.model, self.seed, self.cfg, self.model_overrides, self.opts, samples, folder,
                         on_epoch)


class EhrRunner:
    """The neural EHR models and the EHR baselines (medtx.training.runners.Runner)."""

    model_families = ("ehr", "ehr_baseline")
    modules = ("medtx.training.runners.ehr",)
    code_parts: tuple[str, ...] = ()  # the whole medtx package

    def serves(self, task: Task) -> bool:
        return task.family == "ehr"

    def prepare(self, task: Task, model: str, seed: int, overrides: Mapping[str, Any], *,
                device: str = "auto") -> EhrRun:
        cfg, model_overrides = train_config(task, model, seed, dict(overrides), device=device)
        return EhrRun(task, model, seed, cfg, model_overrides, RunOptions(**run_options(dict(overrides))),
                      dict(overrides))

    def config_classes(self, spec: Any, task: Task) -> list[tuple[type, dict[str, Any]]]:
        """A baseline's registered config (none: it takes no overrides); a neural model's and the trainer's."""
        from medtx.models.registry import model_defaults

        if spec.family == "ehr_baseline":
            return [(spec.config, model_defaults(spec.name, task, spec.family))] if spec.config else []
        return [(spec.config, model_defaults(spec.name, task)), (TrainConfig, task.train_defaults_for(spec.name))]


RUNNER = EhrRunner()
