"""The conclusions at the top of the model card, each generated from the card's own figures with its reason
(`Finding(finding, because)`), and the run's intended use derived from its task's declaration. Pure functions of
plain values; medtx.evaluation.card gathers the figures from the warehouse.

The rules (stated here once, shown in the card's words):
- discrimination: "does not discriminate" when the AUROC's 95% interval contains 0.5 (or the model is collapsed);
  otherwise its strength in the usual words (0.5-0.7 poor, 0.7-0.8 acceptable, 0.8-0.9 good, >= 0.9 excellent;
  Hosmer & Lemeshow, Applied Logistic Regression);
- calibration in words: in the large (observed minus expected rate: its interval containing 0 = calibrated in
  the large; > 0 the model under-predicts, < 0 it over-predicts) and the slope (interval containing 1 =
  compatible with 1; below 1 predictions too extreme; above 1 too timid; an interval containing 0 = the
  probabilities carry almost no information about the outcome);
- net benefit over `NB_RANGE` (threshold probabilities 0.05-0.30: acting on a risk between 1 in 20 and 3 in 10,
  where an alert of an admission-level outcome is plausibly acted on): where the model's interval lies above both
  treat-all and treat-none;
- PPV against prevalence: an operating point whose test PPV does not exceed the test prevalence alerts no better
  than picking admissions at random;
- the recommendation: "should not be used on these data" when it does not discriminate, is collapsed, or adds no
  net benefit anywhere in the range; otherwise "not for clinical use on this evidence alone" with what is missing
  (recalibration, external validation). Synthetic data and too few test patients are said first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NB_RANGE = (0.05, 0.30)


@dataclass(frozen=True)
class Finding:
    finding: str
    because: str


@dataclass
class Figures:
    """What the conclusions read (None: not available for this run)."""

    auroc: tuple[float, float | None, float | None] | None = None  # value, low, high (test)
    auroc_name: str = "AUROC"
    collapsed: str | None = None  # the collapse reason
    citl: tuple[float, float | None, float | None] | None = None
    slope: tuple[float, float | None, float | None] | None = None
    recalibration: list[tuple[str, str, str]] = field(default_factory=list)  # (method, status, reason)
    # (threshold, net benefit, low, high, treat_all) of the decision curve
    decision: list[tuple[float, float | None, float | None, float | None, float]] = field(default_factory=list)
    prevalence: float | None = None
    # (target, status, reason, test ppv, low, high)
    operating: list[tuple[str, str, str, float | None, float | None, float | None]] = field(default_factory=list)
    synthetic: bool = False
    n_test_units: int = 0
    test_unit: str = "patients"  # what the bootstrap resamples (ml.runs.test_unit): patients, text groups, pairs
    min_units: int = 30
    group_verdicts: tuple[int, int, int] = (0, 0, 0)  # family size, unadjusted better/worse, adjusted better/worse


def _ci(v: tuple[float, float | None, float | None]) -> str:
    value, lo, hi = v
    return f"{value:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else f"{value:.3f} (no interval)"


def _contains(v: tuple[float, float | None, float | None], x: float) -> bool | None:
    _, lo, hi = v
    return None if lo is None or hi is None else lo <= x <= hi


def discrimination(f: Figures) -> Finding:
    if f.collapsed:
        return Finding("Does not discriminate", f"the model is collapsed: {f.collapsed}")
    if f.auroc is None or f.auroc[0] is None:
        return Finding("Discrimination not established", f"no test {f.auroc_name} for this run")
    value = f.auroc[0]
    inside = _contains(f.auroc, 0.5)
    if inside is None:
        return Finding("Discrimination not established",
                       f"{f.auroc_name} {_ci(f.auroc)}: no 95% interval, so no claim beyond chance can be made")
    if inside:
        return Finding("Does not discriminate",
                       f"{f.auroc_name} {_ci(f.auroc)}: its 95% interval contains 0.5 (chance)")
    if f.auroc[2] < 0.5:
        return Finding("Ranks backwards", f"{f.auroc_name} {_ci(f.auroc)}: its 95% interval lies below 0.5")
    word = "poor" if value < 0.7 else "acceptable" if value < 0.8 else "good" if value < 0.9 else "excellent"
    return Finding(f"Discriminates ({word})", f"{f.auroc_name} {_ci(f.auroc)}: its 95% interval excludes 0.5")


def calibration(f: Figures) -> Finding | None:
    if f.citl is None and f.slope is None:
        return None
    words, because = [], []
    if f.citl is not None:
        inside = _contains(f.citl, 0.0)
        if inside is None:
            words.append("calibration in the large not established")
        elif inside:
            words.append("calibrated in the large")
        else:
            words.append("over-predicts risk" if f.citl[0] < 0 else "under-predicts risk")
        because.append(f"observed minus expected rate {_ci(f.citl)}")
    if f.slope is not None:
        inside_one, inside_zero = _contains(f.slope, 1.0), _contains(f.slope, 0.0)
        if inside_zero:
            words.append("its probabilities carry almost no information about the outcome")
        elif inside_one:
            words.append("slope compatible with 1")
        elif inside_one is None:
            words.append("slope without an interval")
        else:
            words.append("predictions too extreme" if f.slope[0] < 1 else "predictions too timid")
        because.append(f"calibration slope {_ci(f.slope)}")
    return Finding("Calibration: " + "; ".join(words), "; ".join(because))


def recalibration(f: Figures) -> Finding | None:
    if not f.recalibration:
        return None
    best = [m for m, status, _ in f.recalibration if status == "recommended"]
    reasons = "; ".join(f"{m}: {reason}" for m, _, reason in f.recalibration)
    if best:
        return Finding(f"Recalibration with {best[0]} recommended", reasons)
    return Finding("Keep the original probabilities", reasons)


def net_benefit(f: Figures) -> Finding | None:
    lo_t, hi_t = NB_RANGE
    rows = [r for r in f.decision if lo_t - 1e-9 <= r[0] <= hi_t + 1e-9 and r[1] is not None]
    if not rows:
        return None
    span = f"threshold probabilities {lo_t:.2f}-{hi_t:.2f}"
    above = [t for t, nb, lo, hi, ta in rows if lo is not None and lo > max(ta, 0.0)]
    point_above = [t for t, nb, lo, hi, ta in rows if nb > max(ta, 0.0)]
    worst = min(rows, key=lambda r: r[1] - max(r[4], 0.0))
    if above:
        return Finding(f"Adds net benefit at {len(above)} of {len(rows)} thresholds in {lo_t:.2f}-{hi_t:.2f}",
                       f"at {', '.join(f'{t:.2f}' for t in above[:6])}{' ...' if len(above) > 6 else ''} the model's "
                       "95% interval lies above both treat-all and treat-none")
    return Finding(f"No net benefit over treating everyone or no one at {span}",
                   f"the model's interval is never above both strategies (its point estimate is above them at "
                   f"{len(point_above)} of {len(rows)} thresholds; at {worst[0]:.2f}: model {worst[1]:.3f}, "
                   f"treat-all {worst[4]:.3f}, treat-none 0)")


def ppv_vs_prevalence(f: Figures) -> Finding | None:
    if not f.operating or f.prevalence is None:
        return None
    chosen = [o for o in f.operating if o[1] == "chosen" and o[3] is not None]
    if not chosen:
        return Finding("No usable operating point", "; ".join(f"{t}: {why}" for t, _, why, *_ in f.operating))
    random_like = [o for o in chosen if o[3] <= f.prevalence or (o[4] is not None and o[4] <= f.prevalence)]
    if random_like:
        return Finding("Alerts no better than chance at " + ", ".join(o[0] for o in random_like),
                       "; ".join(f"{o[0]}: test PPV {_ci(o[3:6])} vs prevalence {f.prevalence:.3f}"
                                 for o in random_like))
    return Finding("Alerts are enriched for events at every chosen operating point",
                   "; ".join(f"{o[0]}: test PPV {_ci(o[3:6])}" for o in chosen) + f" vs prevalence {f.prevalence:.3f}")


def multiplicity(f: Figures) -> Finding | None:
    family, raw, adjusted = f.group_verdicts
    if not family:
        return None
    return Finding(f"Subgroups: {adjusted} group verdict(s) better/worse after adjustment",
                   f"{family} per-group verdicts, Holm-adjusted; unadjusted, {raw} read better/worse, about "
                   f"{family * 0.05:.1f} expected by chance alone")


def findings(f: Figures) -> list[Finding]:
    """Every conclusion, the recommendation last."""
    out: list[Finding] = []
    if f.synthetic:
        out.append(Finding("Synthetic data", "the run was trained and tested on generated patients: no conclusion "
                                             "here is about real patients"))
    disc = discrimination(f)
    out.append(disc)
    out += [x for x in (calibration(f), recalibration(f), net_benefit(f), ppv_vs_prevalence(f), multiplicity(f)) if x]
    out.append(recommendation(f, out))
    return out


def recommendation(f: Figures, found: list[Finding]) -> Finding:
    titles = {x.finding for x in found}
    if f.n_test_units < f.min_units:
        return Finding("Recommendation: no conclusion can be drawn",
                       f"{f.n_test_units} test {f.test_unit}, fewer than the {f.min_units} a verdict needs")
    against = [x for x in found if x.finding in ("Does not discriminate", "Ranks backwards")
               or x.finding.startswith("No net benefit")]
    if against:
        return Finding("Recommendation: this model should not be used on these data",
                       "; ".join(x.finding.lower() for x in against))
    missing = []
    calibrated = any("calibrated in the large" in t and "slope compatible with 1" in t for t in titles)
    if any(t.startswith("Recalibration with") for t in titles) and not calibrated:
        missing.append("recalibration")
    if any(t.startswith("Alerts no better") for t in titles):
        missing.append("an operating point whose alerts beat chance")
    if any(t.startswith("Discrimination not established") for t in titles):
        missing.append("an established discrimination")
    missing.append("external and prospective validation")
    return Finding("Recommendation: not for clinical use on this evidence alone",
                   "needs " + ", ".join(missing))


def intended_use(task, dataset: str | None) -> dict[str, str]:
    """Population, decision, moment, user and out-of-scope uses, from the task's declaration (the Task record's
    description, clock and observation window) and the dataset the run was tested on; nothing typed per run."""
    if task is None:
        return {"population": "not stated (the task is no longer registered)", "decision": "not stated",
                "moment": "not stated", "user": "not stated", "out_of_scope": "any use"}
    what = task.description.split(",")[0] if task.description else task.name
    return {
        "population": f"admissions of the {dataset or 'run’s'} data set that enter the {task.name} task's samples",
        "decision": f"flag {what} for a clinician's review ({task.kind} risk)" if task.kind == "binary"
        else f"suggest {what} for a clinician's review",
        "moment": task.clock.words or "not stated by the task",
        "user": "a clinician reviewing the flag, with the patient's record at hand (the task declares no "
                "autonomous action)",
        "inputs": task.clock.observation_window or "not stated by the task",
        "out_of_scope": (f"any other population or data set than {dataset or 'the one tested'}; any moment before "
                         f"'{task.clock.words or 'the prediction time'}'; automated decisions without review; diagnosis; "
                         "comparing hospitals or clinicians"),
    }
