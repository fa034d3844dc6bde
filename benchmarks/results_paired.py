"""The paired check of the EHR results benchmark: per seed, the per-visit margin of one drug_rec model over a
rival on the same test visits, and how often it holds up under a paired patient bootstrap."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.results_config import run_id_for
from medtx.store.db import open_warehouse  # waits out a parallel run's lock


PAIRED = [("transformer", "logreg"), ("transformer", "copy_last"), ("transformer_rope", "logreg"),
          ("transformer_rope", "copy_last")]  # drug_rec margins small enough to need a paired check
PAIRED_METRICS = ("pr_auc_samples", "jaccard_samples")
PAIRED_BOOT = 1000


def per_visit_scores(db: Path, run_id: str) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
    """(test visit ids [hadm_id, subject_id], {metric: per-visit value}) from a run's stored test predictions
    (ml.predictions): PR-AUC from the probabilities, Jaccard from the predicted sets at the run's own
    threshold. None when the run stored only part of its (visit, label) rows (large cohorts)."""
    import polars as pl

    from medtx.metrics.multilabel import average_precision_rows, set_metric_rows

    with open_warehouse(db, read_only=True) as con:
        frame = con.sql("SELECT hadm_id, subject_id, label, prob, y_true, predicted FROM ml.predictions "
                        "WHERE run_id = ?", params=[run_id]).pl()
    wide = {col: frame.pivot("label", index=["hadm_id", "subject_id"], values=col).sort("hadm_id")
            for col in ("prob", "y_true", "predicted")}
    labels = sorted(set(wide["prob"].columns) - {"hadm_id", "subject_id"})
    if frame.height != wide["prob"].height * len(labels):
        return None  # sparse storage (ehr_evaluation.MAX_PREDICTION_ROWS): per-visit PR-AUC is not recoverable
    prob = wide["prob"].select(labels).to_numpy().astype(float)
    y, pred = (wide[c].select(labels).to_numpy().astype(bool) for c in ("y_true", "predicted"))
    ids = wide["prob"].select(pl.col("hadm_id").cast(pl.Int64), pl.col("subject_id").cast(pl.Int64)).to_numpy()
    return ids, {"pr_auc_samples": average_precision_rows(y, prob),
                 "jaccard_samples": set_metric_rows(y, pred)["jaccard_samples"]}


def paired_ahead_share(diff: np.ndarray, patients: np.ndarray, n_boot: int = PAIRED_BOOT, seed: int = 0) -> float:
    """Share of patient-bootstrap resamples (WITH replacement: the usual test of a difference; the table's 80%
    subsamples without replacement would understate the noise) whose mean per-visit `diff` is > 0. Both models
    are scored on the same resampled visits, so what both find hard cancels out of the margin."""
    unique, inverse = np.unique(patients, return_inverse=True)
    sums, visits = np.bincount(inverse, weights=diff), np.bincount(inverse).astype(float)
    rng = np.random.default_rng(seed)
    picks = np.stack([np.bincount(rng.integers(0, len(unique), len(unique)), minlength=len(unique))
                      for _ in range(n_boot)])  # [n_boot, patients]: how often each patient was drawn
    return float(np.mean((picks @ sums) / (picks @ visits) > 0))


def paired_lines(db: Path, dataset: str) -> list[str]:
    """Plain lines for the drug_rec verdicts: per seed, the paired margin and how often it holds up."""
    with open_warehouse(db, read_only=True) as con:
        done = {r[0] for r in con.execute("SELECT run_id FROM ml.runs WHERE status = 'completed' AND dataset = ? "
                                          "AND run_id LIKE 'results.drug_rec.%'", [dataset]).fetchall()}
    cache: dict[str, tuple[np.ndarray, dict[str, np.ndarray]] | None] = {}

    def scores(run_id: str) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
        if run_id not in cache:
            cache[run_id] = per_visit_scores(db, run_id)
        return cache[run_id]

    lines = []
    for metric in PAIRED_METRICS:
        for model, rival in PAIRED:
            per_seed = []
            for seed in range(10):
                a, b = run_id_for("drug_rec", model, dataset, seed), run_id_for("drug_rec", rival, dataset, seed)
                if a not in done or b not in done or scores(a) is None or scores(b) is None:
                    continue
                (ids, mine), (ids_b, theirs) = scores(a), scores(b)
                if not np.array_equal(ids, ids_b):
                    raise ValueError(f"{a} and {b} were not scored on the same test visits")
                diff = mine[metric] - theirs[metric]
                per_seed.append(f"s{seed} {diff.mean():+.4f} ({paired_ahead_share(diff, ids[:, 1], seed=seed):.0%})")
            if per_seed:
                lines.append(f"- Paired check, {model} − {rival} on {metric} (visit), per seed: margin on the whole "
                             f"test split (share of {PAIRED_BOOT} paired patient-bootstrap resamples, with "
                             f"replacement, in which {model} is ahead): {'; '.join(per_seed)}.")
    return lines
