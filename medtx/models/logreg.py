"""`logreg`: one-vs-rest logistic regression (scikit-learn, liblinear) on a binary bag of codes: every code of the
history per feature, plus the current visit's codes as separate features. The inverse regularisation C is chosen
by validation PR-AUC (AUPRC for a binary task) unless given: an untuned C=1 overfits small cohorts and would make
the baseline look weaker than it is."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, StrictInt
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier

from medtx.models import frames
from medtx.models.baselines import TOP_DRIVERS, bag_of_codes, label_matrix
from medtx.models.bounds import PositiveFloat
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame
from medtx.models.registry import ModelContext, ModelSpec, register_model
from medtx.tasks import Task


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


def build(ctx: ModelContext) -> LogReg:
    return LogReg(ctx.task, ctx.labels, **ctx.overrides)


# reference 10: the first choice as a task's reference baseline; config: the settings a pipeline config may override
register_model(ModelSpec(name="logreg", family="ehr_baseline", kinds=("multilabel", "binary"), rank=30, reference=10,
                         config=LogRegConfig, build=build))
