"""Test-set uncertainty of recorded runs: 95% patient-bootstrap intervals on every test metric (ml.metrics)
and paired comparisons against the reference baseline (ml.comparisons). Pure numpy in medtx.metrics.intervals;
this module only reads a run's stored test predictions (ml.predictions) and writes the results.

When: `analyse_run` is called by `records.finish_run`, so every EHR, text and FAQ run gets its intervals the
moment it completes, and its (task, dataset) comparisons are brought up to date: the new run is compared with
the current reference, and when the reference itself changes (a better baseline on validation was recorded)
every run of that (task, dataset) is recompared, so ml.comparisons never mixes two references.

Units resampled: test patients (subject_id) for EHR tasks and readmission notes; note groups (group_id) for
MTSamples; question/answer pairs for the FAQ. Runs whose predictions were stored truncated (very large label
spaces, see ehr_evaluation.prediction_frame) get the ranking metrics' intervals from the stored cells only; their
ci_method says so. The ECE, and any metric whose estimate lies outside its own percentile interval, get no
interval: the bootstrap is biased for them, and their ci_method says that too (`intervals.WITHHELD`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache, partial

import duckdb
import numpy as np
import polars as pl

from medtx.store.db import arrow_rows, insert_rows, quote_table, transaction
from medtx.metrics import intervals as iv
from medtx.metrics.ddi import ddi_matrix, ddi_pair_counts
from medtx.metrics.multilabel import average_precision_rows, recall_at_k_rows, roc_auc_rows, set_metric_rows
from medtx.tasks import find_task

log = logging.getLogger("medtx.evaluation.uncertainty")

AVERAGED = ("pr_auc_samples", "roc_auc_samples", "jaccard_samples", "f1_samples", "precision_samples",
            "recall_samples", "recall_at_10", "recall_at_20", "brier")
RANKING = ("pr_auc_samples", "roc_auc_samples", "recall_at_10", "recall_at_20")


@dataclass
class RunData:
    """One run's test split as arrays, sample-aligned; `build(inverse, n_units)` -> {(metric, averaging): Stat}."""

    sample_ids: np.ndarray
    units: np.ndarray
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    kind: str = "binary"
    truncated: bool = False
    extra: dict = field(default_factory=dict)

    def reorder(self, order: np.ndarray) -> RunData:
        extra = dict(self.extra)
        if "_rows" in extra:  # cached per-sample values move with their samples
            extra["_rows"] = {k: v[order] for k, v in extra["_rows"].items()}
        return RunData(self.sample_ids[order], self.units[order], {k: v[order] for k, v in self.arrays.items()},
                       self.kind, self.truncated, extra)

    def stats(self, inverse: np.ndarray, n_units: int, only: Collection[tuple[str, str]] | None = None
              ) -> dict[tuple[str, str], iv.Stat]:
        """{(metric, averaging): Stat} of every metric of the run's kind, or of those in `only`. A subgroup or a
        comparison reads 2-4 of the ~25; building the others (the ECE's bin tables, a mean per metric and
        averaging) took 7 of the full-scale pipeline's 75 s of analysis."""
        return {key: make() for key, make in _BUILDERS[self.kind](self, inverse, n_units).items()
                if only is None or key in only}


Makers = dict[tuple[str, str], Callable[[], iv.Stat]]  # each Stat built only when asked for


def _multilabel_stats(d: RunData, inverse: np.ndarray, n_units: int) -> Makers:
    y, p, pred = d.arrays["y"], d.arrays["p"], d.arrays["pred"]
    rows = d.extra.get("_rows")
    if rows is None:  # per-visit values: the costly part, computed once per run (intervals and comparisons)
        rows = {"pr_auc_samples": average_precision_rows(y, p), "roc_auc_samples": roc_auc_rows(y, p),
                **set_metric_rows(y, pred), "brier": ((p - y) ** 2).mean(axis=1)}
        for k in d.extra.get("ks", ()):
            rows[f"recall_at_{k}"] = recall_at_k_rows(y, p, k)
        if d.extra.get("ddi") is not None:
            for kind, sets in (("ddi_rate", pred), ("ddi_rate_true", y)):
                rows[f"_{kind}_num"], rows[f"_{kind}_den"] = ddi_pair_counts(sets, d.extra["ddi"])
        d.extra["_rows"] = rows
    out: Makers = {}
    for name, values in rows.items():
        if name.startswith("_"):
            continue
        for averaging in ("visit", "patient"):
            out[(name, averaging)] = partial(iv.mean_stat, values, inverse, n_units, averaging)
    out[("avg_pred_size", "visit")] = lambda: iv.mean_stat(pred.sum(axis=1), inverse, n_units)
    out[("avg_true_size", "visit")] = lambda: iv.mean_stat(y.sum(axis=1), inverse, n_units)
    out[("ece", "none")] = partial(iv.ece_stat, y, p, inverse, n_units)
    if d.extra.get("ddi") is not None:
        for kind in ("ddi_rate", "ddi_rate_true"):
            out[(kind, "none")] = partial(iv.ratio_stat, rows[f"_{kind}_num"], rows[f"_{kind}_den"], inverse, n_units)
    return out


def _binary_stats(d: RunData, inverse: np.ndarray, n_units: int) -> Makers:
    y, p = d.arrays["y"], d.arrays["p"]
    ranking = cache(partial(iv.binary_ranking, y, p, inverse))  # one pass over the resamples serves all three

    def ranked(metric: str) -> Callable[[], iv.Stat]:
        return lambda: lambda counts: ranking()(counts)[metric]
    return {("auroc", "none"): ranked("auroc"), ("auprc", "none"): ranked("auprc"), ("rp80", "none"): ranked("rp80"),
            ("brier", "none"): lambda: iv.mean_stat((p - y) ** 2, inverse, n_units),
            ("ece", "none"): partial(iv.ece_stat, y, p, inverse, n_units),
            ("positive_rate", "none"): lambda: iv.mean_stat(y.astype(np.float64), inverse, n_units)}


def _multiclass_stats(d: RunData, inverse: np.ndarray, n_units: int) -> Makers:
    stats = cache(partial(iv.multiclass_stats, d.arrays["y"], d.arrays["pred"], d.extra["n_classes"], inverse,
                          n_units))
    return {(k, "none"): (lambda k=k: stats()[k]) for k in ("accuracy", "macro_f1", "weighted_f1")}


def _generation_stats(d: RunData, inverse: np.ndarray, n_units: int) -> Makers:
    return {("token_f1", "none"): partial(iv.mean_stat, d.arrays["f1"], inverse, n_units),
            ("exact_match", "none"): partial(iv.mean_stat, d.arrays["em"], inverse, n_units)}


_BUILDERS = {"multilabel": _multilabel_stats, "binary": _binary_stats, "multiclass": _multiclass_stats,
             "generation": _generation_stats}


# ----------------------------------------------------------------------------------------------- loading


def _run_row(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[str, str | None, float | None]:
    found = con.execute("SELECT task, dataset, threshold FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()
    row = found[0] if found else None
    if row is None:
        raise ValueError(f"uncertainty: no ml.runs row for run {run_id!r}")
    return row


def _codes(column: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(values, return_inverse=True)` of a column (sorted distinct values, each row's index among
    them), by Polars: numpy sorts string ids as Python objects (1.9 of the default pipeline's 19.6 s analysis)."""
    return column.unique().sort().to_numpy(), (column.rank("dense").to_numpy() - 1).astype(np.int64)


def _pivot(frame: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Long-form predictions -> (sample ids, first subject per sample, y, p, predicted) matrices + labels.
    Cells missing from truncated predictions are negatives, not predicted, scored 0."""
    samples, s_idx = _codes(frame["sample_id"])
    labels, l_idx = _codes(frame["label"])
    shape = (len(samples), len(labels))
    y, p, pred = np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=bool)
    y[s_idx, l_idx] = frame["y_true"].fill_null(False).to_numpy()
    p[s_idx, l_idx] = frame["prob"].fill_null(0.0).to_numpy()
    pred[s_idx, l_idx] = frame["predicted"].fill_null(False).to_numpy()
    subject = np.zeros(len(samples), dtype=object)
    subject[s_idx] = frame["subject_id"].to_numpy()
    return samples, subject, y, p, pred, [str(x) for x in labels]


# Runs loaded since `run_data_cache()` began in this context: run id -> RunData (None: no predictions).
_LOADED: ContextVar[dict[str, RunData | None] | None] = ContextVar("medtx_run_data", default=None)


@contextmanager
def run_data_cache() -> Iterator[None]:
    """Within the block, `load_run_data` loads each run once: one run's analysis read its own predictions and
    its reference's 4-5 times (intervals, comparisons, subgroups, verdicts; 290 loads, 6.5 of 27 s for the
    default pipeline's 64 runs). For a block in which no run's predictions change, as in `analyse_run`."""
    token = _LOADED.set({})
    try:
        yield
    finally:
        _LOADED.reset(token)


def load_run_data(con: duckdb.DuckDBPyConnection, run_id: str) -> RunData | None:
    """The run's test split as arrays, or None when it stored no predictions (nothing to resample); loaded once
    per `run_data_cache` block."""
    loaded = _LOADED.get()
    if loaded is None:
        return _load_run_data(con, run_id)
    if run_id not in loaded:
        loaded[run_id] = _load_run_data(con, run_id)
    return loaded[run_id]


def _load_run_data(con: duckdb.DuckDBPyConnection, run_id: str) -> RunData | None:
    task, _, threshold = _run_row(con, run_id)
    frame = con.sql("SELECT sample_id, subject_id, label, prob, y_true, predicted FROM ml.predictions "
                    "WHERE run_id = ?", params=[run_id]).pl()
    if frame.height == 0:
        return None
    spec = find_task(task)
    kind = spec.kind if spec is not None else None
    if kind == "generation":
        frame = frame.sort("sample_id")
        ids = frame["sample_id"].to_numpy()
        return RunData(ids, ids, {"f1": frame["prob"].fill_null(0.0).to_numpy(),
                                  "em": frame["y_true"].fill_null(False).to_numpy().astype(np.float64)}, "generation")
    samples, subject, y, p, pred, labels = _pivot(frame)
    if kind == "multilabel":
        ddi = None
        if "ref.ddi_atc3" in spec.lineage.train_reads:  # the task scores the DDI rate of predicted drug sets
            pairs = con.sql("SELECT atc3_a, atc3_b FROM ref.ddi_atc3").fetchall()
            ddi = ddi_matrix([tuple(r) for r in pairs], labels) if pairs else None
        return RunData(samples, subject, {"y": y, "p": p, "pred": pred}, "multilabel",
                       truncated=frame.height < y.size, extra={"ks": spec.scoring.recall_ks, "ddi": ddi})
    if kind == "multiclass":
        table = spec.samples.table
        groups = dict(con.sql(f"SELECT CAST(note_id AS VARCHAR), group_id FROM {quote_table(table)}").fetchall())
        missing = [s for s in samples if s not in groups]
        if missing:
            raise ValueError(f"run {run_id}: test note {missing[0]} has no {table} row (group unknown)")
        units = np.array([groups[s] for s in samples])
        return RunData(samples, units, {"y": y.argmax(axis=1), "pred": pred.argmax(axis=1)}, "multiclass",
                       extra={"n_classes": len(labels)})
    if y.shape[1] != 1:
        log.warning("uncertainty: run %s (task %s) has %d labels per sample and no interval rule; skipped",
                    run_id, task, y.shape[1])
        return None
    if any(s is None for s in subject):
        raise ValueError(f"run {run_id}: ml.predictions rows without subject_id; cannot resample patients")
    return RunData(samples, subject.astype(np.int64), {"y": y[:, 0] >= 0.5, "p": p[:, 0]}, "binary")


# ----------------------------------------------------------------------------------------------- intervals


def record_intervals(con: duckdb.DuckDBPyConnection, run_id: str, n_boot: int = iv.N_BOOT, seed: int = 0) -> int:
    """Write the point estimate, ci_low/ci_high/n_boot/ci_method on the run's test metrics (and add brier/ece
    rows); returns how many metrics got an interval. The old sd (subsample convention) is kept and named in
    sd_method. The ECE, and a metric whose estimate lies outside its percentile interval, get none
    (`intervals.BIASED`, `intervals.outside`): ci_low/ci_high stay empty and ci_method ends in `intervals.WITHHELD`."""
    task = _run_row(con, run_id)[0]
    spec = find_task(task)  # None: a stored name the registry no longer knows (its unit taken as patients)
    data = load_run_data(con, run_id)
    if data is None:
        log.warning("uncertainty: run %s stored no test predictions; no intervals", run_id)
        return 0
    n_units, inverse = iv.unit_index(data.units)
    counts = iv.resample_counts(n_units, n_boot, seed)
    rows = []
    for (metric, averaging), stat in data.stats(inverse, n_units).items():
        value, lo, hi = iv.interval(stat, counts)
        truncated = data.truncated and metric in RANKING
        method = iv.ci_method(spec.samples.split_unit if spec else "patient") + (
            "_truncated_predictions" if truncated else "")
        if metric in iv.BIASED or iv.outside(value, lo, hi):  # a biased bootstrap: say so, store no range
            log.info("uncertainty: run %s: %s (%s) %.4f, its resamples' 95%% range [%.4f, %.4f]; the bootstrap is "
                     "biased here, no interval stored (ci_method %s)", run_id, metric, averaging, value, lo, hi,
                     method + iv.WITHHELD)
            lo, hi, method = float("nan"), float("nan"), method + iv.WITHHELD
        rows.append((metric, averaging, value, lo, hi, method, truncated))
    existing = {(m, a): n for m, a, n in con.execute(
        "SELECT metric, averaging, n_boot FROM ml.metrics WHERE run_id = ? AND split = 'test'", [run_id]).fetchall()}
    updates, added = [], []
    for metric, averaging, value, lo, hi, method, truncated in rows:
        if (metric, averaging) in existing:
            # value becomes the point estimate on the whole test split (the runners wrote the mean of the
            # subsamples); a truncated run's ranking metrics keep the runner's value from the full scores.
            # sd_method is named once: analysed again, n_boot already holds this bootstrap's count.
            updates.append((metric, averaging, not truncated, _num(value), _num(lo), _num(hi), method,
                            f"subsample_{existing[(metric, averaging)]}x80pct_sd"))
        elif metric in ("brier", "ece"):
            added.append((run_id, "test", metric, averaging, _num(value), n_boot, _num(lo), _num(hi), method))
    with transaction(con):
        if updates:  # one statement (a statement per metric took 1.1 of the default pipeline's 19.6 s analysis)
            names = ("metric", "averaging", "exact", "value", "lo", "hi", "method", "sd_label")
            medtx_updates = arrow_rows(updates, names, f"intervals of run {run_id}")  # noqa: F841 (read by name)
            con.execute(
                "UPDATE ml.metrics m SET value = CASE WHEN u.exact THEN u.value ELSE m.value END, ci_low = u.lo, "
                "ci_high = u.hi, n_boot = ?, ci_method = u.method, "
                "sd_method = CASE WHEN m.sd IS NULL THEN NULL ELSE coalesce(m.sd_method, u.sd_label) END "
                "FROM medtx_updates u WHERE m.run_id = ? AND m.split = 'test' AND m.metric = u.metric "
                "AND m.averaging = u.averaging", [n_boot, run_id])
        insert_rows(con, "ml.metrics", added, columns=("run_id", "split", "metric", "averaging", "value", "n_boot",
                                                       "ci_low", "ci_high", "ci_method"))
        con.execute("UPDATE ml.runs SET n_test_units = ?, test_unit = ? WHERE run_id = ?",
                    [n_units, spec.unit_name if spec else "patients", run_id])
    return sum(1 for row in rows if np.isfinite(row[3]))


def _num(value: float) -> float | None:
    return value if np.isfinite(value) else None
