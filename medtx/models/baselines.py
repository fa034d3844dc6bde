"""The honest controls every EHR transformer result sits beside, fitted on the same split.

- `most_frequent`: every visit gets the training label frequencies as scores; its set is the top-k labels,
  k = the training mean set size (rounded), i.e. a fixed threshold at the k-th highest frequency.
  For readmission it is the training positive rate (a constant score: AUROC 0.5 by construction).
- `copy_last`: the previous visit's drugs (drug_rec) / the current visit's diagnoses as the next visit's
  (next_visit). Scores are 0.5 + 0.5*freq for copied labels and 0.49*freq for the rest, so the set at the
  fixed 0.5 threshold is exactly the copy while ranking metrics break its ties by training frequency
  (the stronger, fairer variant). A first visit has nothing to copy: its set is empty. Not defined for
  readmission.
- `logreg`: one-vs-rest logistic regression (scikit-learn, liblinear) on a binary bag of codes: every
  code of the history per feature, plus the current visit's codes as separate features. The inverse
  regularisation C is chosen from (0.03, 0.1, 0.3, 1) by validation PR-AUC (AUPRC for readmission) unless
  given: an untuned C=1 overfits small cohorts and would make the baseline look weaker than it is.
- `oracle` (synthetic cohorts only): the generator's own label probabilities (raw.synth_oracle_<task>),
  the ceiling a model could reach on that data.

Each baseline has `fit(train_frame, val_frame=None) -> self`, `predict_proba(frame) -> [N, n_labels]`, `fixed_threshold`
(None = tune on validation like the neural models) and `config` (stored as ml.runs.config).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, StrictInt
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

from medtx.models import frames
from medtx.models.bounds import PositiveFloat
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame
from medtx.models.registry import ModelSpec, get_spec, register_model
from medtx.tasks import Task, all_tasks

log = logging.getLogger("medtx.models")

BASELINE_MODELS = ("most_frequent", "copy_last", "logreg", "oracle")


def label_matrix(frame: Frame, task: Task, labels: LabelSpace) -> np.ndarray:
    """The frame's label column as a [N, n_labels] 0/1 matrix in label-space order ([N, 1] when binary)."""
    column = task.label_column
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


class CopyLast:
    """The labels of the last visit of the task's `copy_source` history column (medtx.tasks): the previous
    visit's drugs (drug_rec) or the current visit's diagnoses (next_visit)."""

    def __init__(self, task: Task, labels: LabelSpace) -> None:
        if task.copy_source is None:
            defined = sorted(t.name for t in all_tasks() if t.copy_source is not None)
            raise ValueError(f"copy_last is defined for {defined}, not {task.name!r}")
        self.task, self.labels = task, labels
        self.source, self.skips_current = task.copy_source, task.copy_skips_current
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


def bag_of_codes(frame: Frame, task: Task) -> list[list[str]]:
    """Per sample: `feature:code` for every code in the history and `now:feature:code` for the current visit."""
    docs = [[] for _ in range(frames.height(frame))]
    for feature in task.features:
        for row, history in enumerate(frames.values(frame, feature)):
            visits = history or []
            docs[row].extend(f"{feature}:{c}" for v in visits for c in (v or []))
            if visits:
                docs[row].extend(f"now:{feature}:{c}" for c in (visits[-1] or []))
    return docs


TOP_DRIVERS = 15  # per sign (binary) or in all (multi-label): what ml.runs.config keeps of a fitted baseline


def top_coefficients(model: Any, names: np.ndarray, labels: LabelSpace, k: int = TOP_DRIVERS) -> dict[str, Any]:
    """The largest coefficients of a fitted logreg as `{"kind", "rows": [[feature, label, value], ...]}` for the
    model card (medtx.evaluation.drivers): a binary model's k most positive and k most negative (log-odds per
    present code: the features are 0/1); a multi-label model's 2k largest positive (feature, label) pairs, drawn
    from each label's k largest (a label constant in training has no coefficients)."""
    if labels.binary:
        coef = np.asarray(model.coef_, dtype=np.float64).ravel()
        order = np.argsort(coef)
        picked = [*order[::-1][:k][coef[order[::-1][:k]] > 0], *order[:k][coef[order[:k]] < 0]]
        return {"kind": "coefficient", "rows": [[str(names[i]), None, float(coef[i])] for i in picked]}
    best: list[tuple[float, int, int]] = []
    for j, est in enumerate(model.estimators_):
        coef = getattr(est, "coef_", None)
        if coef is None:
            continue
        coef = np.asarray(coef, dtype=np.float64).ravel()
        top = np.argpartition(-coef, min(k, len(coef) - 1))[:k]
        best += [(float(coef[i]), j, int(i)) for i in top if coef[i] > 0]
    best.sort(reverse=True)
    return {"kind": "coefficient", "rows": [[str(names[i]), labels.names[j], v] for v, j, i in best[:2 * k]]}


@dataclass(frozen=True)
class LogRegConfig:
    """logreg's settings a pipeline config may override (`overrides: {C: 0.1}`), with their bounds; the config
    check (medtx.pipeline.checks) validates against them. The other baselines of this file take none."""

    C: PositiveFloat | Literal["auto"] = "auto"  # inverse regularisation; "auto": chosen from C_GRID on validation
    max_iter: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 200  # liblinear's iterations per fit


class LogReg:
    """One-vs-rest logistic regression on a binary bag of codes; C chosen on validation by default."""

    # Wide enough that validation picks an interior C: on synth_10000 every task improved steadily down to 0.03.
    C_GRID = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)

    def __init__(self, task: Task, labels: LabelSpace, C: float | str = LogRegConfig.C,
                 max_iter: int = LogRegConfig.max_iter) -> None:
        self.task, self.labels = task, labels
        self.fixed_threshold: float | None = None
        self.config: dict[str, Any] = {"C": C, "max_iter": max_iter, "solver": "liblinear",
                                       "features": "binary bag of history codes + current-visit codes"}

    def _fit_one(self, x, y: np.ndarray, C: float):
        base = LogisticRegression(C=C, max_iter=self.config["max_iter"], solver="liblinear")
        with warnings.catch_warnings():
            # Labels present in every training sample become constant predictors: expected, not news.
            warnings.filterwarnings("ignore", message="Label .* is present in all training examples")
            warnings.filterwarnings("ignore", category=ConvergenceWarning)
            if self.labels.binary:
                if len(np.unique(y[:, 0])) < 2:
                    raise ValueError("logreg: the training split has only one readmission class")
                return base.fit(x, y[:, 0])
            return OneVsRestClassifier(base).fit(x, y)

    def fit(self, train: Frame, val: Frame | None = None) -> LogReg:
        """Fit on `train`; with C='auto', pick C from C_GRID by validation PR-AUC (AUPRC when binary)."""
        from medtx.metrics.binary import binary_metrics
        from medtx.metrics.multilabel import pr_auc_samples

        y = label_matrix(train, self.task, self.labels)
        # float64 from the start: liblinear works in float64, and an int64 matrix was converted again for each of
        # the C grid x labels binary fits (10,283 at next_visit synth_10000): 0.75x the time, identical output
        self.vectorizer = CountVectorizer(analyzer=lambda doc: doc, binary=True, min_df=1, dtype=np.float64)
        x = self.vectorizer.fit_transform(bag_of_codes(train, self.task))
        self.config["n_features"] = int(x.shape[1])
        if self.config["C"] != "auto":
            self.model = self._fit_one(x, y, float(self.config["C"]))
            return self._with_drivers()
        if val is None or frames.height(val) == 0:
            raise ValueError("logreg: C='auto' needs a validation split to choose C on")
        y_val = label_matrix(val, self.task, self.labels)
        scores, fitted = {}, {}
        for C in self.C_GRID:
            self.model = fitted[C] = self._fit_one(x, y, C)
            p = self.predict_proba(val)
            scores[C] = (binary_metrics(y_val[:, 0], p[:, 0])["auprc"] if self.labels.binary
                         else pr_auc_samples(y_val, p))
        best = max(scores, key=lambda c: (scores[c], -abs(np.log(c))))
        self.config.update(C_chosen=best, C_val_scores={str(c): round(v, 4) for c, v in scores.items()})
        # Keep the grid's fit instead of refitting: liblinear's primal (TRON) solver is deterministic, so a
        # refit is the same model, and at 1,469 next_visit labels it cost a fifth of the run.
        self.model = fitted[best]
        return self._with_drivers()

    def _with_drivers(self) -> LogReg:
        """Keep the largest coefficients in the run's config (ml.runs.config: the model card's drivers)."""
        self.config["drivers"] = top_coefficients(self.model, self.vectorizer.get_feature_names_out(), self.labels)
        return self

    def predict_proba(self, frame: Frame) -> np.ndarray:
        x = self.vectorizer.transform(bag_of_codes(frame, self.task))
        if self.labels.binary:
            return self.model.predict_proba(x)[:, 1:2].astype(np.float64)
        return np.asarray(self.model.predict_proba(x), dtype=np.float64)


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
        code_col = self.task.oracle_code_column  # None: one probability per visit (binary)
        if code_col is None and not self.labels.binary:
            raise ValueError(f"oracle: task {self.task.name!r} declares no oracle_code_column for its labels")
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


@dataclass(frozen=True)
class BaselineContext:
    """What a baseline registered in its own file (`ModelSpec.build`, family ehr_baseline) is built from."""

    task: Task
    labels: LabelSpace
    overrides: dict
    seed: int = 0


def build_baseline(name: str, task: Task, labels: LabelSpace, oracle_rows: Frame | None = None,
                   overrides: dict | None = None, seed: int = 0) -> Any:
    """A baseline by its `--model` name: the four below, or one registered in its own file with a `build`."""
    overrides = overrides or {}
    if name == "most_frequent":
        return MostFrequent(task, labels)
    if name == "copy_last":
        return CopyLast(task, labels)
    if name == "logreg":
        return LogReg(task, labels, **overrides)
    if name == "oracle":
        if oracle_rows is None:
            raise ValueError("oracle: pass the raw.synth_oracle rows of the dataset")
        return Oracle(task, labels, oracle_rows)
    spec = get_spec(name, "ehr_baseline")  # an unknown name: an error listing the baselines
    if spec.build is None:
        raise ValueError(f"baseline {name!r} registers no build")
    return spec.build(BaselineContext(task, labels, overrides, seed))


# copy_last copies the previous visit's labels: a multi-label task only (a binary task has no label to copy).
# reference: the preference as a task's reference baseline (medtx.models.registry.ModelSpec.reference); the
# oracle knows the generating process and is never the reference.
# config: the settings a pipeline config may override (None: the baseline takes no overrides).
for _rank, (_name, _kinds, _reference, _config) in enumerate((("most_frequent", ("multilabel", "binary"), 50, None),
                                                              ("copy_last", ("multilabel",), 40, None),
                                                              ("logreg", ("multilabel", "binary"), 10, LogRegConfig),
                                                              ("oracle", ("multilabel", "binary"), None, None))):
    register_model(ModelSpec(name=_name, family="ehr_baseline", kinds=_kinds, rank=10 * (_rank + 1),
                             reference=_reference, config=_config, reads_generator=_name == "oracle"))
