"""Evaluation of one EHR run, pure: validation scores for the trainer, the decision threshold (tuned on
validation only), test metrics with the 10 x 80% patient subsample sd (SafeDrug's convention; the 95% patient
bootstrap intervals are added when the run is recorded, medtx.evaluation.uncertainty), per-label scores, long-form
predictions, and the `RunResults` that the EHR runner returns.

Protocol (stated in ml.runs / ml.metrics and RESULTS.md):
- The decision threshold is tuned on validation (grid 0.05..0.95, maximising visit-averaged Jaccard for
  drug_rec, F1 for next_visit: each task's `tune_metric`) unless the model fixes its own rule
  (most_frequent: top-k; copy_last: 0.5) or `threshold=` is given (`threshold_source='fixed'`).
- Set metrics are reported both visit-averaged ('visit', PyHealth/sklearn samples) and patient-averaged
  ('patient', SafeDrug).
- The training split is scored once with the fitted model (`Outcome.p_train`): its figures are ml.metrics rows
  with split 'train', the validation rows' metrics as point estimates (the apparent performance, optimistic by
  construction); its predictions are not kept.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from medtx.metrics.binary import binary_metrics
from medtx.metrics.bootstrap import bootstrap
from medtx.metrics.ddi import ddi_matrix, ddi_pair_counts
from medtx.metrics.multilabel import (
    patient_average,
    per_visit_metrics,
    tune_threshold,
    visit_average,
)
from medtx.models import frames
from medtx.models.baselines import label_matrix
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame
from medtx.tasks import Task
from medtx.training.results import RunResults

log = logging.getLogger("medtx.training")

# Views of the task registry (medtx/tasks/).
# Per-visit metrics reported both visit- and patient-averaged; the rest are pooled or sizes.
AVERAGED = ("pr_auc_samples", "roc_auc_samples", "jaccard_samples", "f1_samples", "precision_samples",
            "recall_samples", "recall_at_10", "recall_at_20")
SIZES = ("avg_pred_size", "avg_true_size")
MAX_PREDICTION_ROWS = 2_000_000  # above this, ml.predictions keeps only the labels that matter (see below)
TOP_LABELS_KEPT = 30


@dataclass
class Outcome:
    """What fitting a model (neural or baseline) leaves for evaluation: validation and test probabilities and
    what the run records beside them."""

    p_val: np.ndarray
    p_test: np.ndarray
    fixed_threshold: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    n_params: int | None = None
    best_epoch: int | None = None
    device: str = "cpu"
    attention: Frame | None = None
    checkpoints: dict[str, tuple] = field(default_factory=dict)  # kind -> (path, epoch[, metric, value])
    # The fitted model's probabilities on its own training split (None: not scored) and the seconds that took:
    # the apparent performance (PLP's train vs validation vs test), point estimates only, no rows kept.
    p_train: np.ndarray | None = None
    train_seconds: float = 0.0



def validation_score(task: Task):
    """score(y_true, y_prob) for the trainer's per-epoch validation (threshold-free monitor + 0.5 set metrics)."""
    def score(y_true: np.ndarray, y_prob: np.ndarray) -> dict[str, float]:
        if task.binary:
            return binary_metrics(y_true[:, 0], y_prob[:, 0])
        rows = per_visit_metrics(y_true, y_prob, 0.5)
        return {k: visit_average(rows[k]) for k in ("pr_auc_samples", "jaccard_samples", "f1_samples")}
    return score


def choose_threshold(task: Task, y_val: np.ndarray, p_val: np.ndarray, fixed_by_model: float | None,
                     fixed_by_user: float | None) -> tuple[float, str]:
    """(threshold, source): the user's, else the model's own rule, else tuned on validation."""
    if fixed_by_user is not None:
        return fixed_by_user, "fixed"
    if fixed_by_model is not None:
        return fixed_by_model, "model_rule"
    if task.binary:
        return 0.5, "fixed"  # readmission metrics are threshold-free
    threshold, _ = tune_threshold(y_val, p_val, task.scoring.tune_metric)
    return threshold, "tuned_on_val"


def multilabel_test_metrics(y: np.ndarray, p: np.ndarray, patients: np.ndarray, threshold: float, task: Task,
                            ddi: np.ndarray | None, n_boot: int, seed: int) -> list[tuple]:
    """(metric, averaging, mean, sd, n_boot) rows: bootstrap over test patients of per-visit values."""
    rows = per_visit_metrics(y, p, threshold, task.scoring.recall_ks)
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


def point_metrics(task: Task, y: np.ndarray, p: np.ndarray, patients: np.ndarray, threshold: float) -> list[tuple]:
    """Validation figures (no bootstrap): same names as test, sd NULL."""
    if task.binary:
        return [(k, "none", v, None, None) for k, v in binary_metrics(y[:, 0], p[:, 0]).items()]
    rows = per_visit_metrics(y, p, threshold, task.scoring.recall_ks)
    out = [(k, "visit", visit_average(v), None, None) for k, v in rows.items()]
    out += [(k, "patient", patient_average(rows[k], patients), None, None) for k in AVERAGED if k in rows]
    return out


TRAIN_FIGURES = ("apparent performance: the fitted model scored on its own training split, point estimates (no "
                 "interval), optimistic by construction; no training prediction is stored")


def train_metrics(task: Task, y: np.ndarray, p: np.ndarray, patients: np.ndarray, threshold: float) -> list[tuple]:
    """The training split's figures (ml.metrics split='train'): the validation rows' metrics, computed the same way
    on the samples the model was fitted on (the run's threshold for set metrics)."""
    return point_metrics(task, y, p, patients, threshold)


def point_summary(task: Task, y: np.ndarray, p: np.ndarray, threshold: float, ddi: np.ndarray | None
                  ) -> dict[str, float]:
    """The headline test figures on the whole test split: the point estimates ml.metrics stores once the run is
    recorded (medtx.evaluation.uncertainty), not the mean of the 10 x 80% subsamples."""
    if task.binary:
        return {"auroc": binary_metrics(y[:, 0], p[:, 0])["auroc"]}
    rows = per_visit_metrics(y, p, threshold, task.scoring.recall_ks)
    out = {name: visit_average(rows[name]) for name in AVERAGED if name in rows}
    if ddi is not None:
        hits, pairs = ddi_pair_counts(p >= threshold, ddi)
        out["ddi_rate"] = float(hits.sum() / pairs.sum()) if pairs.sum() > 0 else 0.0
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


def prediction_frame(frame: Frame, y: np.ndarray, p: np.ndarray, threshold: float, names: list[str],
                     text: list[str] | None = None) -> pa.Table:
    """Long-form test predictions. All (sample, label) rows when N x L <= MAX_PREDICTION_ROWS; above that only
    labels that are true, predicted or among the sample's top-30 scores (stated in the run's config)."""
    n, n_labels = p.shape
    keep = np.ones_like(p, dtype=bool)
    if n * n_labels > MAX_PREDICTION_ROWS:
        top = np.argpartition(-p, min(TOP_LABELS_KEPT, n_labels) - 1, axis=1)[:, :TOP_LABELS_KEPT]
        keep = (y >= 0.5) | (p >= threshold)
        np.put_along_axis(keep, top, True, axis=1)
    rows, cols = np.nonzero(keep)
    hadm = frames.numbers(frame, "hadm_id").astype(np.int64)
    out = pa.table({
        "sample_id": pa.array(hadm[rows].astype(str).tolist(), type=pa.string()),
        "subject_id": frames.numbers(frame, "subject_id").astype(np.int64)[rows],
        "hadm_id": hadm[rows],
        "label": pa.array(np.asarray(names, dtype=object)[cols].astype(str).tolist(), type=pa.string()),
        "prob": p[rows, cols].astype(np.float64),
        "y_true": y[rows, cols] >= 0.5,
        "predicted": p[rows, cols] >= threshold,
    })
    if text is not None:
        out = out.append_column("text", pa.array(np.asarray(text, dtype=object)[rows].astype(str).tolist(),
                                                 type=pa.string()))
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


def evaluate(task: Task, model: str, seed: int, parts: dict[str, Frame], labels: LabelSpace,
             ddi_pairs: list, outcome: Outcome, n_boot: int, threshold: float | None, seconds: float
             ) -> RunResults:
    """Threshold on validation, test metrics, per-label scores, predictions: the run's `RunResults`."""
    from medtx.metrics.collapse import is_collapsed

    y_val = label_matrix(parts["val"], task, labels)
    y_test = label_matrix(parts["test"], task, labels)
    y_train = label_matrix(parts["train"], task, labels) if outcome.p_train is not None else None
    for name, y, p in (("val", y_val, outcome.p_val), ("test", y_test, outcome.p_test),
                       ("train", y_train, outcome.p_train)):
        if p is None:
            continue
        if p.shape != y.shape:
            raise ValueError(f"{model}: {name} probabilities have shape {p.shape}, labels {y.shape} "
                             "(label vocabulary mismatch between model and samples)")
    threshold, source = choose_threshold(task, y_val, outcome.p_val, outcome.fixed_threshold, threshold)
    patients = frames.numbers(parts["test"], "subject_id")
    ddi = None
    if labels.binary:
        test_rows = binary_test_metrics(y_test, outcome.p_test, patients, n_boot, seed)
        collapsed, reason = is_collapsed(outcome.p_test[:, 0])
    else:
        ddi = ddi_matrix(ddi_pairs, labels.names) if "ref.ddi_atc3" in task.lineage.train_reads else None
        test_rows = multilabel_test_metrics(y_test, outcome.p_test, patients, threshold, task, ddi, n_boot, seed)
        collapsed, reason = is_collapsed(outcome.p_test, multilabel=True, threshold=threshold)
    test_rows += [("n_samples", "none", float(len(y_test)), None, None),
                  ("n_patients", "none", float(len(np.unique(patients))), None, None)]
    config = {**outcome.config, "threshold": threshold, "threshold_source": source, "n_boot": n_boot,
              "bootstrap": "80% of test patients without replacement, sd ddof=0",
              "predictions_stored": "all" if y_test.size <= MAX_PREDICTION_ROWS
              else f"true, predicted or top-{TOP_LABELS_KEPT} labels per sample"}
    val_rows = point_metrics(task, y_val, outcome.p_val, frames.numbers(parts["val"], "subject_id"), threshold)
    metrics = {"val": val_rows, "test": test_rows}
    if y_train is not None and outcome.p_train is not None:
        started = time.perf_counter()
        metrics["train"] = train_metrics(task, y_train, outcome.p_train,
                                         frames.numbers(parts["train"], "subject_id"), threshold)
        config["train_split"] = {"figures": TRAIN_FIGURES,
                                 "seconds": round(outcome.train_seconds + time.perf_counter() - started, 3)}
    summary = point_summary(task, y_test, outcome.p_test, threshold, ddi)
    log.info("%s %s seed %d (test, whole split): %s", task.name, model, seed,
             ", ".join(f"{k}={v:.4f}" for k, v in summary.items()))
    return RunResults(
        metrics=metrics,
        label_metrics={} if labels.binary else
        {"test": label_metric_rows(y_test, outcome.p_test, threshold, labels.names)},
        predictions=prediction_frame(parts["test"], y_test, outcome.p_test, threshold, labels.names),
        # validation predictions: what recalibration and operating points are fitted on (medtx.evaluation.trust)
        val_predictions=prediction_frame(parts["val"], y_val, outcome.p_val, threshold, labels.names).drop_columns(
            ["predicted"]),
        attention=outcome.attention, checkpoints=outcome.checkpoints,
        summary={"threshold": threshold, "threshold_source": source, "collapsed": collapsed,
                 "collapse_reason": reason, "n_params": outcome.n_params, "best_epoch": outcome.best_epoch,
                 "train_seconds": seconds, "device": outcome.device, "config": config})
