"""Task facts read from the registry instead of task names spelled in code (issue 13): each view equals what
the code used to spell out. The facts are read off the `Task` objects (issue 32: no task-keyed tables)."""

from __future__ import annotations

import pytest

from medtx.tasks import all_tasks, get_task


def test_compared_metrics_are_the_tasks_declarations():
    # what medtx.evaluation.comparisons compares each task on (`Task.scoring.compared`; the dashboard's headline metric)
    from dashboard.pages.leaderboard import headline_metric

    compared = {t.name: t.scoring.compared for t in all_tasks() if t.scoring.compared}
    assert compared == {
        "drug_rec": (("pr_auc_samples", "visit"), ("jaccard_samples", "visit")),
        "next_visit": (("pr_auc_samples", "visit"), ("f1_samples", "visit")),
        "readmission": (("auprc", "none"), ("rp80", "none")),
        "mortality": (("auprc", "none"), ("rp80", "none")),  # it had none: its leaderboard ranked without a test
        "readmission_notes": (("auprc", "none"), ("rp80", "none")),
        "specialty": (("macro_f1", "none"), ("accuracy", "none")),
        "faq": (("token_f1", "none"), ("exact_match", "none")),
    }
    assert {t: headline_metric(t) for t in compared} == {t: c[0][0] for t, c in compared.items()}
    assert headline_metric("no_such_task") is None


def test_one_patient_split_and_bootstrap_units():
    from medtx.tasks.base import EHR_SAMPLE_EXTRAS

    # every EHR builder rewrites the dataset's one patient split; no task ranks the MEDS split any more
    assert all("samples.patient_splits" in t.lineage.writes for t in all_tasks() if t.family == "ehr" and t.lineage.build)
    assert "samples.patient_splits" in EHR_SAMPLE_EXTRAS and not hasattr(get_task("readmission"), "meds_split_rank")
    assert get_task("specialty").unit_name == "text groups"
    assert get_task("faq").unit_name == "pairs"
    assert get_task("readmission_notes").unit_name == "patients"


def test_copy_last_and_oracle_read_the_task():
    from medtx.models.copy_last import CopyLast
    from medtx.models.ehr_data import LabelSpace

    labels = LabelSpace.from_vocab(None, True, "readmission_30d")
    assert CopyLast(get_task("drug_rec"), labels).config["source"] == "drugs_hist"
    assert CopyLast(get_task("next_visit"), labels).config["source"] == "visits"
    with pytest.raises(ValueError, match="copy_last is defined for"):
        CopyLast(get_task("readmission"), labels)
    # the models' facts are the models' entries of the task (Task.model_defaults), not fields of the task
    assert get_task("drug_rec").defaults_for("oracle") == {"code_column": "atc3"}
    assert get_task("next_visit").defaults_for("behrt")["visit_ages"] == "ages"
    assert "visit_ages" not in get_task("drug_rec").defaults_for("behrt")
    for fact in ("copy_source", "copy_skips_current", "oracle_code_column", "visit_ages"):
        assert not hasattr(get_task("drug_rec"), fact), fact


def test_only_the_oracle_reads_the_generator_and_its_steps_need_a_synthetic_cohort():
    """Issue 32: no branch on a model's name outside its file: the plan and the runners ask the ModelSpec
    whether a model reads the synthetic generator's tables (the oracle's file says so when it registers)."""
    from medtx.models.registry import reads_generator, specs

    assert [s.name for s in specs() if s.reads_generator] == ["oracle"]
    assert reads_generator("oracle") and not reads_generator("logreg") and not reads_generator("no_such_model")
