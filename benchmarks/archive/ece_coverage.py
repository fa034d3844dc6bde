"""How often the 95% patient-bootstrap percentile interval of the 15-bin ECE covers the true ECE (why medtx stores
the ECE without an interval: `medtx.metrics.intervals.BIASED`).

Simulated test splits of N patients x 2 visits, probabilities uniform on [0, 1], outcomes drawn from f(p): f(p) = p
(calibrated, true ECE 0), p^1.2 (mild), p^2 (strong). The true binned ECE comes from 4M draws. For each split, the
interval is what `medtx.evaluation.uncertainty.record_intervals` would compute. Prints coverage and how often the estimate lies
outside its own interval.

    .venv/bin/python benchmarks/archive/ece_coverage.py [--patients 500] [--splits 100] [--resamples 500]
"""

from __future__ import annotations

import argparse

import numpy as np

from medtx.metrics import intervals as iv

SHAPES = {"calibrated, f(p) = p": lambda p: p, "mild, f(p) = p^1.2": lambda p: p ** 1.2,
          "strong, f(p) = p^2": lambda p: p ** 2}


def true_ece(f, n: int = 4_000_000, seed: int = 99) -> float:
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    q = f(p)
    bins = np.minimum((p * iv.ECE_BINS).astype(int), iv.ECE_BINS - 1)
    return float(np.abs(np.bincount(bins, p, iv.ECE_BINS) - np.bincount(bins, q, iv.ECE_BINS)).sum() / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--patients", type=int, default=500)
    ap.add_argument("--splits", type=int, default=100)
    ap.add_argument("--resamples", type=int, default=500)
    args = ap.parse_args()
    print(f"{args.splits} splits of {args.patients} patients x 2 visits, {args.resamples} resamples each")
    for name, f in SHAPES.items():
        truth, covered, outside = true_ece(f), 0, 0
        for seed in range(args.splits):
            rng = np.random.default_rng(seed)
            subjects = np.repeat(np.arange(args.patients), 2)
            p = rng.random(len(subjects))
            y = rng.random(len(subjects)) < f(p)
            n_units, inverse = iv.unit_index(subjects)
            value, lo, hi = iv.interval(iv.ece_stat(y, p, inverse, n_units),
                                        iv.resample_counts(n_units, args.resamples, seed))
            covered += lo <= truth <= hi
            outside += iv.outside(value, lo, hi)
        print(f"{name:<22} true ECE {truth:.4f}: the interval covers it in {covered} of {args.splits} splits; "
              f"the estimate lies outside its own interval in {outside}")


if __name__ == "__main__":
    main()
