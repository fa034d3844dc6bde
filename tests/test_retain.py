"""RETAIN (medtx/models/retain.py): reverse-time visit (alpha) and code-level attention, trained through the
EHR runner on a tiny real warehouse, its two attention levels stored in ml.attention."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medtx.models.registry import build_ehr_model, ehr_models_for, get_spec
from medtx.models.recurrent import reverse_index
from medtx.pipeline.steps import train_in_process
from medtx.tasks import get_task
from tests.test_models import CONDS, DRUGS, FEATURE_TOKENS, drug_rec_frame, readmission_frame, vocab
from tests.test_training_experiment import DATASET, _q, tiny_db  # noqa: F401  (fixture: tiny learnable drug_rec)

TINY = {"d_model": 16, "hidden": 16, "dropout": 0.0}


def retain_bundle(task: str = "drug_rec", **overrides):
    features = ("conditions", "procedures", "drugs_hist" if task == "drug_rec" else "drugs")
    vocabs = {f: vocab(FEATURE_TOKENS[f]) for f in features}
    return build_ehr_model("retain", get_task(task), vocabs, vocab(DRUGS) if task == "drug_rec" else None,
                           {**TINY, **overrides})


def test_retain_registers_itself_for_every_ehr_task_it_can_serve():
    spec = get_spec("retain")
    assert spec.family == "ehr" and set(spec.kinds) == {"multilabel", "binary"}
    assert all("retain" in ehr_models_for(get_task(task)) for task in ("drug_rec", "next_visit", "readmission"))
    with pytest.raises(ValueError, match="RetainConfig has no field.*n_heads"):
        retain_bundle(n_heads=2)


def test_reverse_index_reverses_real_visits_and_keeps_padding():
    order = reverse_index(torch.tensor([3, 1, 2]), 3)
    assert order.tolist() == [[2, 1, 0], [0, 1, 2], [1, 0, 2]]
    assert torch.equal(order.gather(1, order), torch.arange(3).expand(3, 3))  # its own inverse


@pytest.mark.parametrize(("task", "make_frame"), [("drug_rec", drug_rec_frame), ("readmission", readmission_frame)])
def test_forward_shapes_and_both_attention_levels_sum_to_one(task, make_frame):
    bundle = retain_bundle(task)
    batch = bundle.collate(bundle.encode(make_frame()))
    bundle.model.eval()
    with torch.no_grad():
        out = bundle.model(batch, output_attentions=True)
    assert out.logits.shape == batch["labels"].shape == (8, len(DRUGS) if task == "drug_rec" else 1)
    assert set(out.attentions) == set(out.attention_tokens) == {"visits", "codes"}
    nvisits = batch["conditions_nvisits"]
    alpha, codes = out.attentions["visits"][0], out.attentions["codes"][0]
    assert alpha.shape == (8, 1, 1, int(nvisits.max()))
    for i in range(8):
        visit_tokens = out.attention_tokens["visits"][1][i]
        code_tokens = out.attention_tokens["codes"][1][i]
        assert visit_tokens == [f"v{k + 1}" for k in range(int(nvisits[i]))]
        n_codes = sum(len(batch["tokens"][f][i]) for f in bundle.config.features)
        assert len(code_tokens) == n_codes and all(":" in t for t in code_tokens)
        torch.testing.assert_close(alpha[i, 0, 0, : len(visit_tokens)].sum(), torch.tensor(1.0))
        assert float(alpha[i, 0, 0, len(visit_tokens):].abs().sum()) == 0.0  # padding visits get no weight
        torch.testing.assert_close(codes[i, 0, 0, :n_codes].sum(), torch.tensor(1.0))
        assert float(codes[i, 0, 0, n_codes:].abs().sum()) == 0.0 and bool((codes[i] >= 0).all())


def test_code_weights_follow_the_exact_contributions():
    """A code's weight is |alpha * W (beta . e)| summed over labels, so a code whose embedding is zero gets 0."""
    bundle = retain_bundle()
    model = bundle.model.eval()
    batch = bundle.collate(bundle.encode(drug_rec_frame()))
    code = CONDS.index(batch["tokens"]["conditions"][0][0].split(":")[1]) + 2  # vocab id of sample 0's first code
    with torch.no_grad():
        model.embed["conditions"].weight[code] = 0.0
        out = model(batch, output_attentions=True)
    assert float(out.attentions["codes"][0][0, 0, 0, 0]) == 0.0


def test_retain_run_beats_the_label_prior_and_stores_both_attention_levels(tiny_db: Path, tmp_path: Path):  # noqa: F811
    """Trained by the EHR runner on a tiny learnable cohort (drug D<k> exactly when condition C<k>)."""
    models = tmp_path / "models"
    train = {"d_model": 16, "hidden": 16, "batch_size": 16, "lr": 1e-2, "num_threads": 1, "patience": 20}
    run_id = train_in_process(tiny_db, get_task("drug_rec"), "retain", 0, {**train, "epochs": 25, "n_showcase": 3},
                              dataset=DATASET, device="cpu", models_dir=models)
    prior = train_in_process(tiny_db, get_task("drug_rec"), "most_frequent", 0, {"n_showcase": 3}, dataset=DATASET,
                             models_dir=models)

    def test_pr_auc(run: str) -> float:
        return _q(tiny_db, "SELECT value FROM ml.metrics WHERE run_id = ? AND split = 'test' "
                  "AND metric = 'pr_auc_samples' AND averaging = 'visit'", [run])[0][0]

    assert _q(tiny_db, "SELECT status FROM ml.runs WHERE run_id = ?", [run_id])[0][0] == "completed"
    assert test_pr_auc(run_id) > test_pr_auc(prior) + 0.2 and test_pr_auc(run_id) > 0.8
    rows = _q(tiny_db, """SELECT sample_id, module, sum(weight), count(*), any_value(key_token) FROM ml.attention
                          WHERE run_id = ? GROUP BY sample_id, module""", [run_id])
    assert {r[1] for r in rows} == {"visits", "codes"} and len({r[0] for r in rows}) == 3
    assert all(abs(r[2] - 1.0) < 1e-4 for r in rows)  # alpha over visits, code shares over codes
    assert all(r[4].startswith("v") for r in rows) and any(":C" in r[4] for r in rows if r[1] == "codes")


def test_patient_explorer_draws_both_retain_attention_levels(tiny_db: Path, tmp_path: Path):  # noqa: F811
    """The patient explorer's attention queries and heatmaps read RETAIN's rows like any other model's."""
    from dashboard import queries
    from dashboard.pages.patient import MEAN_HEAD, attention_view, single_heatmap
    from medtx.publish.snapshot import publish_snapshot

    run_id = train_in_process(tiny_db, get_task("drug_rec"), "retain", 0, {**TINY, "epochs": 1, "n_showcase": 2},
                              dataset=DATASET, device="cpu", models_dir=tmp_path / "models")
    snapshot = tmp_path / "warehouse.snapshot.duckdb"
    publish_snapshot(tiny_db, snapshot)
    sample = _q(tiny_db, "SELECT min(sample_id) FROM ml.attention WHERE run_id = ?", [run_id])[0][0]
    modules = queries.attention_modules(snapshot, run_id, sample)
    assert modules["module"].to_list() == ["codes", "visits"] and modules["heads"].to_list() == [1, 1]
    for module in ("visits", "codes"):
        figure = single_heatmap(queries.attention(snapshot, run_id, sample, module), 0, MEAN_HEAD, {})
        (trace,) = figure["data"]
        assert len(trace["z"]) == 1 and abs(sum(trace["z"][0]) - 1.0) < 1e-4  # one query row, summing to 1
        assert attention_view(snapshot, run_id, sample, module, 0, MEAN_HEAD, "single") is not None
