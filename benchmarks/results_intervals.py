"""RESULTS.md lines from the issue-14 tables: per-run 95% patient-bootstrap intervals (ml.metrics ci_low/ci_high)
and paired verdicts against the reference baseline (ml.comparisons), for `benchmarks/results.py`.

    .venv/bin/python benchmarks/results.py --render-only --intervals     # recompute both tables, then render

A claim that a model beats the reference is only made when every seed's paired verdict is `better` and there
are at least 3 seeds (MISSION §4); otherwise the line says what is missing.
"""

from __future__ import annotations

import logging
from pathlib import Path

from medtx.evaluation.comparisons import compare_runs
from medtx.evaluation.uncertainty import record_intervals
from medtx.store.db import open_warehouse
from medtx.tasks import get_task

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
            n = compare_runs(con, get_task(task), dataset)
            log.info("%s/%s: %d comparison rows", task, dataset, n)


def comparison_lines(db: Path, dataset: str, task: str) -> list[str]:
    """One line per (model, compared metric): each seed's paired difference vs the reference with its 95%
    interval and verdict, and the claim the seeds support."""
    if not get_task(task).scoring.compared:
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
        per_seed = "; ".join(seed_difference(s, d, lo, hi, v) for s, d, lo, hi, v in seeds)
        claim = seed_claim(model, reference, [v for *_, v in seeds])
        lines.append(f"- {model} − {reference}, {metric} ({averaging}): {per_seed} → {claim}.")
    return lines


def seed_difference(seed: int | None, diff: float | None, low: float | None, high: float | None, verdict: str) -> str:
    """One seed's paired difference from the reference: `s0 +0.0053 [+0.0025, +0.0081] better`."""
    return f"s{seed} {difference(diff, low, high, verdict)}"


def difference(diff: float | None, low: float | None, high: float | None, verdict: str) -> str:
    """A paired difference with its 95% interval and verdict: `+0.0053 [+0.0025, +0.0081] better`."""
    if diff is not None and low is not None and high is not None:
        return f"{diff:+.4f} [{low:+.4f}, {high:+.4f}] {verdict}"
    return verdict


def seed_claim(model: str, reference: str, verdicts: list[str], units: str = "test patients") -> str:
    """The claim the seeds' paired verdicts support: 'beats' only when every one of >= MIN_SEEDS seeds is
    `better`; seeds that disagree support no claim."""
    distinct = set(verdicts)
    if not distinct:
        return "no comparison recorded: no claim"
    if len(distinct) > 1:
        return "seeds disagree: no claim"
    verdict = distinct.pop()
    if len(verdicts) < MIN_SEEDS:
        return f"{verdict} on {len(verdicts)} seed(s): not yet a claim (needs {MIN_SEEDS} agreeing seeds)"
    return {"better": f"**{model} beats {reference}**", "worse": f"{model} is worse than {reference}",
            "no_detectable_difference": "no detectable difference",
            "too_small": f"too few {units} for a verdict"}[verdict]
