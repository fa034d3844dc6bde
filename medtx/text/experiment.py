"""Text experiments: one (task, model, seed) run on notes, trained, evaluated and recorded in `ml.*`.

Tasks: `specialty` (MTSamples, 40-class, `samples.specialty`, split by text group) and `readmission_notes`
(`samples.readmission` rows that have discharge text, split by patient from `samples.splits`).
Models: `majority`, `tfidf_logreg` (scikit-learn), `bilstm`, `bert` (local folder / Hub id in
`bert_path`), `minilm` (optional package), `bert_scratch` (small BERT MLM-pre-trained here on the training
notes, then fine-tuned). Neural models go through the shared trainer (`medtx.training.trainer.fit`) and select
their epoch on validation (macro-F1 for specialty, AUROC for readmission); test is touched once.

Every run passes its test predictions through the collapse guard (`medtx.metrics.collapse.is_collapsed`), so a
majority-class model is stored as `collapsed = true` with the reason, never as a plain result.

The stages of a run live in their own modules: `base.py` (TextConfig, TextData), `fitting.py` (fit_text_model),
`evaluation.py` (evaluate_text); this module loads a task's notes, runs them in order and records the run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import traceback
from pathlib import Path
from typing import Any

import polars as pl

from medtx.db import connect
from medtx.fingerprint import code_version, tables_fingerprint
from medtx.settings import get_settings
from medtx.tasks import get_task, tasks_of_family
from medtx.text.base import TextConfig, TextData
from medtx.text.evaluation import TextEvaluation, evaluate_text  # noqa: F401  (re-exported: the text stage's API)
from medtx.text.fitting import TextFit, fit_text_model  # noqa: F401  (re-exported: the text stage's API)
from medtx.training import records
from medtx.training.runs import is_synthetic, run_folder

log = logging.getLogger("medtx.text")

# The text classification tasks of the registry (the FAQ's generation task has its own runner, medtx.text.faq).
TEXT_TASKS = tuple(t.name for t in tasks_of_family("text") if t.kind != "generation")


def text_models() -> tuple[str, ...]:
    """The text models (baselines, then neural), a view of the model registry."""
    from medtx.models.registry import model_names

    return model_names("text_baseline") + model_names("text")


def __getattr__(name: str) -> Any:
    """Views of the model registry (medtx.models.registry): the text models, and each one's defaults."""
    from medtx.models.registry import model_names, specs

    if name == "TEXT_MODELS":
        return text_models()
    if name == "NEURAL_MODELS":
        return model_names("text")
    if name == "MODEL_DEFAULTS":
        return {s.name: dict(s.defaults) for s in specs("text")}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def text_config(model: str, overrides: dict[str, Any] | None = None, *, task: str = "specialty") -> TextConfig:
    """Defaults < the model's registered defaults < overrides; unknown keys are an error naming them."""
    from medtx.models.registry import model_defaults, model_names

    known = {f.name for f in dataclasses.fields(TextConfig)}
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown text config keys {unknown}; known: {sorted(known)}")
    family = "text" if model in model_names("text") else "text_baseline"  # unknown: an error naming the known
    # the model's registered defaults, then the task's own for it (readmission notes: ClinicalBERT pooling)
    values = {**model_defaults(model, task, get_task(task).kind, family), **overrides}
    return TextConfig(**values)


# --------------------------------------------------------------------------------------------- data


def specialty_data(frame: pl.DataFrame, *, dedupe: bool = True) -> TextData:
    """From samples.specialty rows (note_id, text, label, group_id, split): y = index into sorted labels."""
    missing = {"note_id", "text", "label", "group_id", "split"} - set(frame.columns)
    if missing:
        raise ValueError(f"samples.specialty lacks columns {sorted(missing)}")
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


def readmission_notes_data(frame: pl.DataFrame) -> TextData:
    """From samples.readmission joined to its split: only admissions with discharge text; y = label (0/1)."""
    frame = frame.filter(pl.col("text").is_not_null() & (pl.col("text").str.strip_chars() != ""))
    if frame.height == 0:
        raise ValueError("readmission_notes: no admission in samples.readmission has discharge text "
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
    return TextData(out, ["no_readmission", "readmission"], binary=True)


def load_text_data(con, task: str, dataset: str, *, dedupe: bool = True) -> TextData:
    """Read a text task's samples from the warehouse (see TextData)."""
    if task == "specialty":
        frame = con.sql("SELECT note_id, text, label, group_id, split FROM samples.specialty").pl()
        if frame.height == 0:
            raise ValueError("samples.specialty is empty: run `medtx ingest mtsamples` then `medtx build-samples --task specialty`")
        return specialty_data(frame, dedupe=dedupe)
    if task == "readmission_notes":
        frame = con.sql(  # DuckDB 2.0: execute(...).pl() is gone; sql(..., params=) returns a relation
            "SELECT r.subject_id, r.hadm_id, r.text, r.label, s.split FROM samples.readmission r "
            "JOIN samples.splits s ON s.dataset = r.dataset AND s.task = 'readmission' AND s.subject_id = r.subject_id "
            "WHERE r.dataset = ?",
            params=[dataset],
        ).pl()
        return readmission_notes_data(frame)
    raise ValueError(f"unknown text task {task!r}; choose one of {TEXT_TASKS}")


# --------------------------------------------------------------------------------------------- recording


def _fingerprint(con, task: str, dataset: str) -> str:
    spec = get_task(task)
    if spec.split_unit == "text_group":  # the split is a column of the sample table
        return tables_fingerprint(con, [spec.sample_table])
    return tables_fingerprint(con, [spec.sample_table, "samples.splits"],
                              {"dataset": dataset, "task": spec.samples_task})


def run_text_experiment(
    db: Path | str,
    task: str,
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

    Checkpoints go to `<models_dir>/<run_id>` (default: settings `models_dir`). A failure marks the run
    `failed` with the error text and re-raises.
    """
    generation = tuple(t.name for t in tasks_of_family("text") if t.kind == "generation")
    if task in generation:
        from medtx.text.faq import run_faq_experiment

        return run_faq_experiment(db, model, seed, overrides, pipeline_run_id=pipeline_run_id, run_id=run_id,
                                  models_dir=models_dir)
    if task not in TEXT_TASKS:
        raise ValueError(f"unknown text task {task!r}; choose one of {(*TEXT_TASKS, *generation)}")
    if model not in text_models():
        raise ValueError(f"unknown text model {model!r} for {task}; choose one of {text_models()}")
    cfg = text_config(model, overrides, task=task)
    dataset = dataset or get_task(task).dataset
    if dataset is None:
        raise ValueError(f"{task} needs --dataset (the EHR cohort whose NOTEEVENTS have text)")
    settings = get_settings(db=Path(db))
    con = connect(db)
    try:
        data = load_text_data(con, task, dataset, dedupe=cfg.dedupe)
        run_id = run_id or records.new_run_id(task, model, dataset, seed)
        config = {"text": dataclasses.asdict(cfg), "n_classes": len(data.classes),
                  "n_notes": {s: data.split(s).height for s in ("train", "val", "test")}}
        records.start_run(con, run_id, task=task, model=model, dataset=dataset, seed=seed, config=config,
                          data_fingerprint=_fingerprint(con, task, dataset),
                          code_version=code_version("text", "models", "training", "metrics"),
                          is_synthetic=is_synthetic(con, dataset), pipeline_run_id=pipeline_run_id)
        try:
            out_dir = run_folder(models_dir or settings.models_dir, run_id)
            fitted = fit_text_model(data, model, cfg, seed, out_dir,
                                    on_epoch=lambda e, m: records.write_epochs(con, run_id, e, m))
            evaluation = evaluate_text(data, fitted.probs, n_boot=cfg.n_boot, seed=seed)
            records.write_metrics(con, run_id, "test", evaluation.metrics)
            records.write_label_metrics(con, run_id, "test", evaluation.label_metrics)
            records.write_confusion(con, run_id, "test", evaluation.confusion)
            records.write_predictions(con, run_id, evaluation.predictions)
            if fitted.attention is not None and fitted.attention.height:
                records.write_attention(con, run_id, fitted.attention)
            for kind, path in fitted.checkpoints.items():
                records.register_checkpoint(con, run_id, kind, str(path), epoch=fitted.best_epoch if kind == "best" else None)
            records.finish_run(
                con, run_id, collapsed=evaluation.collapsed, collapse_reason=evaluation.collapse_reason,
                n_params=fitted.n_params, best_epoch=fitted.best_epoch, train_seconds=fitted.train_seconds,
                device=fitted.device, threshold=0.5 if data.binary else None,
                threshold_source="fixed" if data.binary else None,
            )
        except BaseException as exc:
            records.fail_run(con, run_id, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}")
            raise
        summary = {m: round(v, 4) for m, a, v, sd, n in evaluation.metrics}
        log.info("%s %s seed %d: %s%s", task, model, seed, json.dumps(summary),
                 " [COLLAPSED]" if evaluation.collapsed else "")
        return run_id
    finally:
        con.close()
