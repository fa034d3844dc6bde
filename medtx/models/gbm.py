"""`lightgbm`: a gradient-boosted tree baseline on the same binary bag of codes as `logreg` (medtx.models.baselines:
every history code per feature plus the current visit's codes), the comparator reviewers ask for beside logistic
regression. Binary tasks only (one booster per label would cost too much on the multi-label ones).

Tuned on validation only: a small grid over the number of leaves and the learning rate, each fit with early
stopping on the validation AUPRC (at most `MAX_TREES` trees); the setting with the best validation AUPRC is kept.
Deterministic given the run's seed (`deterministic=True`, one thread per fit, fixed bagging seed). It joins the
reference-baseline choice (`reference`): when its validation AUPRC beats logreg's, it becomes the reference the
paired verdicts are drawn against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from medtx.models.baselines import TOP_DRIVERS, bag_of_codes, label_matrix
from medtx.models.ehr_data import LabelSpace
from medtx.models.frames import Frame, height
from medtx.models.registry import ModelContext, ModelSpec, register_model
from medtx.tasks import Task

MAX_TREES = 400
EARLY_STOP = 30
GRID = ({"num_leaves": 7, "learning_rate": 0.1}, {"num_leaves": 15, "learning_rate": 0.1},
        {"num_leaves": 31, "learning_rate": 0.05})
BASE = {"objective": "binary", "min_child_samples": 10, "feature_fraction": 0.8, "bagging_fraction": 0.8,
        "bagging_freq": 1, "lambda_l2": 1.0, "verbosity": -1, "deterministic": True, "force_row_wise": True,
        "num_threads": 1}


@dataclass
class LightGBM:
    task: Task
    labels: LabelSpace
    seed: int = 0
    grid: tuple[dict[str, Any], ...] = GRID
    fixed_threshold: float | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.labels.binary:
            raise ValueError("lightgbm: serves binary tasks only (one booster per label would be a separate model)")
        self.config.update(model="lightgbm", features="binary bag of history codes + current-visit codes",
                           grid=[dict(g) for g in self.grid], max_trees=MAX_TREES, early_stopping=EARLY_STOP,
                           seed=self.seed)

    def _x(self, frame: Frame):
        return self.vectorizer.transform(bag_of_codes(frame, self.task)).astype(np.float32)

    def fit(self, train: Frame, val: Frame | None = None) -> LightGBM:
        import lightgbm as lgb
        from sklearn.feature_extraction.text import CountVectorizer

        from medtx.metrics.binary import binary_metrics

        if val is None or height(val) == 0:
            raise ValueError("lightgbm: needs a validation split (tuning and early stopping)")
        y = label_matrix(train, self.task, self.labels)[:, 0]
        y_val = label_matrix(val, self.task, self.labels)[:, 0]
        if len(np.unique(y)) < 2:
            raise ValueError("lightgbm: the training split has only one class")
        self.vectorizer = CountVectorizer(analyzer=lambda doc: doc, binary=True, min_df=2)
        x = self.vectorizer.fit_transform(bag_of_codes(train, self.task)).astype(np.float32)
        x_val = self._x(val)
        self.config["n_features"] = int(x.shape[1])
        scores, boosters = [], []
        for setting in self.grid:
            params = {**BASE, **setting, "seed": self.seed, "bagging_seed": self.seed, "feature_fraction_seed": self.seed,
                      "metric": "average_precision"}
            booster = lgb.train(params, lgb.Dataset(x, y, free_raw_data=False), num_boost_round=MAX_TREES,
                                valid_sets=[lgb.Dataset(x_val, y_val)],
                                callbacks=[lgb.early_stopping(EARLY_STOP, verbose=False)])
            p = booster.predict(x_val, num_iteration=booster.best_iteration)
            scores.append(binary_metrics(y_val, p)["auprc"])
            boosters.append(booster)
        # a validation split without both classes scores NaN everywhere: the first (smallest) setting is kept
        best = int(np.nanargmax(scores)) if np.isfinite(scores).any() else 0
        self.booster = boosters[best]
        self.config.update(chosen={**self.grid[best], "trees": int(self.booster.best_iteration)},
                           val_auprc={str(i): round(float(s), 4) for i, s in enumerate(scores)},
                           drivers=top_importances(self.booster, self.vectorizer.get_feature_names_out()))
        return self

    def predict_proba(self, frame: Frame) -> np.ndarray:
        p = self.booster.predict(self._x(frame), num_iteration=self.booster.best_iteration)
        return np.asarray(p, dtype=np.float64)[:, None]


def top_importances(booster: Any, names: np.ndarray, k: int = 2 * TOP_DRIVERS) -> dict[str, Any]:
    """The k features with the largest total gain over the kept trees, as `{"kind": "gain", "rows": [[feature,
    None, share of the total gain], ...]}` for the model card (medtx.evaluation.drivers). Gain has no sign: it
    says a code matters, not in which direction."""
    gain = np.asarray(booster.feature_importance("gain", iteration=booster.best_iteration or None), dtype=np.float64)
    total = gain.sum()
    order = [i for i in np.argsort(-gain)[:k] if gain[i] > 0]
    return {"kind": "gain", "rows": [[str(names[i]), None, float(gain[i] / total)] for i in order]}


def _build(ctx: ModelContext) -> LightGBM:
    overrides = dict(ctx.overrides)
    grid = overrides.pop("grid", GRID)
    if overrides:
        raise ValueError(f"lightgbm: unknown settings {sorted(overrides)}; it takes 'grid' (a list of LightGBM "
                         "parameter dicts) only")
    return LightGBM(ctx.task, ctx.labels, ctx.seed, tuple(dict(g) for g in grid))


# reference 15: after logreg (10) in the fixed order used only when no candidate recorded a validation figure
register_model(ModelSpec(name="lightgbm", family="ehr_baseline", kinds=("binary",), build=_build, rank=35,
                         reference=15))
