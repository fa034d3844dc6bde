"""Would a clinician trust it? Subgroups, calibration and operating points of one recorded run -> ml.subgroups,
ml.subgroup_gaps, ml.calibration, ml.reliability, ml.operating_points, ml.decision_curve (migration 0018),
ml.recalibration and ml.operating_targets (migration 0019: what each map and target was decided, and why).
Every figure obeys the floors of medtx.evaluation.floors.

When: right after a run's intervals and comparisons (`medtx.evaluation.analysis.analyse_run`, called by
records.finish_run), for every binary and multi-label run whose samples are patients' admissions
(`Task.samples_are_admissions`: the EHR tasks and the discharge-summary view of readmission); other runs (MTSamples
specialty, the FAQ) get none. Everything is recomputed
from what the warehouse stores: the run's test predictions (ml.predictions), its validation predictions
(ml.val_predictions: the only data recalibration and operating-point thresholds are fitted on), the reference
baseline's test predictions (the paired verdicts per group) and the demographics of the test admissions
(raw.patients / raw.admissions, grouped by medtx.evaluation.groups). The patient-resample count matrix is the
one the run's overall intervals use (same size, same seed), so a group's interval is a column subset of it.

Runs whose predictions were stored truncated (very large label spaces) get subgroups but no calibration or
recalibration (missing cells would read as confident negatives); that is logged.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import duckdb
import numpy as np

from medtx.evaluation import calibration as cal
from medtx.evaluation import operating as op
from medtx.evaluation.groups import sample_groups
from medtx.evaluation.groups import ATTRIBUTES
from medtx.evaluation.subgroups import (CITL, GAP_METHOD, OVERALL, OVERALL_GROUP, gap_metrics, largest_gaps,
                                        subgroup_results)
from medtx.evaluation.uncertainty import RunData, load_run_data
from medtx.metrics import intervals as iv
from medtx.store.db import insert_rows, quote_table, transaction
from medtx.tasks import Task, find_task

log = logging.getLogger("medtx.evaluation.trust")

TABLES = ("ml.subgroups", "ml.subgroup_gaps", "ml.calibration", "ml.reliability", "ml.operating_points",
          "ml.decision_curve", "ml.recalibration", "ml.operating_targets")
KINDS = ("binary", "multilabel")
# The ranking metric recomputed after each recalibration map (a monotone map leaves it; isotonic ties may not).
RANKING_AFTER = {"binary": ("auroc", "none"), "multilabel": ("pr_auc_samples", "visit")}


def applies(task: Task | None) -> bool:
    """Binary and multi-label tasks whose samples are admissions (subgroups read the admission's demographics)."""
    return task is not None and task.kind in KINDS and task.samples_are_admissions


def subgroup_metrics(task: Task) -> list[tuple[str, str]]:
    """The metrics reported per group: a binary task's headline metrics, a multi-label task's compared ones; then
    calibration-in-the-large (observed minus expected rate), which shows a group whose risk the model misjudges."""
    if task.kind == "binary":
        return [*((m, "none") for m in task.scoring.metrics), CITL]
    return [*task.scoring.compared, CITL]


@dataclass
class TrustResult:
    groups: list
    gaps: list
    calibration: list[tuple]  # (method, metric, value, lo, hi, ci_method, params, n_fit)
    reliability: list[tuple]  # (method, *reliability row)
    operating: list[tuple]
    decision: list[tuple]
    reference_run_id: str | None
    seconds: float = 0.0
    recalibration: list[tuple] = field(default_factory=list)  # ml.recalibration rows less run_id
    targets: list = field(default_factory=list)  # operating.TargetChoice per named target


def _run_info(con: duckdb.DuckDBPyConnection, run_id: str) -> tuple[str, str | None]:
    found = con.execute("SELECT task, dataset FROM ml.runs WHERE run_id = ?", [run_id]).fetchall()
    if not found:
        raise ValueError(f"trust: no ml.runs row for run {run_id!r}")
    return found[0]


def load_val_units(con: duckdb.DuckDBPyConnection, run_id: str) -> np.ndarray:
    """The patient of each validation sample, in `load_val_arrays`' sample order (the out-of-fold folds of
    recalibration split patients); the sample itself where no patient is stored."""
    rows = dict(con.execute("SELECT sample_id, any_value(coalesce(CAST(subject_id AS VARCHAR), 's:' || sample_id)) "
                            "FROM ml.val_predictions WHERE run_id = ? GROUP BY sample_id", [run_id]).fetchall())
    return np.array([rows[s] for s in np.unique(np.array(list(rows), dtype=object))], dtype=object)


def load_val_arrays(con: duckdb.DuckDBPyConnection, run_id: str, labels: list[str] | None
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """(y, p) of the run's validation predictions: 1-D for binary (labels None), (samples, labels) in `labels`
    order for multi-label; None when the run stored none."""
    frame = con.sql("SELECT sample_id, label, prob, y_true FROM ml.val_predictions WHERE run_id = ?",
                    params=[run_id]).pl()
    if frame.height == 0:
        return None
    samples, s_idx = np.unique(frame["sample_id"].to_numpy(), return_inverse=True)
    if labels is None:
        y, p = np.zeros(len(samples)), np.zeros(len(samples))
        y[s_idx] = frame["y_true"].fill_null(False).to_numpy()
        p[s_idx] = frame["prob"].fill_null(0.0).to_numpy()
        return y, p
    position = {name: j for j, name in enumerate(labels)}
    l_idx = np.array([position.get(str(x), -1) for x in frame["label"].to_list()])
    keep = l_idx >= 0
    y, p = np.zeros((len(samples), len(labels))), np.zeros((len(samples), len(labels)))
    y[s_idx[keep], l_idx[keep]] = frame["y_true"].fill_null(False).to_numpy()[keep]
    p[s_idx[keep], l_idx[keep]] = frame["prob"].fill_null(0.0).to_numpy()[keep]
    return y, p


def _test_labels(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    return [str(r) for r, in con.execute("SELECT DISTINCT label FROM ml.predictions WHERE run_id = ? ORDER BY label",
                                         [run_id]).fetchall()]


def _aligned_reference(con: duckdb.DuckDBPyConnection, task: Task, dataset: str | None, run_id: str,
                       data: RunData) -> tuple[str | None, RunData | None]:
    from medtx.evaluation.comparisons import reference_run

    ref_id = reference_run(con, task, dataset, like=run_id)
    if ref_id is None or ref_id == run_id:
        return ref_id if ref_id == run_id else None, None
    ref = load_run_data(con, ref_id)
    if ref is None or len(ref.sample_ids) != len(data.sample_ids) or not np.array_equal(ref.sample_ids, data.sample_ids):
        log.warning("trust: run %s and its reference %s predicted different test samples; no per-group verdicts",
                    run_id, ref_id)
        return None, None
    return ref_id, ref


def _subgroups(con: duckdb.DuckDBPyConnection, task: Task, dataset: str | None, run_id: str, data: RunData,
               counts: np.ndarray, inverse: np.ndarray) -> tuple[list, dict, str | None]:
    """(per-group rows, the groups' resampled values the gaps read, the reference run id) of one run."""
    hadm = np.array([int(s) for s in data.sample_ids], dtype=np.int64)
    groups = {OVERALL: np.full(len(hadm), OVERALL_GROUP, dtype=object), **sample_groups(con, dataset, hadm)}
    ref_id, ref = _aligned_reference(con, task, dataset, run_id, data)
    data.stats(inverse, counts.shape[1], only=())  # per-visit rows computed once; group subsets reuse them
    group_rows, boot = subgroup_results(data, ref, groups, subgroup_metrics(task), counts, inverse,
                                        attributes=(OVERALL, *ATTRIBUTES))
    return group_rows, boot, ref_id


def compute_trust(con: duckdb.DuckDBPyConnection, run_id: str, n_boot: int = iv.N_BOOT, seed: int = 0
                  ) -> TrustResult | None:
    """Every figure of the run (nothing written); None when the run's task does not qualify (`applies`) or it
    stored no test predictions."""
    started = time.perf_counter()
    task_name, dataset = _run_info(con, run_id)
    task = find_task(task_name)  # None: a stored name the registry no longer knows
    if task is None or not applies(task):
        return None
    data = load_run_data(con, run_id)
    if data is None:
        return None
    n_units, inverse = iv.unit_index(data.units)
    counts = iv.resample_counts(n_units, n_boot, seed)
    binary = task.kind == "binary"

    group_rows, boot, ref_id = _subgroups(con, task, dataset, run_id, data, counts, inverse)
    gaps = largest_gaps(boot, gap_metrics(subgroup_metrics(task), task.kind))

    # calibration, before and after recalibration fitted on validation
    y, p = data.arrays["y"].astype(np.float64), data.arrays["p"]
    calibration_rows: list[tuple] = []
    reliability_rows: list[tuple] = []
    operating_rows: list[tuple] = []
    decision_rows: list[tuple] = []
    recal_rows: list[tuple] = []
    targets: list = []
    val = load_val_arrays(con, run_id, None if binary else _test_labels(con, run_id))
    if data.truncated:
        log.info("trust: run %s stored truncated predictions; no calibration figures", run_id)
    else:
        variants: list[tuple[str, np.ndarray, str | None, int | None]] = [("none", p, None, None)]
        if val is None:
            log.warning("trust: run %s stored no validation predictions; no recalibration or operating points", run_id)
        else:
            units = load_val_units(con, run_id)
            units = units if len(units) == len(val[0]) else None  # folds of samples, should they ever disagree
            for d in cal.recalibration_decisions(task.kind, *val, units=units):
                q = d.fitted.apply(p) if d.fitted is not None else None
                distinct = int(np.unique(q).size) if q is not None else None
                recal_rows.append((d.method, d.status, d.reason, d.n_fit, d.n_events, d.oof_original, d.oof_mapped,
                                   distinct))
                if q is None:
                    log.info("trust: run %s: no %s recalibration: %s", run_id, d.method, d.reason)
                else:
                    variants.append((d.method, q, json.dumps(d.fitted.params), d.fitted.n_fit))
        rank_metric = RANKING_AFTER[task.kind]
        for method, q, params, n_fit in variants:
            figures = cal.calibration_figures(y, q, inverse, counts)
            if method != "none":
                mapped = RunData(data.sample_ids, data.units, {**data.arrays, "p": q}, data.kind, data.truncated,
                                 {k: v for k, v in data.extra.items() if k != "_rows"})
                stat = mapped.stats(inverse, n_units, only=[rank_metric])[rank_metric]
                value, lo, hi = iv.interval(stat, counts)
                figures[rank_metric[0]] = (value, lo, hi, iv.CI_METHOD)
            for metric, (value, lo, hi, method_ci) in figures.items():
                calibration_rows.append((method, metric, value, lo, hi, method_ci, params, n_fit))
            reliability_rows += [(method, *row) for row in cal.reliability(y, q, inverse, counts)]
        if not binary:  # a pooled ECE can hide badly calibrated labels: each label's ECE beside it
            calibration_rows += per_label_ece(y, p, inverse, n_units, _test_labels(con, run_id))
        if binary and val is not None:
            targets = op.choose_targets(*val)
            operating_rows = op.operating_points(val[0], val[1], y, p, inverse, counts)
            decision_rows = op.decision_curve(y, p, inverse, counts)
    return TrustResult(group_rows, gaps, calibration_rows, reliability_rows, operating_rows, decision_rows, ref_id,
                       time.perf_counter() - started, recal_rows, targets)


def per_label_ece(y: np.ndarray, p: np.ndarray, inverse: np.ndarray, n_units: int, labels: list[str]) -> list[tuple]:
    """ml.calibration rows (method 'none') of the per-label test ECE of a multi-label run: `ece_label_median`
    and `ece_label_max` (params: the worst label, its events, the labels counted), over labels with a test event."""
    values = []
    for j in range(p.shape[1]):
        if y[:, j].any():
            values.append((iv.point(iv.ece_stat(y[:, j], p[:, j], inverse, n_units), n_units), j, int(y[:, j].sum())))
    if not values:
        return []
    worst = max(values)
    method_ci = iv.CI_METHOD + iv.WITHHELD
    return [("none", "ece_label_median", float(np.median([v for v, *_ in values])), None, None, method_ci, None, None),
            ("none", "ece_label_max", float(worst[0]), None, None, method_ci,
             json.dumps({"label": labels[worst[1]] if worst[1] < len(labels) else str(worst[1]),
                        "events": worst[2], "labels": len(values)}), None)]


def _num(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


def _insert_groups(con: duckdb.DuckDBPyConnection, run_id: str, groups: list, ref: str | None, n_boot: int) -> None:
    if groups:
        insert_rows(con, "ml.subgroups", [
            (run_id, g.attribute, g.group, g.metric, g.averaging, g.n_patients, g.n_samples, g.n_positives,
             g.too_small, _num(g.value), _num(g.ci_low), _num(g.ci_high), ref if ref != run_id else None,
             _num(g.diff), _num(g.diff_low), _num(g.diff_high), g.verdict, n_boot, g.withheld, _num(g.p_value),
             g.verdict_adjusted) for g in groups])


def refresh_verdicts(con: duckdb.DuckDBPyConnection, run_id: str, n_boot: int = iv.N_BOOT, seed: int = 0) -> bool:
    """Rewrite the run's ml.subgroups rows against the current reference baseline; nothing else of the run's
    trust figures reads the reference (its gaps, calibration, operating points and decision curve stay as
    stored). False, and nothing written, when the run gets no trust figures."""
    task_name, dataset = _run_info(con, run_id)
    task = find_task(task_name)
    data = load_run_data(con, run_id) if task is not None and applies(task) else None
    if data is None:
        return False
    n_units, inverse = iv.unit_index(data.units)
    group_rows, _, ref_id = _subgroups(con, task, dataset, run_id, data, iv.resample_counts(n_units, n_boot, seed),
                                       inverse)
    with transaction(con):
        con.execute("DELETE FROM ml.subgroups WHERE run_id = ?", [run_id])
        _insert_groups(con, run_id, group_rows, ref_id, n_boot)
    return True


def write_trust(con: duckdb.DuckDBPyConnection, run_id: str, result: TrustResult | None, n_boot: int = iv.N_BOOT
                ) -> None:
    """Replace the run's rows in the trust tables (one transaction); None clears them."""
    with transaction(con):
        for table in TABLES:
            con.execute(f"DELETE FROM {quote_table(table)} WHERE run_id = ?", [run_id])
        if result is None:
            return
        _insert_groups(con, run_id, result.groups, result.reference_run_id, n_boot)
        if result.gaps:
            insert_rows(con, "ml.subgroup_gaps", [
                (run_id, g.attribute, g.metric, g.averaging, g.group_high, g.group_low, g.gap, _num(g.ci_low),
                 _num(g.ci_high), GAP_METHOD, g.detected, g.largest, g.n_groups) for g in result.gaps])
        if result.calibration:
            insert_rows(con, "ml.calibration", [(run_id, m, metric, _num(v), _num(lo), _num(hi), ci, params, n_fit)
                                                for m, metric, v, lo, hi, ci, params, n_fit in result.calibration])
        if result.reliability:
            insert_rows(con, "ml.reliability", [
                (run_id, m, b, _num(pl_), _num(ph), n, _num(mp), _num(o), _num(lo), _num(hi))
                for m, b, pl_, ph, n, mp, o, lo, hi in result.reliability])
        if result.operating:
            insert_rows(con, "ml.operating_points", [(run_id, t, th, m, _num(v), _num(lo), _num(hi), _num(vv))
                                                     for t, th, m, v, lo, hi, vv in result.operating])
        if result.recalibration:
            insert_rows(con, "ml.recalibration", [(run_id, m, st, why, n, ev, _num(o), _num(mp), d)
                                                  for m, st, why, n, ev, o, mp, d in result.recalibration])
        if result.targets:
            insert_rows(con, "ml.operating_targets", [
                (run_id, c.target, c.status, c.reason, c.threshold, c.val_alerts, c.val_events, c.val_samples)
                for c in result.targets])
        if result.decision:
            insert_rows(con, "ml.decision_curve", [(run_id, t, _num(nb), _num(lo), _num(hi), _num(ta))
                                                   for t, nb, lo, hi, ta in result.decision])


def analyse_trust(con: duckdb.DuckDBPyConnection, run_id: str) -> TrustResult | None:
    """Compute and store the run's trust figures; then bring other runs' per-group verdicts of the same (task,
    dataset) up to date when the reference baseline changed since they were computed."""
    result = compute_trust(con, run_id)
    write_trust(con, run_id, result)
    if result is not None:
        log.info("trust: run %s: %d group rows, %d gaps, %d calibration rows in %.2f s", run_id, len(result.groups),
                 len(result.gaps), len(result.calibration), result.seconds)
        task, dataset = _run_info(con, run_id)
        stale = [r for r, in con.execute(
            "SELECT DISTINCT s.run_id FROM ml.subgroups s JOIN ml.runs r USING (run_id) WHERE r.task = ? "
            "AND r.dataset IS NOT DISTINCT FROM ? AND s.run_id <> ? AND s.run_id <> ? "
            "AND s.reference_run_id IS DISTINCT FROM ?",
            [task, dataset, run_id, result.reference_run_id or "", result.reference_run_id]).fetchall()]
        started = time.perf_counter()
        for other in stale:  # the reference changed: their per-group verdicts named the old one
            refresh_verdicts(con, other)
        if stale:
            log.info("trust: the reference of %s/%s is now %s: %d other run(s) recomputed in %.2f s", task, dataset,
                     result.reference_run_id, len(stale), time.perf_counter() - started)
    return result
