"""Text experiments: one (task, model, seed) run on notes, trained, evaluated and recorded in `ml.*`.

Tasks: the registry's text classification tasks (medtx.tasks), read by their split unit: split by text group
(the split a column of the sample table, e.g. `specialty` on MTSamples) or by patient from `samples.splits`
(admissions with discharge text, e.g. `readmission_notes` on `samples.readmission`).
Models: `majority`, `tfidf_logreg` (scikit-learn), `bilstm`, `bert` (local folder / Hub id in
`bert_path`), `minilm` (optional package), `bert_scratch` (small BERT MLM-pre-trained here on the training
notes, then fine-tuned). Neural models go through the shared trainer (`medtx.training.trainer.fit`) and select
their epoch on validation (macro-F1 for specialty, AUROC for readmission); test is touched once.

Every run passes its test predictions through the collapse guard (`medtx.metrics.collapse.is_collapsed`), so a
majority-class model is stored as `collapsed = true` with the reason, never as a plain result.

The stages of a run live in their own modules: `base.py` (TextConfig, TextData), `fitting.py` (fit_text_model),
`evaluation.py` (evaluate_text), and the run skeleton shared with the FAQ runner in `runner.py` (load samples
-> start run -> fit/predict/evaluate -> record in one transaction); this module says how a task's notes are
loaded and which stages a run takes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import polars as pl

from medtx.store.db import quote_table
from medtx.store.fingerprint import tables_fingerprint
from medtx.tasks import Task, all_tasks
from medtx.text.base import TextConfig, TextData
from medtx.text.evaluation import TextEvaluation, evaluate_text  # noqa: F401  (re-exported: the text stage's API)
from medtx.text.fitting import TextFit, fit_text_model  # noqa: F401  (re-exported: the text stage's API)
from medtx.training import records
from medtx.training.skeleton import OnEpoch, RunPlan, execute_run

log = logging.getLogger("medtx.text")

def text_models() -> tuple[str, ...]:
    """The text models (baselines, then neural), a view of the model registry."""
    from medtx.models.registry import model_names

    return model_names("text_baseline") + model_names("text")


def text_config(model: str, overrides: dict[str, Any] | None = None, *, task: Task | None = None) -> TextConfig:
    """Defaults < the model's registered defaults < overrides; unknown keys are an error naming them."""
    from medtx.models.registry import model_defaults, model_names

    known = {f.name for f in dataclasses.fields(TextConfig)}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown text config keys {unknown}; known: {sorted(known)}")
    family = "text" if model in model_names("text") else "text_baseline"  # unknown: an error naming the known
    # the model's registered defaults, then the task's own for it (readmission notes: ClinicalBERT pooling)
    # no task: the first text classification task's (the registry's order)
    task = task or next(t for t in all_tasks() if t.classifies_text)
    values = {**model_defaults(model, task, family), **overrides}
    return TextConfig(**values)


# --------------------------------------------------------------------------------------------- data


def group_split_data(frame: pl.DataFrame, *, dedupe: bool = True) -> TextData:
    """From a multi-class note table split by text group (note_id, text, label, group_id, split), e.g.
    samples.specialty: y = index into the sorted labels."""
    missing = {"note_id", "text", "label", "group_id", "split"} - set(frame.columns)
    if missing:
        raise ValueError(f"the note sample table lacks columns {sorted(missing)}")
    if dedupe:
        frame = frame.sort("note_id").unique(["group_id", "label"], keep="first", maintain_order=True)
    classes = sorted(frame["label"].unique().to_list())
    index = {c: i for i, c in enumerate(classes)}
    out = frame.select(
        pl.col("note_id").cast(pl.Utf8).alias("sample_id"),
        "text",
        pl.col("label").replace_strict(index, return_dtype=pl.Int64).alias("y"),
        "split",
        pl.col("group_id").alias("unit"),
    )
    return TextData(out, classes, binary=False)


def patient_split_data(frame: pl.DataFrame, task: Task) -> TextData:
    """From a binary task's admissions joined to their patient split: only admissions with discharge text;
    y = label (0/1), classes `no_<label>`, `<label>` (the task's `label_name`)."""
    frame = frame.filter(pl.col("text").is_not_null() & (pl.col("text").str.strip_chars() != ""))
    if frame.height == 0:
        raise ValueError(f"{task.name}: no admission in {task.sample_table} has discharge text "
                         "(NOTEEVENTS is empty for this dataset; use a synthetic cohort with notes)")
    out = frame.select(
        pl.col("hadm_id").cast(pl.Utf8).alias("sample_id"),
        "text",
        pl.col("label").cast(pl.Int64).alias("y"),
        "split",
        pl.col("subject_id").alias("unit"),
        "subject_id",
        "hadm_id",
    )
    return TextData(out, [f"no_{task.label_name}", task.label_name], binary=True)


def _text_task(task: Task, *, generation: bool = False) -> Task:
    """The task of a text run: a text classification task (`Task.classifies_text`), or also the FAQ's generation
    task where the caller hands that to its runner; anything else is an error naming them."""
    def takes(t: Task) -> bool:
        return t.classifies_text or (generation and t.family == "text")

    if not takes(task):
        raise ValueError(f"unknown text task {task.name!r}; "
                         f"choose one of {tuple(t.name for t in all_tasks() if takes(t))}")
    return task


def load_text_data(con, spec: Task, dataset: str, *, dedupe: bool = True) -> TextData:
    """Read a text task's samples from the warehouse (see TextData): split by text group when the split is a
    column of the sample table, else by patient from samples.splits (the split of the task it trains on)."""
    from medtx.tasks.leakage import require_pass

    require_pass(con, spec, dataset)  # a task split by patient trains only past the leakage gate
    if spec.split_unit == "text_group":
        # ORDER BY: a parallel scan returns rows in any order, and the order feeds the tokenizer and batches.
        frame = con.sql(f"SELECT note_id, text, label, group_id, split FROM {quote_table(spec.sample_table)} "
                        "ORDER BY note_id").pl()
        if frame.height == 0:
            raise ValueError(f"{spec.sample_table} is empty: run `medtx ingest {spec.dataset}` then "
                             f"`medtx build-samples --task {spec.samples_task}`")
        return group_split_data(frame, dedupe=dedupe)
    frame = con.sql(  # DuckDB 2.0: execute(...).pl() is gone; sql(..., params=) returns a relation
        f"SELECT r.subject_id, r.hadm_id, r.text, r.label, s.split FROM {quote_table(spec.sample_table)} r "
        "JOIN samples.splits s ON s.dataset = r.dataset AND s.task = ? AND s.subject_id = r.subject_id "
        "WHERE r.dataset = ? ORDER BY r.subject_id, r.hadm_id",  # one order every run (see above)
        params=[spec.samples_task, dataset],
    ).pl()
    return patient_split_data(frame, spec)


# --------------------------------------------------------------------------------------------- recording


def _fingerprint(con, spec: Task, dataset: str) -> str:
    if spec.split_unit == "text_group":  # the split is a column of the sample table
        return tables_fingerprint(con, [spec.sample_table])
    return tables_fingerprint(con, [spec.sample_table, "samples.splits"],
                              {"dataset": dataset, "task": spec.samples_task})


def run_text_experiment(
    db: Path | str,
    task: Task,
    model: str,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    *,
    dataset: str | None = None,
    pipeline_run_id: str | None = None,
    run_id: str | None = None,
    models_dir: Path | None = None,
) -> str:
    """Train and evaluate one text model on one task and seed; everything lands in `ml.*`. Returns the run id.
    `task` is the record itself (`medtx.tasks.get_task(name)` where a name comes in).

    The run follows the shared skeleton (medtx.training.skeleton). Checkpoints go to `<models_dir>/<run_id>`
    (default: settings `models_dir`). A failure marks the run `failed` with the error text and re-raises.
    """
    if (spec := _text_task(task, generation=True)).kind == "generation":
        from medtx.text.faq import run_faq_experiment

        return run_faq_experiment(db, model, seed, overrides, pipeline_run_id=pipeline_run_id, run_id=run_id,
                                  models_dir=models_dir)
    if model not in text_models():
        raise ValueError(f"unknown text model {model!r} for {spec.name}; choose one of {text_models()}")
    cfg = text_config(model, overrides, task=spec)
    dataset = dataset or spec.dataset
    if dataset is None:
        raise ValueError(f"{spec.name} needs --dataset (the EHR cohort whose NOTEEVENTS have text)")
    plan = RunPlan(
        spec.name, model, dataset, seed,
        load=lambda con: load_text_data(con, spec, dataset, dedupe=cfg.dedupe),
        describe=lambda data: {"text": dataclasses.asdict(cfg), "n_classes": len(data.classes),
                               "n_notes": {s: data.split(s).height for s in ("train", "val", "test")}},
        fingerprint=lambda con: _fingerprint(con, spec, dataset),
        train=lambda data, folder, on_epoch: _fit_and_evaluate(data, model, cfg, seed, folder, on_epoch),
        code_parts=("text", "models", "training", "metrics"),
        run_id=run_id, pipeline_run_id=pipeline_run_id, models_dir=models_dir,
    )
    run_id = execute_run(db, plan)
    results = plan.outcome["results"]
    summary = {m: round(v, 4) for m, a, v, sd, n in results.metrics["test"]}
    log.info("%s %s seed %d: %s%s", spec.name, model, seed, json.dumps(summary),
             " [COLLAPSED]" if results.summary["collapsed"] else "")
    return run_id


def _own_copy(folder: Path, kind: str, path: Path) -> Path:
    """A checkpoint the run recorded from outside its own folder (bert_scratch's MLM encoder lives in a cache that
    seeds share) is copied into `folder/kind`: a run's record names only its own files, which is what a result
    package may carry (medtx.pipeline.exchange refuses a path outside the run's folder) and what survives the cache."""
    if path.resolve().is_relative_to(folder.resolve()):
        return path
    import shutil

    shutil.copytree(path, folder / kind, dirs_exist_ok=True)
    return folder / kind


def _fit_and_evaluate(data: TextData, model: str, cfg: TextConfig, seed: int, folder: Path,
                      on_epoch: OnEpoch) -> records.RunResults:
    """Fit (and predict the test notes: fit_text_model), evaluate, and say what to record."""
    fitted = fit_text_model(data, model, cfg, seed, folder, on_epoch=on_epoch)
    evaluation = evaluate_text(data, fitted.probs, n_boot=cfg.n_boot, seed=seed)
    return records.RunResults(
        metrics={"test": evaluation.metrics}, label_metrics={"test": evaluation.label_metrics},
        confusion={"test": evaluation.confusion}, predictions=evaluation.predictions, attention=fitted.attention,
        checkpoints={kind: (str(_own_copy(folder, kind, Path(path))), fitted.best_epoch if kind == "best" else None)
                     for kind, path in fitted.checkpoints.items()},
        summary={"collapsed": evaluation.collapsed, "collapse_reason": evaluation.collapse_reason,
                 "n_params": fitted.n_params, "best_epoch": fitted.best_epoch,
                 "train_seconds": fitted.train_seconds, "device": fitted.device,
                 "threshold": 0.5 if data.binary else None, "threshold_source": "fixed" if data.binary else None},
    )
