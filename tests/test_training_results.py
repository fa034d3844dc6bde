"""benchmarks/results.py: the EHR table is rendered from ml.* and replaces only its own RESULTS.md section."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import collect, render, run_id_for, write_results
from medtx.pipeline.steps import train_in_process
from medtx.tasks import get_task
from tests.test_training_experiment import DATASET, tiny_db  # noqa: F401  (fixture)

DRUG_REC = get_task("drug_rec")


def test_results_section_rendered_and_other_sections_kept(tiny_db: Path, tmp_path: Path):  # noqa: F811
    for seed in (0, 1):
        for model in ("most_frequent", "logreg", "copy_last"):
            train_in_process(tiny_db, DRUG_REC, model, seed, {"C": 0.3} if model == "logreg" else None,
                             dataset=DATASET, run_id=run_id_for("drug_rec", model, DATASET, seed))
    cells = collect(tiny_db, DATASET)
    assert cells[("drug_rec", "logreg")]["runs"] == 2
    body = render(cells, DATASET, [0, 1])
    assert "| logreg | 2 |" in body and "| most_frequent | 2 |" in body
    assert "transformer vs logreg" in body  # the missing transformer is said to be missing, not hidden
    not_run = next(line for line in body.splitlines() if line.startswith("- Not run for all 2 seeds"))
    assert "transformer (0/2)" in not_run and "seq2seq (0/2)" in not_run and "oracle (0/2)" in not_run
    assert "logreg (" not in not_run and "most_frequent (" not in not_run  # complete rows are not listed
    out = tmp_path / "RESULTS.md"
    out.write_text("# medtx results\n\n<!-- BEGIN text -->\ntext table\n<!-- END text -->\n\n"
                   "<!-- BEGIN ehr -->\nold\n<!-- END ehr -->\n")
    write_results(out, body)
    text = out.read_text()
    assert "text table" in text and "\nold\n" not in text and text.count("<!-- BEGIN ehr -->") == 1


def test_runs_under_an_older_config_are_not_counted():
    from benchmarks.results import config_matches

    recorded = '{"model": {"max_codes": 64, "copy_recencies": [0]}, "train": {"epochs": 6, "lr": 0.003, "num_threads": 2}}'
    assert config_matches(recorded, {"epochs": 6, "lr": 3e-3, "num_threads": 1, "copy_recencies": (0,)})
    assert not config_matches(recorded, {"epochs": 20, "lr": 3e-3})  # the trainer setting changed
    assert not config_matches(recorded, {"epochs": 6, "copy_feature": "visits"})  # a model field it never had
    assert config_matches('{"C": "auto"}', {})  # baselines have no overrides


def test_paired_check_compares_two_runs_on_the_same_test_visits(tiny_db: Path):  # noqa: F811
    import numpy as np
    from sklearn.metrics import average_precision_score

    from benchmarks.results import paired_ahead_share, paired_lines, per_visit_scores

    runs = {}
    for model in ("logreg", "copy_last"):
        runs[model] = run_id_for("drug_rec", model, DATASET, 0)
        train_in_process(tiny_db, DRUG_REC, model, 0, {"C": 0.3} if model == "logreg" else None, dataset=DATASET,
                         run_id=runs[model])
    ids, logreg = per_visit_scores(tiny_db, runs["logreg"])
    ids_copy, copy_last = per_visit_scores(tiny_db, runs["copy_last"])
    assert np.array_equal(ids, ids_copy) and len(ids) == len(logreg["pr_auc_samples"]) > 0
    assert ((0 <= copy_last["jaccard_samples"]) & (copy_last["jaccard_samples"] <= 1)).all()
    from medtx.store.db import connect

    con = connect(tiny_db, read_only=True)
    try:  # visit 0's PR-AUC recomputed with scikit-learn from the stored predictions
        rows = con.execute("SELECT prob, y_true FROM ml.predictions WHERE run_id = ? AND hadm_id = ? ORDER BY label",
                           [runs["logreg"], int(ids[0, 0])]).fetchall()
    finally:
        con.close()
    y, p = np.array([r[1] for r in rows]), np.array([r[0] for r in rows])
    assert y.any()  # every tiny visit has drugs
    assert abs(logreg["pr_auc_samples"][0] - average_precision_score(y, p)) < 1e-9
    patients = ids[:, 1]
    assert paired_ahead_share(np.ones(len(patients)), patients) == 1.0
    assert paired_ahead_share(-np.ones(len(patients)), patients) == 0.0
    assert paired_lines(tiny_db, DATASET) == []  # no transformer runs: nothing to pair, nothing claimed


def test_results_cite_paired_verdicts_and_intervals_regenerate(tiny_db: Path):  # noqa: F811
    """RESULTS.md lines come from ml.comparisons (too_small on the 6-patient tiny split: no claim), and
    `--intervals` (recompute) restores intervals and comparisons of runs that have none."""
    from benchmarks.results_intervals import recompute
    from medtx.store.db import connect

    for model in ("logreg", "copy_last"):
        train_in_process(tiny_db, DRUG_REC, model, 0, {"C": 0.3} if model == "logreg" else None, dataset=DATASET,
                         run_id=run_id_for("drug_rec", model, DATASET, 0))
    con = connect(tiny_db)
    try:  # as a warehouse recorded before issue 14
        con.execute("UPDATE ml.metrics SET ci_low = NULL, ci_high = NULL")
        con.execute("DELETE FROM ml.comparisons")
    finally:
        con.close()
    recompute(tiny_db, DATASET, ["drug_rec"])
    body = render(collect(tiny_db, DATASET), DATASET, [0])
    line = next(x for x in body.splitlines() if x.startswith("- copy_last − logreg, pr_auc_samples (visit)"))
    assert "too_small" in line and "beats" not in line
    assert "Paired verdicts (drug_rec; reference baseline = best non-neural baseline on validation: logreg" in body
    row = next(x for x in body.splitlines() if x.startswith("| logreg | 1 |"))
    assert "[" in row and "(SafeDrug convention" in body
