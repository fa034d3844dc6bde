"""The text classification runner (medtx.training.runners): the runs of the text models and text baselines on a
note task, from the tables of their training package, with no warehouse. Fitting lives in
medtx.training.text_fitting, evaluation in medtx.training.text_evaluation; the text tools (tokenisers, chunking,
collates, MLM masking) in medtx.text.

- `text_run(task, model, seed, overrides)`: the run (`TextRun`): its checked config, how its samples are read from
  a training package's tables and described in ml.runs.config, and how it is trained and evaluated;
- `group_split_data` / `patient_split_data`: a note task's samples (`TextData`) from its sample rows.

Imports numpy, pyarrow, torch, scikit-learn and transformers, never polars or DuckDB (the import contract of
medtx.worker in pyproject.toml).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from medtx.models import frames
from medtx.tasks import Task, all_tasks
from medtx.training.packages import package_table
from medtx.training.results import RunResults
from medtx.training.runners import OnEpoch
from medtx.training.text_config import TextConfig, TextData

GATE = "samples.leakage_gate"


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


def text_task(task: Task) -> Task:
    """The task of a text run: a text classification task (`Task.classifies_text`); anything else is an error
    naming them."""
    if not task.classifies_text:
        raise ValueError(f"unknown text task {task.name!r}; "
                         f"choose one of {tuple(t.name for t in all_tasks() if t.classifies_text)}")
    return task


# --------------------------------------------------------------------------------------------- data


def group_split_data(frame: Any, *, dedupe: bool = True) -> TextData:
    """From a multi-class note table split by text group (note_id, text, label, group_id, split), e.g.
    samples.specialty, in note_id order: y = index into the sorted labels. `dedupe`: one row per (group, label),
    the one with the lowest note_id."""
    frame = frames.arrow(frame)
    missing = {"note_id", "text", "label", "group_id", "split"} - set(frame.column_names)
    if missing:
        raise ValueError(f"the note sample table lacks columns {sorted(missing)}")
    frame = frame.sort_by("note_id")  # stable; note_id is the sample table's key
    if dedupe:
        seen: set[tuple] = set()
        keep = []
        for i, key in enumerate(zip(frames.values(frame, "group_id"), frames.values(frame, "label"), strict=True)):
            if key not in seen:
                seen.add(key)
                keep.append(i)
        frame = frame.take(pa.array(keep, pa.int64()))
    labels = frames.values(frame, "label")
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    out = pa.table({
        "sample_id": pc.cast(frame.column("note_id"), pa.string()),
        "text": frame.column("text"),
        "y": pa.array([index[c] for c in labels], pa.int64()),
        "split": frame.column("split"),
        "unit": frame.column("group_id"),
    })
    return TextData(out, classes, binary=False)


def patient_split_data(frame: Any, task: Task) -> TextData:
    """From a binary task's admissions joined to their patient split (subject_id, hadm_id, text, label, split):
    only admissions with discharge text; y = label (0/1), classes `no_<label>`, `<label>` (the task's
    `label_name`)."""
    frame = frames.arrow(frame)
    text = frame.column("text")
    has_text = pc.and_(pc.is_valid(text), pc.not_equal(pc.utf8_trim_whitespace(text), ""))
    frame = frame.filter(pc.fill_null(has_text, False))
    if frame.num_rows == 0:
        raise ValueError(f"{task.name}: no admission in {task.samples.table} has discharge text "
                         "(NOTEEVENTS is empty for this dataset; use a synthetic cohort with notes)")
    out = pa.table({
        "sample_id": pc.cast(frame.column("hadm_id"), pa.string()),
        "text": frame.column("text"),
        "y": pc.cast(frame.column("label"), pa.int64()),
        "split": frame.column("split"),
        "unit": frame.column("subject_id"),
        "subject_id": frame.column("subject_id"),
        "hadm_id": frame.column("hadm_id"),
    })
    return TextData(out, [f"no_{task.samples.label_name}", task.samples.label_name], binary=True)


def note_rows_from_tables(tables: Mapping[str, pa.Table], task: Task, dataset: str) -> pa.Table:
    """A note task's sample rows from a training package's tables, as the warehouse loader reads them
    (the sample table and its split): split by text group, (note_id, text, label, group_id, split) in note_id
    order; split by patient, (subject_id, hadm_id, text, label, split) of the dataset's admissions whose patient has
    a split of the task's samples, in (subject_id, hadm_id) order. The leakage gate is checked first (its rows)."""
    from medtx.tasks.verdict import check_gate_rows, gated, samples_fingerprint

    gate_rows = frames.arrow(tables[GATE]).to_pylist() if GATE in tables else []
    check_gate_rows(gate_rows, task, dataset)
    samples = package_table(tables, task.samples.table)
    if gated(task):  # the samples must be those the gate judged (their fingerprint is in its record)
        check_gate_rows(gate_rows, task, dataset, samples_fingerprint(samples, package_table(tables, "samples.splits"),
                                                                      task, dataset))
    if task.samples.split_unit == "text_group":
        if samples.num_rows == 0:
            raise ValueError(f"{task.samples.table} is empty: run `medtx ingest {task.samples.dataset}` then "
                             f"`medtx build-samples --task {task.samples_task}`")
        rows = samples.select(["note_id", "text", "label", "group_id", "split"])
        return rows.sort_by("note_id")
    samples = frames.where(samples, "dataset", dataset).select(["subject_id", "hadm_id", "text", "label"])
    splits = frames.where(frames.where(package_table(tables, "samples.splits"), "dataset", dataset),
                          "task", task.samples_task)
    subjects = splits.column("subject_id").combine_chunks()
    if len(pc.unique(subjects)) != len(subjects):
        raise ValueError(f"dataset {dataset!r}, task {task.samples_task!r}: samples.splits holds a patient twice")
    at = pc.index_in(samples.column("subject_id"), value_set=subjects.cast(samples.column("subject_id").type))
    rows = samples.filter(pc.is_valid(at)).append_column(
        "split", pc.take(splits.column("split").combine_chunks(), pc.drop_null(at)))
    return rows.sort_by([("subject_id", "ascending"), ("hadm_id", "ascending")])


# --------------------------------------------------------------------------------------------- runs


def own_copy(folder: Path, kind: str, path: Path) -> Path:
    """A checkpoint the run recorded from outside its own folder (bert_scratch's MLM encoder lives in a cache that
    seeds share) is copied into `folder/kind`: a run's record names only its own files, which is what a result
    package may carry (medtx.pipeline.exchange refuses a path outside the run's folder) and what survives the cache."""
    if path.resolve().is_relative_to(folder.resolve()):
        return path
    import shutil

    shutil.copytree(path, folder / kind, dirs_exist_ok=True)
    return folder / kind


def fit_and_evaluate(data: TextData, model: str, cfg: TextConfig, seed: int, folder: Path,
                     on_epoch: OnEpoch, cache: Path | None = None) -> RunResults:
    """Fit (and predict the test notes, and a binary task's validation notes: fit_text_model), evaluate, and say
    what to record."""
    from medtx.training.text_evaluation import evaluate_text
    from medtx.training.text_fitting import fit_text_model

    fitted = fit_text_model(data, model, cfg, seed, folder, on_epoch=on_epoch, cache=cache)
    evaluation = evaluate_text(data, fitted.probs, val_probs=fitted.val_probs, n_boot=cfg.n_boot, seed=seed)
    if data.binary and evaluation.val_predictions is None:  # recalibration and operating points read them
        raise ValueError(f"{model}: no validation predictions for a binary note task")
    return RunResults(
        metrics={"test": evaluation.metrics, **({"val": evaluation.val_metrics} if evaluation.val_metrics else {})},
        label_metrics={"test": evaluation.label_metrics},
        confusion={"test": evaluation.confusion}, predictions=evaluation.predictions, attention=fitted.attention,
        # a binary task's validation predictions (as an EHR run's): what medtx.evaluation.trust fits its
        # recalibration maps and operating-point thresholds on
        val_predictions=evaluation.val_predictions,
        checkpoints={kind: (str(own_copy(folder, kind, Path(path))), fitted.best_epoch if kind == "best" else None)
                     for kind, path in fitted.checkpoints.items()},
        summary={"collapsed": evaluation.collapsed, "collapse_reason": evaluation.collapse_reason,
                 "n_params": fitted.n_params, "best_epoch": fitted.best_epoch,
                 "train_seconds": fitted.train_seconds, "device": fitted.device,
                 "threshold": 0.5 if data.binary else None, "threshold_source": "fixed" if data.binary else None},
    )


@dataclass(frozen=True)
class TextRun:
    """One text classification run, its task, model, seed and config checked (medtx.training.runners.Run):
    `samples` are a `TextData`."""

    task: Task
    model: str
    seed: int
    cfg: TextConfig

    def samples(self, tables: Mapping[str, pa.Table], dataset: str) -> TextData:
        rows = note_rows_from_tables(tables, self.task, dataset)
        if self.task.samples.split_unit == "text_group":
            return group_split_data(rows, dedupe=self.cfg.dedupe)
        return patient_split_data(rows, self.task)

    def describe(self, samples: TextData) -> dict[str, Any]:
        return {"text": dataclasses.asdict(self.cfg), "n_classes": len(samples.classes),
                "n_notes": {s: samples.split(s).num_rows for s in ("train", "val", "test")}}

    def train(self, samples: TextData, folder: Path, on_epoch: OnEpoch, cache: Path | None = None) -> RunResults:
        return fit_and_evaluate(samples, self.model, self.cfg, self.seed, folder, on_epoch, cache)


def text_run(task: Task, model: str, seed: int = 0, overrides: dict[str, Any] | None = None) -> TextRun:
    """The run of one note classification task; an unknown task, model or config key is an error naming the
    known ones."""
    spec = text_task(task)
    if model not in text_models():
        raise ValueError(f"unknown text model {model!r} for {spec.name}; choose one of {text_models()}")
    return TextRun(spec, model, seed, text_config(model, overrides, task=spec))


class TextRunner:
    """The text models and text baselines on note classification tasks (medtx.training.runners.Runner)."""

    model_families = ("text_baseline", "text")
    modules = ("medtx.training.runners.text",)
    code_parts = ("text", "models", "training", "metrics")

    def serves(self, task: Task) -> bool:
        return task.classifies_text

    def prepare(self, task: Task, model: str, seed: int, overrides: Mapping[str, Any], *,
                device: str = "auto") -> TextRun:
        return text_run(task, model, seed, {"device": device, **overrides})  # the run's overrides win

    def config_classes(self, spec: Any, task: Task) -> list[tuple[type, dict[str, Any]]]:
        """A text run's overrides go to its flat TextConfig (which holds every text model's settings)."""
        from medtx.models.registry import model_defaults

        return [(TextConfig, model_defaults(spec.name, task, spec.family))]


RUNNER = TextRunner()
