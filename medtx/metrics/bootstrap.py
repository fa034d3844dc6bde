"""The SafeDrug convention: sd over resamples of 80% of the test PATIENTS (`ml.metrics.sd`, `sd_method`).

A named second convention, kept for comparing with papers; it is about half as wide as the 95% interval
(`medtx/metrics/intervals.py`, bootstrap with replacement over test patients), which is what medtx reports.

Each resample draws `frac` of the distinct test patients WITHOUT replacement (a subsample, as "80% of test
patients" reads) and keeps all their samples, so visits of one patient never count as independent. The sd is
the standard deviation of the `n_boot` replicate values (numpy's default, ddof=0, like the text stage's
`bootstrap_classification`). Resampling is deterministic given `seed`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

N_BOOT = 10
FRACTION = 0.8


def patient_resamples(patients: np.ndarray, n_boot: int = N_BOOT, frac: float = FRACTION,
                      seed: int = 0) -> list[np.ndarray]:
    """`n_boot` index arrays into `patients`, each holding every sample of a random `frac` of the patients."""
    patients = np.asarray(patients)
    if patients.size == 0:
        raise ValueError("bootstrap: the test split is empty")
    unique, inverse = np.unique(patients, return_inverse=True)
    size = max(1, int(round(frac * len(unique))))
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        chosen = np.zeros(len(unique), dtype=bool)
        chosen[rng.choice(len(unique), size=size, replace=False)] = True
        draws.append(np.flatnonzero(chosen[inverse]))
    return draws


def bootstrap(
    stat: Callable[[np.ndarray], dict[str, float]], patients: np.ndarray, n_boot: int = N_BOOT,
    frac: float = FRACTION, seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """{metric: (mean, sd)} of `stat(sample_indices)` over patient resamples; NaN replicates are skipped."""
    replicates = [stat(idx) for idx in patient_resamples(patients, n_boot, frac, seed)]
    out = {}
    for name in replicates[0]:
        values = np.array([r[name] for r in replicates], dtype=np.float64)
        values = values[np.isfinite(values)]
        out[name] = (float(values.mean()), float(values.std())) if values.size else (float("nan"), float("nan"))
    return out
