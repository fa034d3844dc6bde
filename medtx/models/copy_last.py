"""`copy_last`: the previous visit's drugs (drug_rec) / the current visit's diagnoses as the next visit's
(next_visit). Scores are 0.5 + 0.5*freq for copied labels and 0.49*freq for the rest, so the set at the fixed 0.5
threshold is exactly the copy while ranking metrics break its ties by training frequency (the stronger, fairer
variant). A first visit has nothing to copy: its set is empty. Multi-label tasks only (a binary task has no label
to copy). Takes no overrides."""

from __future__ import annotations

from typing import Any

import numpy as np

from medtx.models import frames
from medtx.models.baselines import label_frequencies, label_matrix
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame
from medtx.models.registry import ModelContext, ModelSpec, register_model
from medtx.tasks import Task, all_tasks


class CopyLast:
    """The labels of the last visit of the task's copy_last `source` history column (medtx.tasks): the previous
    visit's drugs (drug_rec) or the current visit's diagnoses (next_visit)."""

    def __init__(self, task: Task, labels: LabelSpace) -> None:
        copy = task.defaults_for("copy_last")  # the task's {source, skips_current} (Task.model_defaults)
        if "source" not in copy:
            defined = sorted(t.name for t in all_tasks() if "source" in t.defaults_for("copy_last"))
            raise ValueError(f"copy_last is defined for {defined}, not {task.name!r}")
        self.task, self.labels = task, labels
        self.source, self.skips_current = copy["source"], copy.get("skips_current", False)
        self.fixed_threshold: float | None = 0.5
        self.config: dict[str, Any] = {"source": self.source, "tie_break": "train_frequency"}

    def fit(self, train: Frame, val: Frame | None = None) -> CopyLast:
        self.freq = label_frequencies(label_matrix(train, self.task, self.labels))
        return self

    def _copied(self, history: list[list[str]] | None) -> list[str]:
        visits = history or []
        if self.skips_current:  # e.g. drugs_hist[-1] is the blanked current visit
            return list(visits[-2] or []) if len(visits) >= 2 else []
        return list(visits[-1] or []) if visits else []

    def predict_proba(self, frame: Frame) -> np.ndarray:
        column = self.source
        copied = np.zeros((frames.height(frame), len(self.labels)), dtype=bool)
        for row, history in enumerate(frames.values(frame, column)):
            copied[row, [self.labels.index[c] for c in self._copied(history) if c in self.labels.index]] = True
        return np.where(copied, 0.5 + 0.5 * self.freq, 0.49 * self.freq)


def build(ctx: ModelContext) -> CopyLast:
    return CopyLast(ctx.task, ctx.labels)


# reference 40: before most_frequent as a task's reference baseline
register_model(ModelSpec(name="copy_last", family="ehr_baseline", kinds=("multilabel",), rank=20, reference=40,
                         build=build))
