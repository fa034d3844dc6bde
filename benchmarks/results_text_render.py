"""The tables of the text section of RESULTS.md (benchmarks/results_text.py), in the EHR section's conventions
(benchmarks/results_render.py, benchmarks/results_intervals.py): each run is scored once on the whole test
split and shown as `0.780 [0.771, 0.789]` (point estimate [95% bootstrap interval]); across seeds, mean ± sd of
the point estimates; the 10×80% subsample sd (SafeDrug convention) only as a named secondary column; a model
beats the task's reference baseline only when every one of at least 3 seeds' paired verdicts is `better`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import duckdb
import numpy as np

from benchmarks.results_intervals import difference, seed_claim, seed_difference
from benchmarks.results_text_data import VARIANT_SQL, Run, group_runs, load_runs, model_label
from medtx.tasks import get_task

SPECIALTY_MODELS = ("majority", "tfidf_logreg", "bilstm", "bert_scratch", "minilm")
NAMES = {"accuracy": "accuracy", "macro_f1": "macro-F1", "weighted_f1": "weighted-F1", "token_f1": "token F1",
         "exact_match": "exact match", "auroc": "AUROC", "auprc": "AUPRC", "rp80": "RP80"}
NO_INTERVAL = "no interval recorded"
REFERENCE_RULE = ("chosen by `medtx.evaluation.comparisons.reference_run`: the best non-neural baseline on validation, else "
                  "(no baseline recorded a validation figure) the first model of `NON_NEURAL`'s fixed order, "
                  "latest run")


# ----------------------------------------------------------------------------------------------- cells


def ci_cell(run: Run, metric: str) -> str:
    """`0.410 [0.380, 0.440]`; a run without an interval is marked so."""
    m = run.metrics.get(metric)
    if m is None or m.value is None:
        return "—"
    if not m.has_interval:
        return f"{m.value:.3f} ({NO_INTERVAL})"
    return f"{m.value:.3f} [{m.low:.3f}, {m.high:.3f}]"


def seed_mean_cell(group: list[Run], metric: str) -> str:
    """Mean ± sd over seeds of the point estimates; a single run is its point estimate with its interval."""
    values = [r.metrics[metric].value for r in group if metric in r.metrics and r.metrics[metric].value is not None]
    if not values:
        return "—"
    if len(group) == 1:
        m = group[0].metrics[metric]
        return f"{ci_cell(group[0], metric)} (1 seed)" if m.has_interval else f"{m.value:.3f} (1 seed; {NO_INTERVAL})"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def subsample_sd_cell(group: list[Run], metric: str) -> str:
    """The old convention, mean over the group's runs: sd over 10 resamples of 80% of test units."""
    sds = [r.metrics[metric].sd for r in group if metric in r.metrics and r.metrics[metric].sd is not None]
    return f"{np.mean(sds):.3f}" if sds else "—"


def diff_cell(run: Run, metric: str, reference: Run | None) -> str:
    """Run − reference on `metric` with its paired 95% interval and verdict."""
    if reference is not None and run.run_id == reference.run_id:
        return "— (the reference)"
    c = run.compared.get(metric)
    return "no comparison recorded" if c is None else difference(c.diff, c.low, c.high, c.verdict)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def guard(group: list[Run]) -> str:
    collapsed = sum(r.collapsed for r in group)
    return "ok" if not collapsed else "**COLLAPSED**" + (f" ({collapsed}/{len(group)})" if len(group) > 1 else "")


# ----------------------------------------------------------------------------------------------- prose


def interval_sentence(runs: list[Run], metrics: tuple[str, ...]) -> str:
    """Which interval the cells carry, read from the data (ci_method, n_boot, test units), and which runs
    have none."""
    if not runs:
        return "No completed runs recorded yet."
    shown = [(r, r.metrics[m]) for r in runs for m in metrics if m in r.metrics]
    with_ci = [(r, m) for r, m in shown if m.has_interval]
    bare = sorted({f"{r.label} s{r.seed}" for r in runs if not any(m.has_interval for rr, m in shown if rr is r)})
    missing = (f" {len(bare)} run(s) have {NO_INTERVAL} (recorded before intervals existed, or without stored test "
               f"predictions; `--intervals` recomputes them from the predictions): {', '.join(bare)}." if bare else "")
    if not with_ci:
        return f"No run of this table has an interval recorded (older warehouse): every cell says '{NO_INTERVAL}'." + (
            missing if len(bare) < len(runs) else "")
    methods = ", ".join(f"`{x}`" for x in sorted({m.method or "unnamed" for _, m in with_ci}))
    boots = "/".join(f"{x:,}" for x in sorted({m.n_boot for _, m in with_ci if m.n_boot}))
    units = "; ".join(sorted({f"{r.n_units:,} {r.unit}" for r, _ in with_ci if r.n_units}))
    return (f"Each run is scored once on the whole test split (the point estimate); its 95% interval is {methods} "
            f"(ml.metrics.ci_method): {boots or 'an unrecorded number of'} resamples with replacement over the "
            f"{units or 'test units'} of the test split (ml.runs.test_unit).{missing}")


def reference_run(runs: list[Run], task: str) -> Run | None:
    ids = {c.reference_run_id for r in runs if r.task == task for c in r.compared.values()}
    found = [r for r in runs if r.run_id in ids]
    return found[0] if found else None


def verdict_lines(runs: list[Run], task: str) -> list[str]:
    """Per non-reference model, per compared metric: each seed's paired difference and the seeds' claim."""
    reference = reference_run(runs, task)
    mine = [r for r in runs if r.task == task]
    if reference is None:
        return ["", f"No paired comparisons stored for {task} (no reference baseline run with predictions, or an "
                    "older warehouse: `--intervals` recomputes them)."] if mine else []
    c0 = next(iter(next(r for r in mine if r.compared).compared.values()))
    unit = reference.unit or "test units"
    lines = ["", f"Paired verdicts ({task}; reference baseline: {reference.label} s{reference.seed}, {REFERENCE_RULE}; "
                 f"paired bootstrap, the same {c0.n_boot:,} resamples with replacement of the {c0.n_units:,} test "
                 f"{unit} for both runs, 95% percentile interval of run − reference):"]
    for group in group_runs(mine):
        if group[0].label == reference.label:  # the reference model's other seeds against its chosen run
            continue
        for metric, averaging in get_task(task).scoring.compared:
            if averaging == "none":
                lines.append(_verdict_line(group, metric, reference.label, unit))
    return lines


def _verdict_line(group: list[Run], metric: str, reference: str, unit: str) -> str:
    compared = [(r.seed, r.compared[metric]) for r in group if metric in r.compared]
    missing = [f"s{r.seed} no comparison recorded" for r in group if metric not in r.compared]
    per_seed = [seed_difference(s, c.diff, c.low, c.high, c.verdict) for s, c in compared]
    if missing and compared:
        claim = "not every seed was compared: no claim"
    else:
        claim = seed_claim(group[0].label, reference, [c.verdict for _, c in compared], f"test {unit}")
    seeds = "; ".join(per_seed + missing)
    return f"- {group[0].label} − {reference}, {NAMES.get(metric, metric)}: {seeds} → {claim}."


# ----------------------------------------------------------------------------------------------- tables


def seed_mean_table(groups: list[list[Run]], metrics: tuple[str, ...], lead: list[str], sd_metric: str,
                    tail: list[str], cells: Callable[[list[Run]], list[str]]) -> list[str]:
    """One row per (task, model): seeds, mean ± sd over seeds per metric, the old subsample sd, then `tail`
    columns filled by `cells(group)`."""
    header = [*lead, "seeds", *(NAMES[m] for m in metrics),
              subsample_sd_header(sd_metric), *tail]
    rows = [[*_lead_cells(g[0], lead), str(len(g)), *(seed_mean_cell(g, m) for m in metrics),
             subsample_sd_cell(g, sd_metric), *cells(g)] for g in groups]
    return table(header, rows)


def per_run_table(groups: list[list[Run]], metrics: tuple[str, ...], lead: list[str], references: dict,
                  tail: tuple[str, ...] = (), cells: Callable[[Run], list[str]] | None = None) -> list[str]:
    """One row per run: each metric with its 95% interval, the paired difference from the reference on the
    task's headline compared metric, then `tail` columns filled by `cells(run)`."""
    headline = {g[0].task: get_task(g[0].task).scoring.compared[0][0] for g in groups if get_task(g[0].task).scoring.compared}
    names = sorted({NAMES[m] for m in headline.values()})
    header = [*lead, "seed", *(f"{NAMES[m]} [95% CI]" for m in metrics),
              f"{' / '.join(names) or 'headline'} − reference [paired 95% CI], verdict", *tail]
    rows = [[*_lead_cells(r, lead), str(r.seed), *(ci_cell(r, m) for m in metrics),
             diff_cell(r, headline[r.task], references.get(r.task)) if r.task in headline else "—",
             *(cells(r) if cells else [])]
            for g in groups for r in g]
    return table(header, rows)


def subsample_sd_header(metric: str) -> str:
    return f"10×80% subsample sd of {NAMES[metric]} (SafeDrug convention; narrower than the 95% CI)"


def _lead_cells(run: Run, lead: list[str]) -> list[str]:
    return [{"task": run.task, "model": run.label}[c] for c in lead]


def _order(groups: list[list[Run]], metric: str, descending: bool) -> list[list[Run]]:
    def mean(group: list[Run]) -> float:
        values = [r.metrics[metric].value for r in group if metric in r.metrics and r.metrics[metric].value is not None]
        return float(np.mean(values)) if values else float("-inf")
    return sorted(groups, key=mean, reverse=descending)


SPECIALTY_METRICS = ("accuracy", "macro_f1", "weighted_f1")


def specialty_table(con: duckdb.DuckDBPyConnection) -> list[str]:
    runs = load_runs(con, ("specialty",))
    groups = _order(group_runs(runs), "macro_f1", descending=False)
    summary = dict(con.sql("SELECT metric, value FROM samples.task_summary WHERE task = 'specialty'").fetchall())
    lines = [
        "### MTSamples medical specialty (40 classes, deduplicated, group split 70/10/20, seed 42)",
        "",
        summary_sentence(summary) + interval_sentence(runs, SPECIALTY_METRICS),
        "",
        "Seed means: mean ± sd (over training seeds) of each run's point estimate; one seed: its point estimate "
        "[95% CI].",
        "",
        *seed_mean_table(groups, SPECIALTY_METRICS, ["model"], "macro_f1", ["train s / run", "collapse guard"],
                         lambda g: [f"{np.mean([r.seconds for r in g]):.0f}", guard(g)]),
        "",
        "Per run: point estimate [95% CI], and the paired difference from the reference baseline.",
        "",
        *per_run_table(groups, SPECIALTY_METRICS, ["model"], {"specialty": reference_run(runs, "specialty")}),
        *verdict_lines(runs, "specialty"),
        "",
        *config_lines(con),
    ]
    missing = [m for m in SPECIALTY_MODELS if m not in {r.model for r in runs}]
    if missing:
        lines += ["", f"Not measured yet in this table: {', '.join(missing)} (run `--run --models ...`)."]
    lines += ["", "Published anchors: CLiGNet 2026 (Bio_ClinicalBERT + label GCN, leakage-free) macro-F1 **0.279**; "
              "the PyHealth book's ClinicalBERT run (accuracy 0.254, macro-F1 0.0116) is a collapsed majority-class "
              "predictor, like `majority` above."]
    return lines


def summary_sentence(summary: dict[str, float]) -> str:
    """The test split's size, label-noise ceiling and majority share (samples.task_summary), when recorded."""
    if not summary:
        return ""
    return (f"Test: {int(summary.get('test_units', 0) or 0)} text groups; label-noise ceiling on test (best reachable "
            f"accuracy when identical texts carry different labels): "
            f"**{summary.get('label_noise_ceiling_test', float('nan')):.3f}**; majority-class share on test "
            f"{summary.get('majority_class_accuracy_test', float('nan')):.3f}. ")


def config_lines(con: duckdb.DuckDBPyConnection) -> list[str]:
    """One line per specialty model: the config fields its runs changed from the model's defaults."""
    from medtx.training.runners.text import text_config

    rows = con.sql(f"""SELECT r.model, {VARIANT_SQL} AS variant, any_value(r.config) FROM ml.runs r
                       WHERE r.task = 'specialty' AND r.status = 'completed' GROUP BY ALL ORDER BY 1, 2""").fetchall()
    lines = ["Configs recorded in `ml.runs.config` (changes from the defaults in `medtx.training.runners.text`); "
             "neural models keep their best epoch on validation macro-F1, test is scored once:"]
    for model, variant, config in rows:
        used = json.loads(config)["text"]
        base = dataclasses.asdict(text_config(model))
        diff = {k: v for k, v in used.items() if k in base and base[k] != v}
        changed = ", ".join(f"{k}={v}" for k, v in sorted(diff.items()))
        lines.append(f"- `{model_label(model, variant)}`: {changed or 'defaults'}")
    return lines


FAQ_METRICS = ("token_f1", "exact_match")


def faq_table(con: duckdb.DuckDBPyConnection) -> list[str]:
    runs = load_runs(con, ("faq",))
    groups = _order(group_runs(runs), "token_f1", descending=True)
    lines = [
        "### Mental Health FAQ (98 pairs): held-out paraphrases, 5-fold",
        "",
        "Per fold: index/train on all 98 original questions + the other folds' paraphrases, test on this fold's "
        "paraphrases; pooled over the folds. " + interval_sentence(runs, FAQ_METRICS),
        "",
        *per_run_table(groups, FAQ_METRICS, ["model"], {"faq": reference_run(runs, "faq")},
                       (subsample_sd_header("token_f1"), "collapse guard"),
                       lambda r: [subsample_sd_cell([r], "token_f1"), guard([r])]),
    ]
    return lines + verdict_lines(runs, "faq")


READMISSION_METRICS = ("auroc", "auprc", "rp80")


def readmission_table(con: duckdb.DuckDBPyConnection) -> list[str]:
    """30-day readmission on a synthetic cohort with notes: text models beside the EHR bag-of-codes LR and
    the generator's oracle (the best reachable ranking on this cohort)."""
    runs = load_runs(con, ("readmission", "readmission_notes"))
    # Only the cohorts with note runs: a pipeline warehouse also holds EHR readmission runs of other datasets
    # (e.g. the MIMIC-III demo, without notes), which are not this comparison and must not be pooled with it.
    with_notes = {r.dataset for r in runs if r.task == "readmission_notes"}
    runs = [r for r in runs if r.dataset in with_notes]
    if not runs:
        return []
    groups = _order(group_runs(runs), "auroc", descending=True)
    datasets = ", ".join(f"`{d}`" for d in sorted({r.dataset or "?" for r in runs}))
    references = {t: reference_run(runs, t) for t in ("readmission", "readmission_notes")}
    return [
        f"### 30-day readmission from discharge notes (synthetic cohort {datasets}, templated NOTEEVENTS)",
        "",
        "Same patient split as the EHR readmission task; only admissions with a discharge summary. `oracle` scores "
        "the generator's true probabilities. Each task (EHR codes, notes) is compared with its own reference "
        "baseline. " + interval_sentence(runs, READMISSION_METRICS),
        "",
        *seed_mean_table(groups, READMISSION_METRICS, ["task", "model"], "auroc", ["collapse guard"],
                         lambda g: [guard(g)]),
        "",
        *per_run_table(groups, READMISSION_METRICS, ["task", "model"], references),
        *verdict_lines(runs, "readmission"),
        *verdict_lines(runs, "readmission_notes"),
    ]
