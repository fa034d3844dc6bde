"""The honest controls every EHR transformer result sits beside, fitted on the same split: what they share (the
label matrix, training label frequencies, the bag of codes) and `build_baseline`. Each baseline is its own file,
registering its build (medtx.models.registry.ModelContext -> the baseline): most_frequent.py, copy_last.py,
logreg.py, oracle.py, gbm.py (lightgbm).

Each baseline has `fit(train_frame, val_frame=None) -> self`, `predict_proba(frame) -> [N, n_labels]`, `fixed_threshold`
(None = tune on validation like the neural models) and `config` (stored as ml.runs.config).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from medtx.models import frames
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame
from medtx.models.registry import ModelContext, get_spec
from medtx.tasks import Task


def label_matrix(frame: Frame, task: Task, labels: LabelSpace) -> np.ndarray:
    """The frame's label column as a [N, n_labels] 0/1 matrix in label-space order ([N, 1] when binary)."""
    column = task.samples.label_column
    if column not in frames.columns(frame):
        raise ValueError(f"samples.{task.table} frame lacks the label column {column!r}")
    y = np.zeros((frames.height(frame), len(labels)), dtype=np.float32)
    for row, value in enumerate(frames.values(frame, column)):
        if labels.binary:
            y[row, 0] = float(bool(value))
        else:
            y[row, [labels.index[x] for x in (value or []) if x in labels.index]] = 1.0
    return y


def label_frequencies(y: np.ndarray) -> np.ndarray:
    """Share of training samples carrying each label."""
    if y.shape[0] == 0:
        raise ValueError("baselines: the training split is empty")
    return y.mean(axis=0)


def bag_of_codes(frame: Frame, task: Task) -> list[list[str]]:
    """Per sample: `feature:code` for every code in the history and `now:feature:code` for the current visit."""
    docs = [[] for _ in range(frames.height(frame))]
    for feature in task.samples.features:
        for row, history in enumerate(frames.values(frame, feature)):
            visits = history or []
            docs[row].extend(f"{feature}:{c}" for v in visits for c in (v or []))
            if visits:
                docs[row].extend(f"now:{feature}:{c}" for c in (visits[-1] or []))
    return docs


def build_baseline(name: str, task: Task, labels: LabelSpace, oracle_rows: Frame | None = None,
                   overrides: dict | None = None, seed: int = 0) -> Any:
    """A baseline by its `--model` name, through the one build contract: its registered `build` (each baseline in
    its own file) gets a ModelContext; an unknown name is an error listing the baselines."""
    spec = get_spec(name, "ehr_baseline")
    if spec.build is None:
        raise ValueError(f"baseline {name!r} registers no build")
    return spec.build(ModelContext(task=task, labels=labels, overrides=dict(overrides or {}), seed=seed,
                                   oracle_rows=oracle_rows))


TOP_DRIVERS = 15  # per sign (binary) or in all (multi-label): what ml.runs.config keeps of a fitted baseline
