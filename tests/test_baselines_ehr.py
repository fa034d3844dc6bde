"""EHR baselines on hand-made sample frames: the rules they claim, computed by hand."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from medtx.models.baselines import build_baseline, label_matrix
from medtx.models.copy_last import CopyLast
from medtx.models.logreg import LogReg
from medtx.models.most_frequent import MostFrequent
from medtx.models.oracle import Oracle
from medtx.models.ehr_data import LabelSpace
from medtx.tasks import get_task

LABELS = LabelSpace(["A01", "B01", "C01", "D01"])
NESTED = pl.List(pl.List(pl.String))


def drug_rec_frame(rows: list[tuple[int, list[list[str]], list[list[str]], list[str]]]) -> pl.DataFrame:
    """(hadm_id, conditions history, drugs_hist, drugs) -> a samples.drug_rec-shaped frame."""
    return pl.DataFrame({
        "subject_id": [h // 10 for h, *_ in rows], "hadm_id": [h for h, *_ in rows],
        "conditions": [c for _, c, _, _ in rows], "procedures": [[["P1"]] * len(c) for _, c, _, _ in rows],
        "drugs_hist": [d for _, _, d, _ in rows], "drugs": [y for *_, y in rows],
    }, schema_overrides={"conditions": NESTED, "procedures": NESTED, "drugs_hist": NESTED, "drugs": pl.List(pl.String)})


TRAIN = drug_rec_frame([
    (10, [["c1"]], [[]], ["A01", "B01"]),
    (11, [["c1"], ["c2"]], [["A01", "B01"], []], ["A01", "C01"]),
    (20, [["c2"]], [[]], ["A01"]),
    (21, [["c2"], ["c1"]], [["A01"], []], ["A01", "B01", "XX99"]),  # XX99 is outside the label vocabulary
])


def test_label_matrix_drops_unknown_labels():
    y = label_matrix(TRAIN, get_task("drug_rec"), LABELS)
    assert y.tolist() == [[1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]]


def test_most_frequent_predicts_top_k_by_training_frequency():
    model = MostFrequent(get_task("drug_rec"), LABELS).fit(TRAIN)
    np.testing.assert_allclose(model.freq, [1.0, 0.5, 0.25, 0.0])
    assert model.config["k"] == 2  # mean set size (2+2+1+2)/4 = 1.75 -> 2
    probs = model.predict_proba(TRAIN.head(2))
    assert ((probs >= model.fixed_threshold).sum(axis=1) == 2).all()
    assert (probs[:, :2] >= model.fixed_threshold).all()


def test_copy_last_copies_previous_visit_drugs_and_breaks_ties_by_frequency():
    model = CopyLast(get_task("drug_rec"), LABELS).fit(TRAIN)
    test = drug_rec_frame([(30, [["c1"]], [[]], ["A01"]), (31, [["c1"], ["c9"]], [["C01", "D01"], []], ["C01"])])
    probs = model.predict_proba(test)
    assert (probs[0] < 0.5).all()  # first visit: nothing to copy
    assert (probs[1] >= 0.5).tolist() == [False, False, True, True]  # exactly the previous visit's drugs
    assert probs[1, 2] > probs[1, 3]  # C01 (freq .25) ranked above D01 (freq 0)
    assert probs[0, 0] > probs[0, 1]  # A01 (freq 1) ranked above B01 (freq .5) among the rest
    with pytest.raises(ValueError, match="copy_last"):
        CopyLast(get_task("readmission"), LabelSpace(["readmission_30d"], binary=True))


def test_logreg_learns_a_code_to_drug_rule():
    rng = np.random.default_rng(0)
    rows = []
    for i in range(120):
        codes = sorted({f"c{k}" for k in rng.choice(4, size=2, replace=False)})
        drugs = [LABELS.names[int(c[1])] for c in codes]
        rows.append((100 + i, [codes], [[]], drugs))
    frame = drug_rec_frame(rows)
    model = LogReg(get_task("drug_rec"), LABELS).fit(frame.head(90), frame.slice(90, 10))
    assert model.config["C_chosen"] in LogReg.C_GRID and len(model.config["C_val_scores"]) == len(LogReg.C_GRID)
    probs = model.predict_proba(frame.tail(20))
    assert ((probs >= 0.5) == (label_matrix(frame.tail(20), get_task("drug_rec"), LABELS) > 0)).mean() > 0.95
    # The grid's fit is kept (no refit): it must be the model a fresh fit at the chosen C gives, and the
    # global random state (what a training seed would change) must not move it.
    np.random.seed(123)
    fresh = LogReg(get_task("drug_rec"), LABELS, C=model.config["C_chosen"]).fit(frame.head(90))
    np.testing.assert_array_equal(fresh.predict_proba(frame.tail(20)), probs)


def test_oracle_aligns_generator_probabilities_to_label_order():
    rows = pl.DataFrame({"hadm_id": [10, 10, 11], "atc3": ["B01", "ZZ99", "D01"], "prob": [0.7, 0.9, 0.2]})
    model = build_baseline("oracle", get_task("drug_rec"), LABELS, rows).fit(TRAIN)
    probs = model.predict_proba(TRAIN.head(3))
    np.testing.assert_allclose(probs, [[0, 0.7, 0, 0], [0, 0, 0, 0.2], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="synthetic cohorts"):
        Oracle(get_task("drug_rec"), LABELS, pl.DataFrame())


def test_readmission_baselines_are_binary():
    frame = pl.DataFrame({"subject_id": [1, 2, 3, 4], "hadm_id": [1, 2, 3, 4],
                          "conditions": [[["a"]], [["b"]], [["a"]], [["b"]]],
                          "procedures": [[["p"]]] * 4, "drugs": [[["d"]]] * 4, "label": [True, False, True, False]})
    space = LabelSpace(["readmission_30d"], binary=True)
    mf = MostFrequent(get_task("readmission"), space).fit(frame)
    np.testing.assert_allclose(mf.predict_proba(frame), 0.5)
    lr = LogReg(get_task("readmission"), space, C=1.0).fit(frame)
    probs = lr.predict_proba(frame)
    assert probs.shape == (4, 1) and probs[0, 0] > probs[1, 0]
