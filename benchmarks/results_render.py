"""Rendering the EHR results benchmark: the RESULTS.md section (tables, verdicts, readings) from the collected
cells, and writing it between its markers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.results_config import (
    BEGIN, BEHRT_DRUG_REC_VALIDATION, COPY_NOTE, COPY_VALIDATION, END, HEADLINE, MODEL_OVERRIDES, NEURAL,
    NEXT_VISIT_VALIDATION, TASK_MODEL_OVERRIDES, TASK_MODELS, TRAIN,
)


def fmt(values: list[float]) -> str:
    """mean ± sd over seeds; a single run is shown as such (no sd to give)."""
    if not values:
        return "—"
    arr = np.asarray(values, dtype=float)
    if len(arr) == 1:
        return f"{arr[0]:.3f} (1 seed)"
    return f"{arr.mean():.3f} ± {arr.std(ddof=1):.3f}"


def verdicts(cells: dict, task: str, model: str, rivals: tuple[str, ...], key: tuple[str, str]) -> list[str]:
    """Plain sentences: does `model` beat each rival on `key` (mean over seeds, margin vs seed sd)?"""
    lines = []
    mine = cells.get((task, model), {}).get("metrics", {}).get(key)
    for rival in rivals:
        theirs = cells.get((task, rival), {}).get("metrics", {}).get(key)
        if not mine or not theirs:
            lines.append(f"- {model} vs {rival} on {key[0]}: not available (run missing or failed).")
            continue
        a, b = float(np.mean(mine)), float(np.mean(theirs))
        spread = max(np.std(mine, ddof=1) if len(mine) > 1 else 0.0, np.std(theirs, ddof=1) if len(theirs) > 1 else 0.0)
        # Seed means only: "beats" is reserved for the paired verdicts below (issue 14).
        if a > b + spread:
            verdict = "is ahead (seed means, by more than one seed-sd; not a paired test) of"
        elif a > b:
            verdict = "is ahead of, but within one seed-sd of,"
        else:
            verdict = "**is not ahead of**"
        caveat = "" if len(mine) >= 3 else f" (only {len(mine)} seed(s) of {model}: not yet a claim)"
        how = "pooled over test samples" if key[1] == "none" else f"{key[1]}-averaged"
        lines.append(f"- {model} {verdict} {rival} on {key[0]} ({how}): {a:.3f} vs {b:.3f}{caveat}.")
    return lines


def reading(cells: dict, task: str) -> list[str]:
    """One plain sentence: how far the learned models got beyond label frequencies and from the oracle."""
    def mean(model: str, key=("pr_auc_samples", "visit")) -> float | None:
        values = cells.get((task, model), {}).get("metrics", {}).get(key)
        return float(np.mean(values)) if values else None

    floor, ceiling = mean("most_frequent"), mean("oracle")
    neural = {m: mean(m) for m in NEURAL if mean(m) is not None}
    lines = []
    if floor is not None and neural:
        best = max(neural, key=neural.get)
        sentence = (f"- Reading: the best neural model ({best}, PR-AUC {neural[best]:.3f}) sits "
                    f"{neural[best] - floor:+.3f} from most_frequent ({floor:.3f})"
                    + (f" and {neural[best] - ceiling:+.3f} from the oracle ceiling ({ceiling:.3f})" if ceiling else ""))
        if neural[best] - floor < 0.01:
            sentence += ("; a gap this small means the neural models learned little beyond label frequencies "
                         "within the CPU budget")
        lines.append(sentence + ".")
    return lines


def missing_seeds(cells: dict, task: str, n_seeds: int) -> list[str]:
    """The truthful 'not complete' line: every model of the task with fewer completed seeds than asked."""
    short = [f"{m} ({cells.get((task, m), {}).get('runs', 0)}/{n_seeds})" for m in TASK_MODELS[task]
             if cells.get((task, m), {}).get("runs", 0) < n_seeds]
    if not short:
        return []
    return [(f"- Not run for all {n_seeds} seeds yet (CPU budget; completed/asked): {', '.join(short)}; "
             "`benchmarks/results.py` resumes where it stopped.")]


def task_verdicts(cells: dict, task: str) -> list[str]:
    """next_visit (BEHRT is the task's model) and readmission: each neural model against the baselines."""
    if task == "next_visit":
        key = ("pr_auc_samples", "visit")
        lines = ["", "Verdicts (next_visit; BEHRT is the task's reference model):"]
        lines += verdicts(cells, task, "behrt", ("copy_last", "logreg", "most_frequent"), key)
        lines += verdicts(cells, task, "behrt", ("copy_last", "logreg"), ("recall_at_20", "visit"))
        lines += [line for other in NEURAL if other not in ("behrt", "seq2seq")
                  for line in verdicts(cells, task, other, ("copy_last", "logreg"), key)]
        return lines + reading(cells, task)
    if task == "readmission":
        lines = ["", "Verdicts (readmission):"]
        for other in TASK_MODELS[task]:
            if other in NEURAL:
                lines += verdicts(cells, task, other, ("logreg",), ("auroc", "none"))
                lines += verdicts(cells, task, other, ("logreg",), ("auprc", "none"))
        return lines
    return []


def render(cells: dict, dataset: str, seeds: list[int]) -> str:
    summary = cells.get("_summary", {})
    parts = [f"## EHR models on the synthetic cohort `{dataset}`", "",
             "Synthetic data (medtx.synth): always labelled synthetic; figures say nothing about real patients.",
             f"Training seeds {', '.join(map(str, seeds))}; the patient split (70/10/20) is fixed by the samples stage.",
             "Each cell: mean ± sd over seeds of the test value; each test value is the point estimate on the",
             "whole test split (medtx.evaluation.uncertainty replaces the runner's figure when the run is recorded). Per",
             "run, the 95% interval is a bootstrap WITH",
             "replacement over test patients (1,000 resamples, percentile); the 10×80% subsample sd is the",
             "SafeDrug convention, kept for comparison with papers and about half as wide. A model 'beats'",
             "another only by the paired verdicts (same resampled patients, against the reference baseline",
             "chosen on validation), with 3 agreeing seeds. Set metrics use each run's threshold: tuned on",
             "validation (grid 0.05–0.95, max visit-averaged Jaccard for drug_rec, F1 for next_visit) for",
             "neural models, logreg and oracle; top-k (k = training mean set size) for most_frequent; 0.5 for",
             "copy_last. `visit` = averaged over visits (PyHealth / sklearn samples); `patient` = averaged",
             "within patient then over patients (SafeDrug). DDI rate = interacting / all predicted pairs pooled",
             "over test visits, with ref.ddi_atc3 restricted to the label vocabulary. Model selection",
             "(early stopping, threshold) used validation only.",
             f"Neural training config (CPU budget): {json.dumps(TRAIN)}; model overrides {json.dumps(MODEL_OVERRIDES)};",
             "drug_rec transformer/transformer_rope overrides (chosen on validation): "
             f"{json.dumps(TASK_MODEL_OVERRIDES[('drug_rec', 'transformer')])};",
             COPY_NOTE.format(**COPY_VALIDATION),
             *(f"{t} {m} overrides: {json.dumps(o)};" for (t, m), o in TASK_MODEL_OVERRIDES.items()
               if not (t == "drug_rec" and m in ("transformer", "transformer_rope"))),
             NEXT_VISIT_VALIDATION, BEHRT_DRUG_REC_VALIDATION,
             "other hyper-parameters are the model files' defaults.",
             "Baselines are deterministic given the split (logreg = liblinear's primal solver: identical test",
             "probabilities across seeds, checked), so their seed sd is the bootstrap's resampling only.", ""]
    for task, keys in HEADLINE.items():
        rows = [(model, cells[(task, model)]) for model in TASK_MODELS[task] if (task, model) in cells]
        if not rows:
            continue
        n = summary.get(f"{task}.samples")
        parts += [f"### {task}" + (f" ({int(n):,} samples)" if n else ""), ""]
        header = (["model", "runs"] + [f"{m} ({a})" for m, a in keys]
                  + [f"mean per-run 95% CI of {keys[0][0]} (patient bootstrap)",
                     f"10×80% subsample sd of {keys[0][0]} (SafeDrug convention; narrower than a patient "
                     "bootstrap CI)", "threshold", "train s/run", "notes"])
        parts += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for model, cell in rows:
            notes = []
            if cell["failed"]:
                notes.append(f"{cell['failed']} failed")
            if cell["collapsed"]:
                notes.append(f"{cell['collapsed']} collapsed")
            if cell["stale"]:
                notes.append(f"{cell['stale']} run(s) under an older config not counted")
            if model == "oracle":
                notes.append("ceiling: generator's true probabilities")
            thr = (f"{np.mean(cell['threshold']):.2f} ({'/'.join(sorted(s for s in cell['source'] if s))})"
                   if cell["threshold"] else "—")
            secs = f"{np.mean(cell['seconds']):.0f}" if cell["seconds"] else "—"
            values = [fmt(cell["metrics"].get(k, [])) for k in keys]
            boot = cell["boot_sd"].get(keys[0], [])
            boot_sd = f"{np.mean(boot):.3f}" if boot else "—"
            cis = cell.get("ci", {}).get(keys[0], [])
            ci = f"[{np.mean([lo for lo, _ in cis]):.3f}, {np.mean([hi for _, hi in cis]):.3f}]" if cis else "—"
            name = f"**{model}**" if model == "transformer" else model
            parts.append("| " + " | ".join([name, str(cell["runs"]), *values, ci, boot_sd, thr, secs,
                                            "; ".join(notes)]) + " |")
        if task == "drug_rec":
            key = ("jaccard_samples", "visit")
            parts += ["", "Verdicts (drug_rec, the headline comparison):"]
            parts += verdicts(cells, task, "transformer", ("logreg", "copy_last", "most_frequent"), key)
            parts += verdicts(cells, task, "transformer", ("logreg", "copy_last"), ("pr_auc_samples", "visit"))
            parts += verdicts(cells, task, "transformer_rope", ("logreg", "copy_last"), key)
            parts += verdicts(cells, task, "transformer_rope", ("copy_last",), ("pr_auc_samples", "visit"))
            parts += [line for other in NEURAL if other != "transformer"
                      for line in verdicts(cells, task, other, ("logreg",), ("pr_auc_samples", "visit"))]
            true_ddi = cells.get((task, "oracle"), {}).get("metrics", {}).get(("ddi_rate_true", "none"))
            true_size = cells.get((task, "oracle"), {}).get("metrics", {}).get(("avg_true_size", "visit"))
            if true_ddi:
                parts.append(f"- Ground-truth DDI rate of the test label sets: {np.mean(true_ddi):.3f}; "
                             f"true mean set size {np.mean(true_size):.1f}.")
            parts += cells.get("_paired", [])
            parts += reading(cells, task)
        parts += task_verdicts(cells, task)
        parts += cells.get("_comparisons", {}).get(task, [])
        parts += missing_seeds(cells, task, len(seeds))
        parts.append("")
    return "\n".join(parts)


def write_results(path: Path, body: str) -> None:
    """Replace only the EHR section of RESULTS.md, keeping every other section (e.g. the text stage's)."""
    text = path.read_text() if path.exists() else "# medtx results\n"
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
