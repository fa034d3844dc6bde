"""Subgroup results of one run: per group the headline metrics with 95% patient-bootstrap intervals and the paired
verdict against the reference baseline on the same patients, and per attribute the largest between-group gap with
a simultaneous interval. Pure numpy; the groups themselves are defined in medtx.evaluation.groups.

One resample count matrix serves the whole run (`counts`, shape (n_boot, n_test_patients), the same seed as the
run's overall intervals, medtx.evaluation.uncertainty): a group's statistic reads the columns of its own patients,
so every group, the run, the reference and every between-group difference are evaluated on the SAME resampled
patients — a patient whose stays fall in two groups (age band, insurance, admission type are per stay) is drawn
once for both.

A group below the floors of medtx.evaluation.floors (fewer than 30 test patients, fewer than 10 events or fewer
than 10 non-events): `too_small`, with the reason in `withheld` — its counts are kept, but no value, interval or
verdict (nothing that reads as a finding), and it enters no gap.

Multiplicity: a run gets one paired verdict per (group, metric) — about 36 of them. Each is a 95% interval, so a
model equal to the reference would collect ~5% false "better/worse" among them. `verdict` keeps the per-group
(unadjusted, exploratory) reading; `verdict_adjusted` is Holm's step-down over the run's whole family of group
verdicts (every attribute, group and compared metric; the `overall` row excluded), on a two-sided p-value from the
bootstrap's normal approximation (z = difference / bootstrap sd), at family level `HOLM_ALPHA` (2.5%, as the gaps:
the bootstrap under-covers slightly in groups of ~75 patients), so a run reports a false better/worse in at most
~5% of runs. Simulated (a model equal to its reference, 300 patients, sex and age band, AUROC + AUPRC, 200
resamples, 400 runs): any false better/worse in 174 runs unadjusted (43.5%), 22 with Holm at 5% (5.5%), 12 with
Holm at 2.5% (3.0%); tests/test_trust_guards.py runs 100 such simulations. The `overall` attribute (group `all`:
every test patient) gives each per-group metric its overall verdict on the same resamples.

The gap: for AUROC (binary; the per-visit headline for multi-label) and calibration-in-the-large
(`gap_metrics`), among groups that are not too small and not `unknown`, each attribute's largest difference
between two of its groups (high minus low, on the test split itself). Picking the largest of many differences
would make a plain 95% interval exclude 0 far more often than 5% when groups do not differ, so the interval is
simultaneous over every pair of groups of every attribute (bootstrap max-|t|: the percentile q of max over pairs
of |resampled difference - difference| / its bootstrap sd; interval = gap +/- q sd) and over the metrics
(Bonferroni), at level `GAP_ALPHA`. A gap is `detected` when that interval excludes 0; under no true difference
that happens in under 5% of runs (tests/test_trust.py simulates it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from medtx.evaluation.calibration import citl_stat
from medtx.evaluation.floors import group_withheld
from medtx.evaluation.groups import ATTRIBUTES, GROUP_ORDER, UNKNOWN
from medtx.evaluation.uncertainty import RunData
from medtx.metrics import intervals as iv

GAP_METHOD = "simultaneous_bootstrap_max_t_97.5"
# The gap interval's level: 97.5% simultaneous, not 95%. The percentile bootstrap under-covers slightly in groups
# of ~75 patients; simulated with no true difference (300 patients, 2 attributes, AUROC + calibration-in-the-large,
# 1,000 resamples), the 95% simultaneous interval reported a false gap in 27 of 400 runs (6.8%), above the nominal
# 5%; at 97.5%, 15 of 400 (3.8%) (tests/test_trust.py runs 120 such simulations).
GAP_ALPHA = iv.ALPHA / 2
CITL = ("citl", "none")  # calibration-in-the-large per group: no better/worse direction, so no paired verdict
HOLM_ALPHA = iv.ALPHA / 2  # the family level of the adjusted group verdicts (see the module docstring)
OVERALL = "overall"  # the attribute whose one group (`all`) is every test patient: the overall verdict per metric
OVERALL_GROUP = "all"


@dataclass(frozen=True)
class GroupResult:
    attribute: str
    group: str
    metric: str
    averaging: str
    n_patients: int
    n_samples: int
    n_positives: int
    too_small: bool
    value: float
    ci_low: float
    ci_high: float
    diff: float  # run minus reference in this group (NaN without a reference)
    diff_low: float
    diff_high: float
    verdict: str | None  # None: no reference to compare with (the run is the reference, or there is none)
    withheld: str | None = None  # why the figures are withheld (medtx.evaluation.floors); None: shown
    p_value: float = float("nan")  # two-sided, from the paired bootstrap's normal approximation
    verdict_adjusted: str | None = None  # Holm over the run's group verdicts (`holm_adjust`)


@dataclass(frozen=True)
class Gap:
    attribute: str
    metric: str
    averaging: str
    group_high: str
    group_low: str
    gap: float
    ci_low: float
    ci_high: float
    detected: bool
    n_groups: int
    largest: bool = False  # the run's largest gap for this metric


def group_units(inverse: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sample positions, the run-level unit index of each group patient, each sample's index among them)."""
    idx = np.flatnonzero(members)
    units, local = np.unique(inverse[idx], return_inverse=True)
    return idx, units, local.reshape(-1)


def _cached(stat: iv.Stat, counts: np.ndarray, values: np.ndarray) -> iv.Stat:
    """`stat`, answering from `values` when asked about these very `counts` again."""
    return lambda c: values if c is counts else stat(c)


def _stats(data: RunData, local: np.ndarray, n_units: int, metrics: list[tuple[str, str]]) -> dict:
    stats = data.stats(local, n_units, only=metrics)
    if CITL in metrics:
        stats[CITL] = citl_stat(data.arrays["y"], data.arrays["p"], local, n_units)
    return stats


def subgroup_results(data: RunData, ref: RunData | None, groups: dict[str, np.ndarray],
                     metrics: list[tuple[str, str]], counts: np.ndarray, inverse: np.ndarray,
                     min_units: int = iv.MIN_UNITS, attributes: tuple[str, ...] = ATTRIBUTES
                     ) -> tuple[list[GroupResult], dict]:
    """Per (attribute, group, metric) rows, and {(attribute, group, metric, averaging): (point, resampled values)}
    of the groups that are not too small (the gaps read these). `ref` must be aligned to `data`'s samples.
    `("citl", "none")` among `metrics` adds calibration-in-the-large per group (no verdict)."""
    results: list[GroupResult] = []
    boot: dict = {}
    y = np.asarray(data.arrays["y"], dtype=np.float64)
    events = y.reshape(len(y), -1).sum(axis=1)  # per sample: 0/1 (binary) or its positive labels (multi-label)
    cells = int(np.prod(y.shape[1:], dtype=np.int64))  # outcome cells per sample
    for attribute in attributes:
        present, codes = np.unique(np.asarray(groups[attribute]).astype(str), return_inverse=True)
        codes = codes.reshape(-1)
        code = {g: i for i, g in enumerate(present.tolist())}
        order = [g for g in GROUP_ORDER.get(attribute, ()) if g in code] + sorted(
            set(code) - set(GROUP_ORDER.get(attribute, ())))
        for group in order:
            idx, units, local = group_units(inverse, codes == code[group])
            n_units = len(units)
            n_pos = int(events[idx].sum())
            withheld = group_withheld(n_units, n_pos, len(idx) * cells - n_pos, min_units)
            small = withheld is not None
            sub = data.reorder(idx)
            sub_ref = ref.reorder(idx) if ref is not None else None
            stats = {} if small else _stats(sub, local, n_units, metrics)
            ref_stats = {} if small or sub_ref is None else sub_ref.stats(local, n_units, only=metrics)
            g_counts = counts[:, units]
            for metric, averaging in metrics:
                nan = float("nan")
                value = lo = hi = d = dlo = dhi = p_value = nan
                verdict = "too_small" if small and ref is not None and (metric, averaging) != CITL else None
                stat = stats.get((metric, averaging))
                if stat is not None:
                    resampled = stat(g_counts)
                    value = iv.point(stat, n_units)
                    lo, hi = iv.percentile_interval(resampled)
                    if iv.outside(value, lo, hi):
                        lo = hi = nan
                    boot[(attribute, group, metric, averaging)] = (value, resampled)
                    ref_stat = ref_stats.get((metric, averaging))
                    if ref_stat is not None:  # the run's resampled values are reused, not recomputed
                        c = iv.paired_comparison(_cached(stat, g_counts, resampled), ref_stat, g_counts,
                                                 min_units=min_units)
                        d, dlo, dhi, verdict = c.diff, c.ci_low, c.ci_high, c.verdict
                        p_value = bootstrap_p(c.diff, c.diffs)
                results.append(GroupResult(attribute, group, metric, averaging, n_units, len(idx), n_pos, small,
                                           value, lo, hi, d, dlo, dhi, verdict, withheld, p_value))
    return holm_adjust(results), boot


def bootstrap_p(diff: float, diffs: np.ndarray) -> float:
    """Two-sided p-value of "no difference" from the resampled differences' sd (normal approximation); NaN when
    it cannot be formed. A smooth p-value, not the share of resamples beyond 0: with a few hundred resamples the
    latter cannot go below 1/n_boot, which Holm over 30 verdicts would need."""
    from scipy.stats import norm

    finite = diffs[np.isfinite(diffs)]
    if finite.size < 2 or not np.isfinite(diff):
        return float("nan")
    sd = float(finite.std())
    if sd == 0:
        return 1.0 if diff == 0 else 0.0
    return float(2 * norm.sf(abs(diff) / sd))


def holm_adjust(results: list[GroupResult], alpha: float = HOLM_ALPHA) -> list[GroupResult]:
    """Each row with `verdict_adjusted`: Holm's step-down over the family of group verdicts (rows with a
    better/worse/no-difference verdict, the `overall` rows excluded). A row is adjusted better/worse only when
    Holm rejects it AND its own interval says the same; otherwise no_detectable_difference. Rows without a verdict
    keep theirs (None or too_small); the overall rows keep their own verdict."""
    family = [i for i, r in enumerate(results) if r.attribute != OVERALL and np.isfinite(r.p_value)
              and r.verdict in ("better", "worse", "no_detectable_difference")]
    rejected: set[int] = set()
    for step, i in enumerate(sorted(family, key=lambda i: results[i].p_value)):
        if results[i].p_value > alpha / (len(family) - step):
            break
        rejected.add(i)
    out = []
    for i, r in enumerate(results):
        if r.attribute == OVERALL or i not in family:
            adjusted = r.verdict
        else:
            adjusted = r.verdict if i in rejected and r.verdict in ("better", "worse") else "no_detectable_difference"
        out.append(replace(r, verdict_adjusted=adjusted))
    return out


def gap_metrics(metrics: list[tuple[str, str]], kind: str) -> list[tuple[str, str]]:
    """The metrics a between-group gap is taken on: discrimination that does not depend on a group's prevalence
    (binary: AUROC; multi-label: the per-visit headline) and calibration-in-the-large. AUPRC and RP80 rise with
    prevalence, so a gap in them mixes "the model ranks worse" with "this group has more events"; they are
    reported per group, with verdicts, but not gapped (their percentile bootstrap is also biased upward in small
    groups: simulated, the false-gap rate rose to 9% on AUPRC)."""
    headline = [("auroc", "none")] if kind == "binary" else [m for m in metrics if m != CITL][:1]
    return [m for m in (*headline, CITL) if m in metrics]


def largest_gaps(boot: dict, metrics: list[tuple[str, str]], alpha: float = GAP_ALPHA,
                 attributes: tuple[str, ...] = ATTRIBUTES) -> list[Gap]:
    """Per (attribute, metric): the largest difference between two eligible groups, with an interval that is
    simultaneous over every pair of groups of every attribute (bootstrap max-|t| per metric) and over the metrics
    given (Bonferroni: alpha / number of metrics), so a run reports a false gap in at most ~alpha of runs; the
    run's largest per metric is flagged."""
    pairs = []  # (metric, averaging, attribute, high, low, point diff, resampled diffs, sd)
    for metric, averaging in metrics:
        for attribute in attributes:
            eligible = [(g, v, r) for (a, g, m, av), (v, r) in boot.items()
                        if a == attribute and m == metric and av == averaging and g != UNKNOWN and np.isfinite(v)]
            for (g1, v1, r1), (g2, v2, r2) in combinations(eligible, 2):
                (hi_g, hi_v, hi_r), (lo_g, lo_v, lo_r) = ((g1, v1, r1), (g2, v2, r2)) if v1 >= v2 else \
                    ((g2, v2, r2), (g1, v1, r1))
                diffs = hi_r - lo_r
                finite = diffs[np.isfinite(diffs)]
                sd = float(finite.std()) if finite.size > 1 else float("nan")
                if np.isfinite(sd) and sd > 0:
                    pairs.append((metric, averaging, attribute, hi_g, lo_g, hi_v - lo_v, diffs, sd))
    gaps: list[Gap] = []
    for metric, averaging in metrics:
        # max over this metric's pairs of the studentised deviation, per resample (NaN resamples skipped); its
        # 1 - alpha/len(metrics) percentile (Bonferroni across metrics) is the simultaneous critical value
        dev = [np.abs(p[6] - p[5]) / p[7] for p in pairs if p[0] == metric and p[1] == averaging]
        if not dev:
            continue
        t_max = np.max(np.where(np.isfinite(np.stack(dev)), np.stack(dev), -np.inf), axis=0)
        t_max = t_max[np.isfinite(t_max)]
        q = float(np.percentile(t_max, 100 * (1 - alpha / len(metrics)))) if t_max.size else float("nan")
        metric_gaps = []
        for attribute in attributes:
            mine = [p for p in pairs if p[0] == metric and p[1] == averaging and p[2] == attribute]
            if not mine:
                continue
            *_, hi_g, lo_g, gap, _, sd = max(mine, key=lambda p: p[5])
            n_groups = len({p[3] for p in mine} | {p[4] for p in mine})
            lo, hi = gap - q * sd, gap + q * sd
            metric_gaps.append(Gap(attribute, metric, averaging, hi_g, lo_g, float(gap), float(lo), float(hi),
                                   bool(lo > 0), n_groups))
        if metric_gaps:
            best = max(metric_gaps, key=lambda g: g.gap)
            gaps += [replace(g, largest=g is best) for g in metric_gaps]
    return gaps
