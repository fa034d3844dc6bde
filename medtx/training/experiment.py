"""One EHR experiment end to end: samples + split + vocab -> model -> (pre-train) -> fit -> threshold on
validation -> test metrics with a patient bootstrap -> everything into `ml.*`.

`run_ehr_experiment` is what `medtx train`, the pipeline's train steps and the benchmarks call. It opens the
warehouse only for short reads and writes (never across training), so a long run does not lock the file.

Protocol (stated in ml.runs / ml.metrics and RESULTS.md):
- Model selection on validation only: early stopping on the validation `monitor` (PR-AUC for multi-label
  tasks, AUPRC for readmission), the decision threshold tuned on validation (grid 0.05..0.95, maximising
  visit-averaged Jaccard for drug_rec, F1 for next_visit) unless the model fixes its own rule
  (most_frequent: top-k; copy_last: 0.5) or `threshold=` is given (`threshold_source='fixed'`).
- Test metrics: mean ± sd over 10 resamples of 80% of test patients (without replacement); set metrics both
  visit-averaged ('visit', PyHealth/sklearn samples) and patient-averaged ('patient', SafeDrug).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import torch

from medtx.db import open_warehouse as _open_warehouse
from medtx.db import quote_table
from medtx.fingerprint import code_version, tables_fingerprint
from medtx.metrics.binary import binary_metrics
from medtx.metrics.bootstrap import N_BOOT, bootstrap
from medtx.metrics.ddi import ddi_matrix, ddi_pair_counts
from medtx.metrics.multilabel import patient_average, per_visit_metrics, tune_threshold, visit_average
from medtx.models.baselines import BASELINE_MODELS, build_baseline, label_matrix
from medtx.models.ehr_data import LabelSpace, task_spec
from medtx.models.encoded import EncodedSet
from medtx.samples.vocab import Vocab, load_vocab
from medtx.tasks import get_task, tasks_of_family
from medtx.training import records
from medtx.training.runs import attention_frame, is_synthetic, oracle_exists, run_folder
from medtx.training.trainer import TrainConfig, fit, predict, resolve_device, set_seed

log = logging.getLogger("medtx.training")

# Views of the task registry (medtx/tasks/).
EHR_TASKS = tuple(t.name for t in tasks_of_family("ehr"))
MONITOR = {t.name: t.monitor for t in tasks_of_family("ehr")}
TUNE_METRIC = {t.name: t.tune_metric for t in tasks_of_family("ehr") if t.tune_metric}
RECALL_KS = {t.name: t.recall_ks for t in tasks_of_family("ehr") if not t.binary}
# Per-visit metrics reported both visit- and patient-averaged; the rest are pooled or sizes.
AVERAGED = ("pr_auc_samples", "roc_auc_samples", "jaccard_samples", "f1_samples", "precision_samples",
            "recall_samples", "recall_at_10", "recall_at_20")
SIZES = ("avg_pred_size", "avg_true_size")
MAX_PREDICTION_ROWS = 2_000_000  # above this, ml.predictions keeps only the labels that matter (see below)
TOP_LABELS_KEPT = 30


@dataclass
class ExperimentOptions:
    """Knobs of one run that are not model hyper-parameters."""

    n_boot: int = N_BOOT
    threshold: float | None = None  # None = tune on validation (or the model's own rule)
    n_showcase: int = 5  # test samples whose attention weights are stored
    max_attention_tokens: int = 48  # bound on stored query/key positions per module
    models_dir: Path | None = None  # checkpoints go to <models_dir>/<run_id>/
    pretrain_epochs: int | None = None  # BEHRT MLM epochs (default: the fine-tuning epochs)
    pipeline_run_id: str | None = None
    run_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- loading

LOCK_WAIT_S = 120.0  # another process (a parallel run, a reader) may hold the DuckDB file for a moment


def open_warehouse(
    db: Path | str, *, read_only: bool = False, wait_s: float = LOCK_WAIT_S
) -> AbstractContextManager[duckdb.DuckDBPyConnection]:
    """`medtx.db.open_warehouse` waiting out another process's lock: connections are short, so the wait is too."""
    return _open_warehouse(db, read_only=read_only, wait_s=wait_s)


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


# ----------------------------------------------------------------------------------------------- evaluation


def validation_score(task: str):
    """score(y_true, y_prob) for the trainer's per-epoch validation (threshold-free monitor + 0.5 set metrics)."""
    def score(y_true: np.ndarray, y_prob: np.ndarray) -> dict[str, float]:
        if task_spec(task).binary:
            return binary_metrics(y_true[:, 0], y_prob[:, 0])
        rows = per_visit_metrics(y_true, y_prob, 0.5)
        return {k: visit_average(rows[k]) for k in ("pr_auc_samples", "jaccard_samples", "f1_samples")}
    return score


def choose_threshold(task: str, y_val: np.ndarray, p_val: np.ndarray, fixed_by_model: float | None,
                     fixed_by_user: float | None) -> tuple[float, str]:
    """(threshold, source): the user's, else the model's own rule, else tuned on validation."""
    if fixed_by_user is not None:
        return fixed_by_user, "fixed"
    if fixed_by_model is not None:
        return fixed_by_model, "model_rule"
    if task_spec(task).binary:
        return 0.5, "fixed"  # readmission metrics are threshold-free
    threshold, _ = tune_threshold(y_val, p_val, TUNE_METRIC[task])
    return threshold, "tuned_on_val"


def multilabel_test_metrics(y: np.ndarray, p: np.ndarray, patients: np.ndarray, threshold: float, task: str,
                            ddi: np.ndarray | None, n_boot: int, seed: int) -> list[tuple]:
    """(metric, averaging, mean, sd, n_boot) rows: bootstrap over test patients of per-visit values."""
    rows = per_visit_metrics(y, p, threshold, RECALL_KS[task])
    if ddi is not None:
        rows["_ddi_pred"], rows["_pairs_pred"] = ddi_pair_counts(p >= threshold, ddi)
        rows["_ddi_true"], rows["_pairs_true"] = ddi_pair_counts(y >= 0.5, ddi)

    def stat(idx: np.ndarray) -> dict[str, float]:
        out = {}
        for name in AVERAGED:
            if name in rows:
                out[f"{name}|visit"] = visit_average(rows[name][idx])
                out[f"{name}|patient"] = patient_average(rows[name][idx], patients[idx])
        for name in SIZES:
            out[f"{name}|visit"] = visit_average(rows[name][idx])
        if ddi is not None:
            for kind in ("pred", "true"):
                pairs = rows[f"_pairs_{kind}"][idx].sum()
                rate = rows[f"_ddi_{kind}"][idx].sum() / pairs if pairs > 0 else 0.0
                out[("ddi_rate" if kind == "pred" else "ddi_rate_true") + "|none"] = float(rate)
        return out

    result = bootstrap(stat, patients, n_boot=n_boot, seed=seed)
    return [(*key.split("|"), mean, sd, n_boot) for key, (mean, sd) in result.items()]


def binary_test_metrics(y: np.ndarray, p: np.ndarray, patients: np.ndarray, n_boot: int, seed: int) -> list[tuple]:
    result = bootstrap(lambda idx: binary_metrics(y[idx, 0], p[idx, 0]), patients, n_boot=n_boot, seed=seed)
    rows = [(name, "none", mean, sd, n_boot) for name, (mean, sd) in result.items()]
    rows.append(("positive_rate", "none", float(y.mean()), None, None))
    return rows


def point_metrics(task: str, y: np.ndarray, p: np.ndarray, patients: np.ndarray, threshold: float) -> list[tuple]:
    """Validation figures (no bootstrap): same names as test, sd NULL."""
    if task_spec(task).binary:
        return [(k, "none", v, None, None) for k, v in binary_metrics(y[:, 0], p[:, 0]).items()]
    rows = per_visit_metrics(y, p, threshold, RECALL_KS[task])
    out = [(k, "visit", visit_average(v), None, None) for k, v in rows.items()]
    out += [(k, "patient", patient_average(rows[k], patients), None, None) for k in AVERAGED if k in rows]
    return out


def label_metric_rows(y: np.ndarray, p: np.ndarray, threshold: float, names: list[str]) -> list[tuple]:
    """Per-label AUPRC (labels with a positive), F1 at the threshold, and support on test."""
    from sklearn.metrics import average_precision_score

    pred = p >= threshold
    truth = y >= 0.5
    support = truth.sum(axis=0)
    tp = (pred & truth).sum(axis=0)
    f1 = np.divide(2 * tp, pred.sum(axis=0) + support, out=np.zeros(len(names)),
                   where=(pred.sum(axis=0) + support) > 0)
    rows = []
    for j, name in enumerate(names):
        rows.append((name, "f1", float(f1[j]), int(support[j])))
        if 0 < support[j] < len(y):
            rows.append((name, "auprc", float(average_precision_score(truth[:, j], p[:, j])), int(support[j])))
    return rows


def prediction_frame(frame: pl.DataFrame, y: np.ndarray, p: np.ndarray, threshold: float, names: list[str],
                     text: list[str] | None = None) -> pl.DataFrame:
    """Long-form test predictions. All (sample, label) rows when N x L <= MAX_PREDICTION_ROWS; above that only
    labels that are true, predicted or among the sample's top-30 scores (stated in the run's config)."""
    n, n_labels = p.shape
    keep = np.ones_like(p, dtype=bool)
    if n * n_labels > MAX_PREDICTION_ROWS:
        top = np.argpartition(-p, min(TOP_LABELS_KEPT, n_labels) - 1, axis=1)[:, :TOP_LABELS_KEPT]
        keep = (y >= 0.5) | (p >= threshold)
        np.put_along_axis(keep, top, True, axis=1)
    rows, cols = np.nonzero(keep)
    hadm = frame["hadm_id"].to_numpy()
    out = pl.DataFrame({
        "sample_id": hadm[rows].astype(str),
        "subject_id": frame["subject_id"].to_numpy()[rows],
        "hadm_id": hadm[rows],
        "label": np.asarray(names, dtype=object)[cols].astype(str),
        "prob": p[rows, cols].astype(np.float64),
        "y_true": y[rows, cols] >= 0.5,
        "predicted": p[rows, cols] >= threshold,
    })
    if text is not None:
        out = out.with_columns(pl.Series("text", np.asarray(text, dtype=object)[rows].astype(str)))
    return out


def showcase_items(items: list[dict], n: int, max_tokens: int) -> list[dict]:
    """The first `n` test items whose every sequence fits `max_tokens` (complete attention rows), topped up
    with the next items when too few fit."""
    def length(item: dict) -> int:
        sizes = [len(v["ids"]) for v in item.values() if isinstance(v, dict) and "ids" in v]
        sizes += [len(item[k]) for k in ("input_ids", "src_ids", "tgt_ids") if k in item]
        return max(sizes, default=0)
    fitting = [it for it in items if length(it) <= max_tokens]
    rest = [it for it in items if length(it) > max_tokens]
    return (fitting + rest)[:n]


# ----------------------------------------------------------------------------------------------- running


@dataclass
class _Outcome:
    p_val: np.ndarray
    p_test: np.ndarray
    fixed_threshold: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    n_params: int | None = None
    best_epoch: int | None = None
    device: str = "cpu"
    attention: pl.DataFrame | None = None


def _split_overrides(overrides: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Trainer keys (epochs, lr, batch_size, ...) vs model keys (d_model, n_layers, ...)."""
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    return {k: v for k, v in overrides.items() if k in names}, {k: v for k, v in overrides.items() if k not in names}


def _run_baseline(db: Path, dataset: str, task: str, model: str, parts: dict[str, pl.DataFrame],
                  labels: LabelSpace, overrides: dict[str, Any]) -> _Outcome:
    oracle_rows = None
    if model == "oracle":
        with open_warehouse(db, read_only=True) as con:
            oracle_rows = load_oracle_rows(con, dataset, task)
    baseline = build_baseline(model, task, labels, oracle_rows, overrides).fit(parts["train"], parts["val"])
    return _Outcome(baseline.predict_proba(parts["val"]), baseline.predict_proba(parts["test"]),
                    baseline.fixed_threshold, dict(baseline.config))


def _run_neural(db: Path, run_id: str, task: str, model: str, parts: dict[str, pl.DataFrame],
                vocabs: dict[str, Vocab], label_vocab: Vocab | None, cfg: TrainConfig,
                model_overrides: dict[str, Any], opts: ExperimentOptions, out_dir: Path) -> _Outcome:
    from medtx.models.registry import build_ehr_model  # the models stage; imported late to keep baselines light

    # Seed before the model exists: its initial weights must depend on the run's seed alone, not on whatever
    # this process drew before (fit() seeds again for shuffling and dropout).
    set_seed(cfg.seed)
    bundle = build_ehr_model(model, task, vocabs, label_vocab, model_overrides or None)
    items = {name: bundle.encode(frame) for name, frame in parts.items()}
    if bundle.init_from_train is not None:  # e.g. the transformer's output bias from training label frequencies
        bundle.init_from_train(items["train"])
    if bundle.mlm is not None:
        from medtx.training.pretrain import pretrain_mlm

        pre_cfg = dataclasses.replace(cfg, monitor="loss", epochs=opts.pretrain_epochs or cfg.epochs)
        pre = pretrain_mlm(bundle.mlm, items["train"], items["val"], pre_cfg, out_dir / "pretrain")
        with open_warehouse(db) as con:
            records.register_checkpoint(con, run_id, "pretrained", str(pre.best_dir), pre.best_epoch,
                                        "mlm_loss", pre.best_value)
    # Each split collated to tensors once, reused by every epoch, validation and prediction.
    encoded = {name: EncodedSet(split, bundle.collate) for name, split in items.items()}
    score = validation_score(task)
    # The trainer's default (sigmoid of the forward's logits) avoids a second forward pass per batch.
    from medtx.models.registry import sigmoid_proba

    proba = None if bundle.predict_proba is sigmoid_proba else bundle.predict_proba

    def on_epoch(epoch: int, metrics: dict[str, float]) -> None:
        with open_warehouse(db) as con:
            records.write_epochs(con, run_id, epoch, metrics)

    result = fit(bundle.model, encoded["train"], encoded["val"], bundle.collate, cfg, out_dir, score=score,
                 predict_proba=proba, on_epoch=on_epoch)
    _write_vocab_files(result.best_dir, vocabs, label_vocab)
    with open_warehouse(db) as con:
        records.register_checkpoint(con, run_id, "best", str(result.best_dir), result.best_epoch, cfg.monitor,
                                    result.best_value)
        records.register_checkpoint(con, run_id, "last", str(result.last_dir), len(result.history))
    device = resolve_device(cfg.device)
    batch = cfg.eval_batch_size or 2 * cfg.batch_size
    p_val = predict(bundle.model, encoded["val"], bundle.collate, device, proba, batch).probs
    p_test = predict(bundle.model, encoded["test"], bundle.collate, device, proba, batch).probs
    # The attention export is its own pass over the few showcase items (explicit attention, weights kept).
    shown = predict(bundle.model, showcase_items(items["test"], opts.n_showcase, opts.max_attention_tokens),
                    bundle.collate, device, proba, batch, output_attentions=True)
    config = {"model": dataclasses.asdict(bundle.config) if dataclasses.is_dataclass(bundle.config)
              else bundle.config, "train": dataclasses.asdict(cfg)}
    return _Outcome(p_val, p_test, None, config, sum(p.numel() for p in bundle.model.parameters()),
                    result.best_epoch, result.device,
                    attention_frame(shown.sample_ids, shown.attentions, opts.max_attention_tokens, keep="last"))


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
    db, opts = Path(db), options or ExperimentOptions()
    train_overrides, model_overrides = _split_overrides(overrides)
    if epochs is not None:
        train_overrides["epochs"] = epochs
    cfg = TrainConfig(**{"monitor": MONITOR[task], "seed": seed, "device": device, **train_overrides})
    run_id = opts.run_id or records.new_run_id(task, model, dataset, seed)
    with open_warehouse(db) as con:
        fingerprint = tables_fingerprint(con, [f"samples.{task_spec(task).table}", "samples.splits"],
                                         {"dataset": dataset, "task": task})
        synthetic = is_synthetic(con, dataset)
        records.start_run(con, run_id, task=task, model=model, dataset=dataset, seed=seed,
                          config={"overrides": overrides or {}}, device=str(resolve_device(device)),
                          data_fingerprint=fingerprint, code_version=code_version(),
                          is_synthetic=synthetic, pipeline_run_id=opts.pipeline_run_id)
    started = time.perf_counter()
    try:
        with open_warehouse(db, read_only=False) as con:
            parts = load_split_samples(con, dataset, task)
            vocabs, label_vocab = load_task_vocabs(con, dataset, task, model)
            ddi_pairs = load_ddi_pairs(con) if "ref.ddi_atc3" in get_task(task).train_reads else []
        labels = LabelSpace.from_vocab(label_vocab, task_spec(task).binary, task_spec(task).label_name)
        set_threads = cfg.num_threads
        if set_threads:
            torch.set_num_threads(set_threads)
        if model in BASELINE_MODELS:
            outcome = _run_baseline(db, dataset, task, model, parts, labels, model_overrides)
        else:
            out_dir = run_folder(opts.models_dir or db.parent / "models", run_id)
            outcome = _run_neural(db, run_id, task, model, parts, vocabs, label_vocab, cfg, model_overrides,
                                  opts, out_dir)
        _evaluate_and_record(db, run_id, task, model, seed, parts, labels, ddi_pairs, outcome, opts,
                             time.perf_counter() - started)
    except BaseException as exc:
        with open_warehouse(db) as con:
            records.fail_run(con, run_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
        raise
    return run_id


def _evaluate_and_record(db: Path, run_id: str, task: str, model: str, seed: int, parts: dict[str, pl.DataFrame],
                         labels: LabelSpace, ddi_pairs: list, outcome: _Outcome, opts: ExperimentOptions,
                         seconds: float) -> None:
    from medtx.metrics.collapse import is_collapsed

    y_val = label_matrix(parts["val"], task, labels)
    y_test = label_matrix(parts["test"], task, labels)
    for name, y, p in (("val", y_val, outcome.p_val), ("test", y_test, outcome.p_test)):
        if p.shape != y.shape:
            raise ValueError(f"{model}: {name} probabilities have shape {p.shape}, labels {y.shape} "
                             "(label vocabulary mismatch between model and samples)")
    threshold, source = choose_threshold(task, y_val, outcome.p_val, outcome.fixed_threshold, opts.threshold)
    patients_val = parts["val"]["subject_id"].to_numpy()
    patients = parts["test"]["subject_id"].to_numpy()
    if labels.binary:
        test_rows = binary_test_metrics(y_test, outcome.p_test, patients, opts.n_boot, seed)
        collapsed, reason = is_collapsed(outcome.p_test[:, 0])
    else:
        ddi = ddi_matrix(ddi_pairs, labels.names) if "ref.ddi_atc3" in get_task(task).train_reads else None
        test_rows = multilabel_test_metrics(y_test, outcome.p_test, patients, threshold, task, ddi,
                                            opts.n_boot, seed)
        collapsed, reason = is_collapsed(outcome.p_test, multilabel=True, threshold=threshold)
    test_rows += [("n_samples", "none", float(len(y_test)), None, None),
                  ("n_patients", "none", float(len(np.unique(patients))), None, None)]
    config = {**outcome.config, "threshold": threshold, "threshold_source": source, "n_boot": opts.n_boot,
              "bootstrap": "80% of test patients without replacement, sd ddof=0",
              "predictions_stored": "all" if y_test.size <= MAX_PREDICTION_ROWS
              else f"true, predicted or top-{TOP_LABELS_KEPT} labels per sample"}
    with open_warehouse(db) as con:
        records.write_metrics(con, run_id, "val", point_metrics(task, y_val, outcome.p_val, patients_val, threshold))
        records.write_metrics(con, run_id, "test", test_rows)
        if not labels.binary:
            records.write_label_metrics(con, run_id, "test",
                                        label_metric_rows(y_test, outcome.p_test, threshold, labels.names))
        records.write_predictions(con, run_id, prediction_frame(parts["test"], y_test, outcome.p_test, threshold,
                                                                labels.names))
        if outcome.attention is not None and outcome.attention.height:
            records.write_attention(con, run_id, outcome.attention)
        records.finish_run(con, run_id, threshold=threshold, threshold_source=source, collapsed=collapsed,
                           collapse_reason=reason, n_params=outcome.n_params, best_epoch=outcome.best_epoch,
                           train_seconds=seconds, device=outcome.device, config=config)
    summary = {m: v for m, a, v, *_ in test_rows if a in ("visit", "none") and m in (*AVERAGED, "auroc", "ddi_rate")}
    log.info("run %s completed: %s", run_id, ", ".join(f"{k}={v:.4f}" for k, v in summary.items()))
