"""`oracle` (synthetic cohorts only): the generator's own label probabilities (raw.synth_oracle_<task>), the
ceiling a model could reach on that data. It knows the generating process, so it is never a task's reference
baseline. Takes no overrides."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from medtx.models import frames
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame
from medtx.models.registry import ModelContext, ModelSpec, register_model
from medtx.tasks import Task

log = logging.getLogger("medtx.models")


class Oracle:
    """The synthetic generator's true label probabilities per visit (raw.synth_oracle_<task> rows)."""

    def __init__(self, task: Task, labels: LabelSpace, oracle_rows: Frame) -> None:
        if frames.height(oracle_rows) == 0:
            raise ValueError(f"oracle: no raw.synth_oracle_{task.name} rows for this dataset; the oracle exists "
                             "only for synthetic cohorts loaded with their ORACLE_*.csv.gz files")
        self.task, self.labels, self.rows = task, labels, frames.arrow(oracle_rows)
        self.fixed_threshold: float | None = None
        self.config: dict[str, Any] = {"source": f"raw.synth_oracle_{task.name}"}

    def fit(self, train: Frame, val: Frame | None = None) -> Oracle:
        return self  # nothing to learn: the generator's probabilities are the model

    def predict_proba(self, frame: Frame) -> np.ndarray:
        row_of = {h: i for i, h in enumerate(frames.values(frame, "hadm_id"))}
        probs = np.zeros((frames.height(frame), len(self.labels)), dtype=np.float64)
        code_col = self.task.defaults_for("oracle").get("code_column")  # None: one probability per visit (binary)
        if code_col is None and not self.labels.binary:
            raise ValueError(f"oracle: task {self.task.name!r} declares no oracle code_column for its labels")
        hadm = self.rows.column("hadm_id")
        rows = self.rows.filter(pc.is_in(hadm, value_set=pa.array(list(row_of), type=hadm.type)))
        covered = set()
        for rec in rows.to_pylist():
            r = row_of[rec["hadm_id"]]
            covered.add(r)
            if code_col is None:
                probs[r, 0] = rec["prob"]
            elif rec[code_col] in self.labels.index:
                probs[r, self.labels.index[rec[code_col]]] = rec["prob"]
        if len(covered) < frames.height(frame):
            log.warning("oracle: %d of %d samples have no oracle probabilities (scored 0)",
                        frames.height(frame) - len(covered), frames.height(frame))
        return probs


def build(ctx: ModelContext) -> Oracle:
    if ctx.oracle_rows is None:
        raise ValueError("oracle: pass the raw.synth_oracle rows of the dataset")
    return Oracle(ctx.task, ctx.labels, ctx.oracle_rows)


register_model(ModelSpec(name="oracle", family="ehr_baseline", kinds=("multilabel", "binary"), rank=40, build=build,
                         reads_generator=True))
