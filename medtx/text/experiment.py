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
`evaluation.py` (evaluate_text), `faq.py` (the FAQ protocol) and `run.py` (a run's recipe from its samples, with
no warehouse: what the worker, `python -m medtx.worker`, trains from a training package). This module reads a
task's samples from the warehouse and records the run there, through the shared run skeleton
(medtx.training.skeleton: load samples -> start run -> fit/predict/evaluate -> record in one transaction).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa

from medtx.store.db import quote_ident, quote_table
from medtx.store.fingerprint import tables_fingerprint
from medtx.tasks import Task
from medtx.text.base import TextConfig, TextData  # noqa: F401  (re-exported: the text stage's API)
from medtx.text.evaluation import TextEvaluation, evaluate_text  # noqa: F401  (re-exported: the text stage's API)
from medtx.text.fitting import TextFit, fit_text_model  # noqa: F401  (re-exported: the text stage's API)
from medtx.text.run import (  # noqa: F401  (re-exported: the text stage's API; the run itself lives there, pure)
    group_split_data,
    patient_split_data,
    text_config,
    text_models,
    text_run,
    text_task,
)
from medtx.training.skeleton import RunPlan, execute_run

log = logging.getLogger("medtx.text")


def load_text_data(con, spec: Task, dataset: str, *, dedupe: bool = True) -> TextData:
    """Read a text task's samples from the warehouse (see TextData): split by text group when the split is a
    column of the sample table, else by patient from samples.splits (the split of the task it trains on)."""
    from medtx.tasks.leakage import require_pass

    require_pass(con, spec, dataset)  # a task split by patient trains only past the leakage gate
    if spec.samples.split_unit == "text_group":
        # ORDER BY: a parallel scan returns rows in any order, and the order feeds the tokenizer and batches.
        frame = con.sql(f"SELECT note_id, text, label, group_id, split FROM {quote_table(spec.samples.table)} "
                        "ORDER BY note_id").to_arrow_table()
        if frame.num_rows == 0:
            raise ValueError(f"{spec.samples.table} is empty: run `medtx ingest {spec.samples.dataset}` then "
                             f"`medtx build-samples --task {spec.samples_task}`")
        return group_split_data(frame, dedupe=dedupe)
    frame = con.sql(  # DuckDB 2.0: execute(...).pl() is gone; sql(..., params=) returns a relation
        f"SELECT r.subject_id, r.hadm_id, r.text, r.label, s.split FROM {quote_table(spec.samples.table)} r "
        "JOIN samples.splits s ON s.dataset = r.dataset AND s.task = ? AND s.subject_id = r.subject_id "
        "WHERE r.dataset = ? ORDER BY r.subject_id, r.hadm_id",  # one order every run (see above)
        params=[spec.samples_task, dataset],
    ).to_arrow_table()
    return patient_split_data(frame, spec)


def load_faq(con, task: Task) -> pa.Table:
    """The FAQ's question-answer pairs with their paraphrases and folds, by pair id (medtx.text.faq.faq_pairs)."""
    from medtx.text.faq import faq_pairs

    columns_sql = ", ".join(map(quote_ident, task.samples.columns))
    return faq_pairs(con.sql(f"SELECT {columns_sql} FROM {quote_table(task.samples.table)} ORDER BY pair_id")
                     .to_arrow_table(), task)


# --------------------------------------------------------------------------------------------- recording


def _fingerprint(con, spec: Task, dataset: str) -> str:
    if spec.samples.split_unit in ("text_group", "pair"):  # the split (the FAQ's folds) is a column of the sample table
        return tables_fingerprint(con, [spec.samples.table])
    return tables_fingerprint(con, [spec.samples.table, "samples.splits"],
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
    """Train and evaluate one text model on one task and seed (or an FAQ model on the FAQ); everything lands in
    `ml.*`. Returns the run id. `task` is the record itself (`medtx.tasks.get_task(name)` where a name comes in).

    The run follows the shared skeleton (medtx.training.skeleton) with the recipe of medtx.text.run. Checkpoints go
    to `<models_dir>/<run_id>` (default: settings `models_dir`). A failure marks the run `failed` with the error
    text and re-raises.
    """
    recipe = text_run(task, model, seed, overrides)
    spec = recipe.task
    if recipe.generation:
        dataset = spec.samples.dataset  # the FAQ's own corpus
        load = lambda con: load_faq(con, spec)  # noqa: E731
    else:
        dataset = dataset or spec.samples.dataset
        if dataset is None:
            raise ValueError(f"{spec.name} needs --dataset (the EHR cohort whose NOTEEVENTS have text)")
        load = lambda con: load_text_data(con, spec, dataset, dedupe=recipe.cfg.dedupe)  # noqa: E731
    plan = RunPlan(
        spec.name, model, dataset, seed, load=load, describe=recipe.describe,
        fingerprint=lambda con: _fingerprint(con, spec, dataset),
        train=recipe.train, code_parts=recipe.code_parts,
        run_id=run_id, pipeline_run_id=pipeline_run_id, models_dir=models_dir,
    )
    run_id = execute_run(db, plan)
    results = plan.outcome["results"]
    summary = {m: round(v, 4) for m, a, v, sd, n in results.metrics["test"]}
    log.info("%s %s seed %d: %s%s", spec.name, model, seed, json.dumps(summary),
             " [COLLAPSED]" if results.summary["collapsed"] else "")
    return run_id


def run_faq_experiment(db: Path | str, model: str, seed: int = 0, overrides: dict[str, Any] | None = None,
                       *, pipeline_run_id: str | None = None, run_id: str | None = None,
                       models_dir: Path | None = None) -> str:
    """One FAQ run (k-fold over held-out paraphrases, medtx.text.faq) into ml.*, through the shared run skeleton;
    `ml.predictions.prob` holds each answer's token F1 and `text` the answer given. Returns the run id."""
    from medtx.text.faq import faq_task

    return run_text_experiment(db, faq_task(), model, seed, overrides, pipeline_run_id=pipeline_run_id,
                               run_id=run_id, models_dir=models_dir)
