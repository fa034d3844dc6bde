"""`most_frequent`: every visit gets the training label frequencies as scores; its set is the top-k labels, k = the
training mean set size (rounded), i.e. a fixed threshold at the k-th highest frequency. For a binary task it is
the training positive rate (a constant score: AUROC 0.5 by construction). Takes no overrides."""

from __future__ import annotations

from typing import Any

import numpy as np

from medtx.models import frames
from medtx.models.baselines import label_frequencies, label_matrix
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame
from medtx.models.registry import ModelContext, ModelSpec, register_model
from medtx.tasks import Task


class MostFrequent:
    """Training label frequencies for every sample; set = top-k, k = training mean set size."""

    def __init__(self, task: Task, labels: LabelSpace) -> None:
        self.task, self.labels = task, labels
        self.fixed_threshold: float | None = None
        self.config: dict[str, Any] = {"rule": "top_k_train_mean"}

    def fit(self, train: Frame, val: Frame | None = None) -> MostFrequent:
        y = label_matrix(train, self.task, self.labels)
        self.freq = label_frequencies(y)
        if self.labels.binary:
            self.fixed_threshold = 0.5
        else:
            k = max(1, int(round(y.sum(axis=1).mean())))
            self.fixed_threshold = float(np.sort(self.freq)[::-1][min(k, len(self.freq)) - 1])
            self.config["k"] = k
        return self

    def predict_proba(self, frame: Frame) -> np.ndarray:
        return np.tile(self.freq, (frames.height(frame), 1)).astype(np.float64)


def build(ctx: ModelContext) -> MostFrequent:
    return MostFrequent(ctx.task, ctx.labels)


# reference 50: the last choice as a task's reference baseline (medtx.evaluation.comparisons)
register_model(ModelSpec(name="most_frequent", family="ehr_baseline", kinds=("multilabel", "binary"), rank=10,
                         reference=50, build=build))
