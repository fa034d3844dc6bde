"""What the trust figures (issue 36: subgroups, calibration, recalibration, operating points) cost a pipeline.

    python benchmarks/trust_cost.py --db /tmp/pipe/w.duckdb [--false-gaps 400] [--card]

Reads a warehouse a `medtx pipeline` run filled, recomputes `medtx.evaluation.trust.compute_trust` for every run
it applies to (binary and multi-label EHR runs) on a copy of the warehouse, and prints the seconds per run, their
sum, and that sum as a share of the pipeline's own wall time (ml.pipeline_runs: started_at -> finished_at). The
recompute reads the same tables the pipeline's evaluation step reads and does the same work, so the sum is the
extra evaluation time the pipeline spent. `--card`: instead, for every completed run, the whole per-run analysis
a recorded run gets (`medtx.evaluation.analysis.analyse_run`: intervals, comparisons, trust figures, written to the
copy) and, apart, what the model card adds when it is drawn (`plp_card.standard_figures`, the PLP figures, and
the whole `card.build_card`), each summed and as a share of the pipeline's wall. `--false-gaps N`: also simulate N cohorts with no group difference
(300 patients, sex and age band, AUROC + calibration-in-the-large) and print how often a gap is reported.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


@contextmanager
def _copy_of(db: Path) -> Iterator[tuple[Any, float | None]]:
    """A connection to a throwaway copy of the warehouse (the analysis writes), and the wall time of its longest
    completed pipeline run."""
    from medtx.store.db import connect

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "w.duckdb"
        shutil.copy(db, copy)
        con = connect(copy)
        try:
            (wall,) = con.execute("SELECT max(epoch(finished_at) - epoch(started_at)) FROM ml.pipeline_runs "
                                  "WHERE status = 'completed'").fetchall()[0]
            yield con, wall
        finally:
            con.close()


def evaluation_cost(db: Path) -> None:
    from medtx.evaluation.trust import applies, compute_trust
    from medtx.tasks import get_task

    with _copy_of(db) as (con, wall):
        runs = con.execute("SELECT run_id, task FROM ml.runs WHERE status = 'completed' ORDER BY run_id").fetchall()
        total, n = 0.0, 0
        for run_id, task in runs:
            try:
                spec = get_task(task)
            except ValueError:
                continue
            if not applies(spec):
                continue
            started = time.perf_counter()
            compute_trust(con, run_id)
            seconds = time.perf_counter() - started
            total, n = total + seconds, n + 1
            print(f"{seconds:6.2f} s  {run_id}")
    share = f", {100 * total / wall:.1f}% of the pipeline's {wall:.0f} s" if wall else ""
    print(f"trust figures: {n} runs, {total:.1f} s in all{share}")


def card_cost(db: Path) -> None:
    import os

    from medtx.evaluation.analysis import analyse_run
    from medtx.evaluation.card import build_card
    from medtx.evaluation.plp_card import standard_figures

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with _copy_of(db) as (con, wall):
        runs = [r for r, in con.execute("SELECT run_id FROM ml.runs WHERE status = 'completed' ORDER BY run_id")
                .fetchall()]
        totals = {"analyse_run": 0.0, "standard_figures": 0.0, "build_card": 0.0}
        for run_id in runs:
            row = []
            for name, step in (("analyse_run", analyse_run), ("standard_figures", standard_figures),
                               ("build_card", build_card)):
                started = time.perf_counter()
                step(con, run_id)
                seconds = time.perf_counter() - started
                totals[name] += seconds
                row.append(f"{seconds:6.2f}")
            print(" ".join(row), run_id)
    print(f"{len(runs)} completed runs; pipeline wall {wall:.0f} s")
    for name, total in totals.items():
        print(f"{name:17s} {total:7.1f} s  {100 * total / wall:5.1f}% of the wall")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def false_gap_rate(n_sims: int, n_patients: int = 300) -> None:
    from medtx.evaluation.groups import ATTRIBUTES, age_band
    from medtx.evaluation.subgroups import largest_gaps, subgroup_results
    from medtx.evaluation.uncertainty import RunData
    from medtx.metrics import intervals as iv

    reported = 0
    for seed in range(n_sims):
        rng = np.random.default_rng(50_000 + seed)
        female, age = rng.random(n_patients) < 0.5, rng.uniform(30, 95, n_patients)
        subj = np.repeat(np.arange(n_patients), rng.integers(1, 4, n_patients))
        z = -1.6 + rng.normal(0, 1.2, len(subj))
        y = rng.random(len(subj)) < 1 / (1 + np.exp(-z))
        p = 1 / (1 + np.exp(-(z + rng.normal(0, 0.3, len(subj)))))
        groups = {"sex": np.where(female[subj], "female", "male").astype(object),
                  "age_band": age_band(age[subj]).astype(object),
                  **{a: np.full(len(subj), "unknown", dtype=object) for a in ATTRIBUTES if a not in ("sex", "age_band")}}
        n_units, inverse = iv.unit_index(subj)
        data = RunData(np.arange(len(subj)).astype(str), subj, {"y": y, "p": p}, "binary")
        metrics = [("auroc", "none"), ("citl", "none")]
        _, boot = subgroup_results(data, None, groups, metrics, iv.resample_counts(n_units, seed=seed), inverse,
                                   attributes=("sex", "age_band"))
        reported += any(g.detected for g in largest_gaps(boot, metrics, attributes=("sex", "age_band")))
    print(f"false gaps: {reported} of {n_sims} null cohorts ({100 * reported / n_sims:.1f}%; nominal 5%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path)
    parser.add_argument("--false-gaps", type=int, default=0)
    parser.add_argument("--card", action="store_true", help="the whole per-run analysis and the card's figures")
    args = parser.parse_args()
    if args.db and args.card:
        card_cost(args.db)
    elif args.db:
        evaluation_cost(args.db)
    if args.false_gaps:
        false_gap_rate(args.false_gaps)


if __name__ == "__main__":
    main()
