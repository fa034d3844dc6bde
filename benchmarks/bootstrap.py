"""Time to compute every test interval and the paired comparisons of a drug_rec run at full MIMIC-III scale.

    .venv/bin/python benchmarks/bootstrap.py                         # 15,000 visits, 150 labels, 1,000 resamples
    .venv/bin/python benchmarks/bootstrap.py --visits 30000 --labels 150 --n-boot 2000

Input: a deterministic in-memory drug_rec test split (15,000 visits of ~5,000 patients with 1-5 visits, 150
ATC-3 labels, ~14 true drugs per visit, a random DDI matrix) and two runs' probabilities (the run and the
reference baseline). Timed, end to end, what `medtx.evaluation.uncertainty.record_intervals` and
`medtx.evaluation.comparisons.compare_pair` do after loading ml.predictions: per-visit metrics, the resample count
matrix, the 95% interval of every metric (visit- and patient-averaged PR-AUC, ROC-AUC, Jaccard, F1, precision,
recall, Brier; ECE; DDI rates; set sizes) for BOTH runs, and the paired comparisons on the headline and set
metric. The warehouse read is not included (it is one SELECT of the run's predictions). Prints the figure with
the load average, since the 2 cores are shared.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from medtx.evaluation.comparisons import compare_pair  # noqa: E402
from medtx.metrics import intervals as iv  # noqa: E402
from medtx.evaluation.uncertainty import RunData  # noqa: E402
from medtx.tasks import get_task  # noqa: E402


def make_split(n_visits: int, n_labels: int, seed: int = 0) -> tuple[RunData, RunData]:
    rng = np.random.default_rng(seed)
    visits_per_patient = rng.integers(1, 6, n_visits)  # enough patients; truncated to n_visits below
    units = np.repeat(np.arange(len(visits_per_patient)), visits_per_patient)[:n_visits]
    freq = rng.beta(0.6, 5, n_labels)
    y = rng.random((n_visits, n_labels)) < freq
    ddi = np.triu(rng.random((n_labels, n_labels)) < 0.05, 1)
    ddi = ddi | ddi.T
    runs = []
    for signal in (1.2, 1.0):  # the run, then the reference
        logits = signal * (2 * y - 1) + rng.normal(0, 1.2, y.shape) + np.log(freq / (1 - freq))
        p = 1 / (1 + np.exp(-logits))
        runs.append(RunData(np.arange(n_visits).astype(str), units, {"y": y.astype(np.float64), "p": p,
                                                                       "pred": p >= 0.4},
                            "multilabel", extra={"ks": (), "ddi": ddi}))
    return runs[0], runs[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visits", type=int, default=15_000)
    parser.add_argument("--labels", type=int, default=150)
    parser.add_argument("--n-boot", type=int, default=iv.N_BOOT)
    args = parser.parse_args()
    run, ref = make_split(args.visits, args.labels)
    started, cpu_started = time.perf_counter(), time.process_time()
    n_units, inverse = iv.unit_index(ref.units)
    counts = iv.resample_counts(n_units, args.n_boot)
    n_intervals = 0
    for data in (run, ref):
        for stat in data.stats(inverse, n_units).values():
            iv.interval(stat, counts)
            n_intervals += 1
    comparisons = compare_pair(run, ref, get_task("drug_rec"), "run", "ref", counts, inverse)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"drug_rec test split: {args.visits:,} visits, {n_units:,} patients, {args.labels} labels; "
          f"{args.n_boot:,} resamples with replacement")
    print(f"{n_intervals} intervals (2 runs) + {len(comparisons)} paired comparisons: {seconds:.2f} s wall, "
          f"{cpu:.2f} s CPU (this process, all threads) on {os.cpu_count()} cores, load average {load}")
    for row in comparisons:
        print(f"  {row[2]}|{row[3]}: diff {row[4]:+.4f} [{row[5]:+.4f}, {row[6]:+.4f}] p_better {row[7]:.3f} "
              f"-> {row[8]}")


if __name__ == "__main__":
    main()
