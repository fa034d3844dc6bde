"""The gradient-boosted baseline (medtx/models/gbm.py, issue 36): same bag of codes as logreg, tuned on validation,
deterministic, and a candidate for the reference baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from medtx.evaluation.comparisons import reference_run
from medtx.models.registry import model_names, reference_models
from medtx.store.db import connect
from medtx.tasks import get_task

_BUILT: dict[str, Path] = {}


@pytest.fixture(scope="module")
def synth_db(tmp_path_factory) -> Path:
    from medtx.codes import map_codes
    from medtx.ingest import ingest_mimic3
    from medtx.tasks.build import build_samples
    from medtx.synth import generate_mimic3
    from tests.conftest import DATA

    root = tmp_path_factory.mktemp("gbm")
    generate_mimic3(root / "synth", 1500, seed=4)
    db = root / "w.duckdb"
    ingest_mimic3(db, root / "synth", "synth_gbm", root / "cache")
    con = connect(db)
    try:
        map_codes(con, DATA, ["synth_gbm"])
        build_samples(con, DATA, ["readmission"], ["synth_gbm"])
    finally:
        con.close()
    return db


def test_lightgbm_is_a_binary_baseline_and_a_reference_candidate():
    assert "lightgbm" in model_names("ehr_baseline", "binary")
    assert "lightgbm" not in model_names("ehr_baseline", "multilabel")
    assert "lightgbm" in reference_models()


def test_lightgbm_is_tuned_on_validation_deterministic_and_joins_the_reference_choice(synth_db: Path):
    from medtx.pipeline.steps import train_in_process

    runs = [train_in_process(synth_db, get_task("readmission"), "lightgbm", 1, dataset="synth_gbm") for _ in range(2)]
    logreg = train_in_process(synth_db, get_task("readmission"), "logreg", 1, dataset="synth_gbm")
    con = connect(synth_db)
    try:
        status, config = con.execute("SELECT status, config FROM ml.runs WHERE run_id = ?", [runs[0]]).fetchall()[0]
        assert status == "completed" and '"chosen"' in config and '"val_auprc"' in config
        a, b = (np.array([p for p, in con.execute("SELECT prob FROM ml.predictions WHERE run_id = ? ORDER BY sample_id",
                                                   [r]).fetchall()]) for r in runs)
        assert np.array_equal(a, b) and a.std() > 0  # same seed, same scores; not constant
        val = dict(con.execute("SELECT run_id, value FROM ml.metrics WHERE split = 'val' AND metric = 'auprc' "
                               "AND run_id IN (?, ?, ?)", [*runs, logreg]).fetchall())
        best = max(val, key=lambda r: (val[r], r in runs))
        ref = reference_run(con, get_task("readmission"), "synth_gbm")
        assert val[ref] == pytest.approx(val[best])  # whichever of logreg / lightgbm is best on validation
        (auroc,), = con.execute("SELECT value FROM ml.metrics WHERE run_id = ? AND split = 'test' AND metric = 'auroc'",
                                [runs[0]]).fetchall()
        assert auroc > 0.5
    finally:
        con.close()


def test_lightgbm_refuses_a_multilabel_task_and_unknown_settings():
    from medtx.models.baselines import build_baseline
    from medtx.models.ehr_data import LabelSpace

    with pytest.raises(ValueError, match="binary tasks only"):
        build_baseline("lightgbm", get_task("drug_rec"), LabelSpace(["a", "b"], False))
    with pytest.raises(ValueError, match="unknown settings"):
        build_baseline("lightgbm", get_task("readmission"), LabelSpace(["positive"], True), overrides={"depth": 3})
