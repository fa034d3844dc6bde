"""benchmarks/results.py: the EHR table is rendered from ml.* and replaces only its own RESULTS.md section."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import collect, render, run_id_for, write_results
from medtx.training.experiment import ExperimentOptions, run_ehr_experiment
from tests.test_training_experiment import DATASET, tiny_db  # noqa: F401  (fixture)


def test_results_section_rendered_and_other_sections_kept(tiny_db: Path, tmp_path: Path):  # noqa: F811
    for seed in (0, 1):
        for model in ("most_frequent", "logreg", "copy_last"):
            run_ehr_experiment(tiny_db, DATASET, "drug_rec", model, seed, {"C": 0.3} if model == "logreg" else None,
                               options=ExperimentOptions(run_id=run_id_for("drug_rec", model, DATASET, seed)))
    cells = collect(tiny_db, DATASET)
    assert cells[("drug_rec", "logreg")]["runs"] == 2
    body = render(cells, DATASET, [0, 1])
    assert "| logreg | 2 |" in body and "| most_frequent | 2 |" in body
    assert "transformer vs logreg" in body  # the missing transformer is said to be missing, not hidden
    out = tmp_path / "RESULTS.md"
    out.write_text("# medtx results\n\n<!-- BEGIN text -->\ntext table\n<!-- END text -->\n\n"
                   "<!-- BEGIN ehr -->\nold\n<!-- END ehr -->\n")
    write_results(out, body)
    text = out.read_text()
    assert "text table" in text and "\nold\n" not in text and text.count("<!-- BEGIN ehr -->") == 1
