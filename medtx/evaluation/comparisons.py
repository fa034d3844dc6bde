"""Paired comparisons of runs against the reference baseline of their (task, dataset) -> ml.comparisons.

The reference is the best NON-neural baseline on VALIDATION (never test): among completed runs of the models
that declare a `reference` place in the model registry (`registry.reference_models()`: logreg, tfidf_logreg,
retrieval, copy_last, most_frequent, majority), the highest validation value of the task's headline metric
(ml.metrics split='val'); when no candidate recorded a validation figure (MTSamples' text baselines record test
only), the first model of that fixed order — a rule set before looking at any result. Ties go to the latest run.

Each run is compared with the reference by a paired bootstrap: the same resampled test units (one count matrix,
same seed) for both, on the task's headline and set metrics (`Task.scoring.compared`). The two runs must have
predictions on the same test samples; otherwise the comparison is refused with a clear error. The functions take
the registry's `Task` (a recorded run's task name is resolved once, by the caller: medtx.evaluation.analysis).
"""

from __future__ import annotations

import logging

import duckdb
import numpy as np

from medtx.store.db import insert_rows, transaction
from medtx.metrics import intervals as iv
from medtx.evaluation.uncertainty import RunData, load_run_data
from medtx.tasks import Task

log = logging.getLogger("medtx.evaluation.uncertainty")


# A baseline model run on a pretrained neural encoder is not a non-neural reference (FAQ retrieval over MiniLM
# sentence embeddings, `embedding: minilm`, is model `retrieval` like the TF-IDF one).
NEURAL_CONFIG_SQL = "coalesce(json_extract_string(r.config, '$.faq.embedding'), '') = 'minilm'"


def reference_run(con: duckdb.DuckDBPyConnection, task: Task, dataset: str | None,
                  like: str | None = None) -> str | None:
    """The run id of the reference baseline of (task, dataset), chosen on validation; None when there is none
    (or the task declares no compared metrics). `like`: only among runs trained on the same data as that run
    (`ml.runs.data_fingerprint`: the training package's key, which covers the samples and their split; no
    restriction when that run has none), so a run trained on the current split is never measured against a
    baseline of an older split (samples rebuilt since, e.g. with another split seed), which would refuse the
    comparison and fail the run. A run on the same data that predicted other test samples still fails loudly."""
    from medtx.models.registry import reference_models

    if not task.scoring.compared:
        return None
    metric, averaging = task.scoring.compared[0]
    candidates = reference_models()
    same_sql = ""
    if like is not None:
        like_sql = "(SELECT data_fingerprint FROM ml.runs WHERE run_id = $like)"
        same_sql = f"AND ({like_sql} IS NULL OR r.data_fingerprint IS NOT DISTINCT FROM {like_sql})"
    rows = con.execute(
        f"""SELECT r.run_id, r.model, v.value FROM ml.runs r
            LEFT JOIN ml.metrics v ON v.run_id = r.run_id AND v.split = 'val' AND v.metric = $metric
                                  AND v.averaging = $averaging
            WHERE r.task = $task AND r.dataset IS NOT DISTINCT FROM $dataset AND r.status = 'completed'
              AND r.model IN (SELECT unnest($models)) AND NOT {NEURAL_CONFIG_SQL}
              AND r.run_id IN (SELECT DISTINCT run_id FROM ml.predictions) {same_sql}
            ORDER BY r.started_at DESC, r.run_id DESC""",
        {"metric": metric, "averaging": averaging, "task": task.name, "dataset": dataset,
         "models": list(candidates), **({"like": like} if like is not None else {})}).fetchall()
    if not rows:
        return None
    scored = [r for r in rows if r[2] is not None]
    if scored:
        return max(scored, key=lambda r: r[2])[0]  # max keeps the first (= latest) of equal values
    return min(rows, key=lambda r: candidates.index(r[1]))[0]


def _align(run: RunData, ref: RunData, run_id: str, ref_id: str) -> RunData:
    """`run` reordered to the reference's sample order; both must cover the same test samples."""
    if len(run.sample_ids) != len(ref.sample_ids) or set(run.sample_ids) != set(ref.sample_ids):
        raise ValueError(f"comparison {run_id} vs {ref_id}: the runs predicted different test samples "
                         f"({len(run.sample_ids)} vs {len(ref.sample_ids)}); re-run both on the same split")
    position = {s: i for i, s in enumerate(run.sample_ids)}
    return run.reorder(np.array([position[s] for s in ref.sample_ids]))


def remembered(stats: dict[tuple[str, str], iv.Stat]) -> dict[tuple[str, str], iv.Stat]:
    """The same Stats, each keeping its answer for the last count matrix of more than one row (by identity): the
    reference's resampled values, computed once for every run compared with it."""
    def keep(stat: iv.Stat) -> iv.Stat:
        memo: dict = {}

        def kept(counts: np.ndarray) -> np.ndarray:
            if memo.get("counts") is not counts:
                values = stat(counts)
                if counts.shape[0] == 1:
                    return values
                memo.update(counts=counts, values=values)
            return memo["values"]
        return kept
    return {key: keep(stat) for key, stat in stats.items()}


def compare_pair(run: RunData, ref: RunData, task: Task, run_id: str, ref_id: str, counts: np.ndarray,
                 inverse: np.ndarray, ref_stats: dict[tuple[str, str], iv.Stat] | None = None) -> list[tuple]:
    """ml.comparisons rows of one run against the reference (shared count matrix and unit index); `ref_stats`:
    the reference's Stats when the caller keeps them across runs (`remembered`)."""
    aligned = _align(run, ref, run_id, ref_id)
    n_units = counts.shape[1]
    run_stats = aligned.stats(inverse, n_units, only=task.scoring.compared)
    ref_stats = ref.stats(inverse, n_units, only=task.scoring.compared) if ref_stats is None else ref_stats
    rows = []
    for metric, averaging in task.scoring.compared:
        if (metric, averaging) not in run_stats:
            continue
        c = iv.paired_comparison(run_stats[(metric, averaging)], ref_stats[(metric, averaging)], counts)
        rows.append((run_id, ref_id, metric, averaging, _num(c.diff), _num(c.ci_low), _num(c.ci_high),
                     _num(c.p_better), c.verdict, c.n_units, counts.shape[0],
                     [float(x) for x in np.round(c.diffs[np.isfinite(c.diffs)], 6)]))
    return rows


def compare_runs(con: duckdb.DuckDBPyConnection, task: Task, dataset: str | None, run_ids: list[str] | None = None,
                 n_boot: int = iv.N_BOOT, seed: int = 0) -> int:
    """Bring ml.comparisons of (task, dataset) up to date; returns the rows written.

    `run_ids`: the runs just recorded; all completed runs are recompared when the reference changed (or when
    `run_ids` is None). One run just recorded is compared with the reference among the runs trained on its data
    (`reference_run(like=...)`)."""
    if not task.scoring.compared:
        return 0
    ref_id = reference_run(con, task, dataset, like=run_ids[0] if run_ids is not None and len(run_ids) == 1 else None)
    runs = [r for r, in con.execute(
        "SELECT run_id FROM ml.runs WHERE task = ? AND dataset IS NOT DISTINCT FROM ? AND status = 'completed' "
        "AND run_id IN (SELECT DISTINCT run_id FROM ml.predictions) ORDER BY run_id", [task.name, dataset]).fetchall()]
    stored_refs = {r for r, in con.execute(
        "SELECT DISTINCT c.reference_run_id FROM ml.comparisons c JOIN ml.runs r USING (run_id) "
        "WHERE r.task = ? AND r.dataset IS NOT DISTINCT FROM ?", [task.name, dataset]).fetchall()}
    if ref_id is None:
        targets = []
    elif run_ids is None or stored_refs - {ref_id}:
        targets = runs
    else:
        targets = [r for r in run_ids if r in runs]
    if ref_id in targets and run_ids is not None and not stored_refs:
        targets = runs  # the first reference of this (task, dataset): compare everything recorded so far
    rows: list[tuple] = []
    if ref_id is not None and targets:
        ref = load_run_data(con, ref_id)
        n_units, inverse = iv.unit_index(ref.units)
        counts = iv.resample_counts(n_units, n_boot, seed)
        ref_stats = remembered(ref.stats(inverse, n_units, only=task.scoring.compared))
        for run_id in targets:
            if run_id == ref_id:
                continue
            data = load_run_data(con, run_id)
            if data is None:
                continue
            try:
                rows += compare_pair(data, ref, task, run_id, ref_id, counts, inverse, ref_stats)
            except ValueError as exc:
                if run_ids is None or run_id in run_ids:
                    raise  # the run being recorded (or an explicit full recompute): refuse loudly
                # An older run scored on another split (samples rebuilt since) must not fail today's run; it
                # is left without a comparison, and said so.
                log.warning("uncertainty: %s left without a comparison: %s", run_id, exc)
    with transaction(con):
        if ref_id is None or targets == runs:  # a new reference: nothing of the old one may stay
            con.execute("DELETE FROM ml.comparisons WHERE run_id IN (SELECT run_id FROM ml.runs WHERE task = ? "
                        "AND dataset IS NOT DISTINCT FROM ?)", [task.name, dataset])
        else:
            con.execute("DELETE FROM ml.comparisons WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [targets])
        if rows:
            insert_rows(con, "ml.comparisons", rows)
    return len(rows)


def _num(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
