"""RESULTS.md lines from the issue-14 tables: per-run 95% patient-bootstrap intervals (ml.metrics ci_low/ci_high)
and paired verdicts against the reference baseline (ml.comparisons), for `benchmarks/results.py`.

    .venv/bin/python benchmarks/results.py --render-only --intervals     # recompute both tables, then render

A claim that a model beats the reference is only made when every seed's paired verdict is `better` and there
are at least 3 seeds (MISSION §4); otherwise the line says what is missing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from medtx.comparisons import compare_runs
from medtx.uncertainty import COMPARED, record_intervals
from medtx.training.skeleton import open_warehouse

log = logging.getLogger("medtx.benchmarks")
MIN_SEEDS = 3


def recompute(db: Path, dataset: str, tasks: list[str]) -> None:
    """Intervals for every completed run of the dataset (runs recorded before issue 14 have none), then the
    comparisons of each task against its reference chosen on validation."""
    with open_warehouse(db) as con:
        runs = con.execute("SELECT run_id FROM ml.runs WHERE status = 'completed' AND dataset = ? "
                           "AND task IN (SELECT unnest(?::VARCHAR[])) ORDER BY run_id", [dataset, tasks]).fetchall()
        for (run_id,) in runs:
            record_intervals(con, run_id)
        for task in tasks:
            n = compare_runs(con, task, dataset)
            log.info("%s/%s: %d comparison rows", task, dataset, n)


def comparison_lines(db: Path, dataset: str, task: str) -> list[str]:
    """One line per (model, compared metric): each seed's paired difference vs the reference with its 95%
    interval and verdict, and the claim the seeds support."""
    if task not in COMPARED:
        return []
    with open_warehouse(db, read_only=True) as con:
        rows = con.execute(
            "SELECT r.model, r.seed, c.metric, c.averaging, c.diff, c.ci_low, c.ci_high, c.verdict, c.n_units, "
            "ref.model FROM ml.comparisons c JOIN ml.runs r ON r.run_id = c.run_id "
            "JOIN ml.runs ref ON ref.run_id = c.reference_run_id "
            "WHERE r.task = ? AND r.dataset = ? AND r.status = 'completed' ORDER BY r.model, c.metric, r.seed",
            [task, dataset]).fetchall()
    if not rows:
        return [f"- No paired comparisons stored for {task} (run with `--intervals`)."]
    reference = rows[0][9]
    lines = ["", f"Paired verdicts ({task}; reference baseline = best non-neural baseline on validation: "
                 f"{reference}; paired patient bootstrap, 1,000 resamples with replacement, 95% percentile "
                 f"interval of run − reference on {rows[0][8]:,} test patients):"]
    grouped: dict[tuple, list] = {}
    for model, seed, metric, averaging, diff, lo, hi, verdict, _, _ in rows:
        if model == reference:  # the reference model's other seeds against its chosen run: not a claim
            continue
        grouped.setdefault((model, metric, averaging), []).append((seed, diff, lo, hi, verdict))
    for (model, metric, averaging), seeds in grouped.items():
        per_seed = "; ".join(
            f"s{s} {d:+.4f} [{lo:+.4f}, {hi:+.4f}] {v}" if d is not None and lo is not None else f"s{s} {v}"
            for s, d, lo, hi, v in seeds)
        verdicts = {v for *_, v in seeds}
        if len(verdicts) > 1:
            claim = "seeds disagree: no claim"
        elif len(seeds) < MIN_SEEDS:
            claim = f"{verdicts.pop()} on {len(seeds)} seed(s): not yet a claim (needs {MIN_SEEDS} agreeing seeds)"
        else:
            claim = {"better": f"**{model} beats {reference}**", "worse": f"{model} is worse than {reference}",
                     "no_detectable_difference": "no detectable difference",
                     "too_small": "too few test patients for a verdict"}[verdicts.pop()]
        lines.append(f"- {model} − {reference}, {metric} ({averaging}): {per_seed} → {claim}.")
    return lines
