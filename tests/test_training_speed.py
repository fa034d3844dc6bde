"""The training fast paths compute what the plain paths compute (issue #18).

- `EncodedSet.batch(indices)` gives the same batch content as the codec's collate over those items;
- the fused `scaled_dot_product_attention` path gives the explicit-attention path's outputs, and the explicit
  path's weights are the masked softmax of the scaled scores;
- length buckets are deterministic under a seed and cover every sample exactly once per epoch;
- `fit` / `predict` accept an EncodedSet and predict the same probabilities as from the item list;
- the cheap CPU dropout drops at rate p, keeps the expectation and its gradient is its mask; training attention
  on CPU takes the explicit path with it; the fused AdamW makes the per-tensor loop's update;
- the one-GEMM label-attention head gives its written-out definition's logits and gradients;
- run setup: building an EHR model does not import transformers; `_pad` pads to the widest row, `_pad` and
  `_mask` equal padding by hand; each codec's `row_widths` gives the EncodedSet the item-by-item path gives (a
  codec that gets them wrong is refused); the data-dependent start from an EncodedSet is the start from the items;
- BEHRT's MLM pre-training: the vocabulary head on the masked positions only gives the all-positions loss and
  gradients; batches cut from an EncodedSet (fresh masks per batch) are the DataLoader path's batches and masks,
  and `length_buckets` reaches pre-training.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from medtx.models.encoded import EncodedSet, bucket_pool, length_buckets, shuffled_batches
from medtx.models.layers import Dropout, Encoder, LabelAttentionPooling, MultiHeadAttention, dropout
from medtx.training.pretrain import MLMCollator, fixed_masks, pretrain_mlm
from medtx.training.trainer import TrainConfig, fit, make_optimizer, predict
# the tiny vocabularies and sample frames of the model tests, and their one-thread, seeded autouse fixture
from tests.test_models import FRAMES, _one_thread, bundle_for  # noqa: F401
from tests.test_training_experiment import tiny_db  # noqa: F401  (fixture: tiny learnable drug_rec)


def assert_same_batch(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("name,task", [("transformer", "drug_rec"), ("gru", "readmission"),
                                       ("behrt", "drug_rec"), ("behrt", "next_visit"), ("seq2seq", "drug_rec")])
def test_encoded_set_batches_equal_the_collate(name, task):
    bundle = bundle_for(name, task)
    items = bundle.encode(FRAMES[task](n=13, seed=3))
    encoded = EncodedSet(items, bundle.collate)
    assert len(encoded) == 13
    for index in ([0, 1, 2, 3], [12, 5, 7], [4], list(range(13))):
        assert_same_batch(encoded.batch(index), bundle.collate([items[i] for i in index]))


CODECS = [("transformer", "drug_rec", {}), ("transformer", "drug_rec", {"joint_sequence": False}),
          ("gru", "readmission", {}), ("retain", "drug_rec", {}), ("behrt", "drug_rec", {}),
          ("behrt", "next_visit", {}), ("seq2seq", "drug_rec", {})]


@pytest.mark.parametrize("name,task,overrides", CODECS)
def test_row_widths_read_off_the_batch_are_the_item_by_item_widths(name, task, overrides):
    """The codec's `row_widths` fast path builds the EncodedSet the definition (one collate per item) builds:
    the same tensors, per-row widths, lengths and non-tensor rows. drug_rec rows with one visit have an empty
    drug history (width 1 alone, as `_pad` gives it); BEHRT's fixed MLM masks carry two more sequence keys."""
    bundle = bundle_for(name, task, **overrides)
    items = bundle.encode(FRAMES[task](n=17, seed=4))
    if name == "behrt":
        items = fixed_masks(items, bundle.mlm.config, seed=1)
    assert hasattr(bundle.collate.__self__, "row_widths")
    fast = EncodedSet(items, bundle.collate)
    slow = EncodedSet(items, lambda batch_items: bundle.collate(batch_items))  # no codec behind it: item by item
    assert fast.tensors.keys() == slow.tensors.keys()
    assert all(torch.equal(fast.tensors[k], slow.tensors[k]) for k in slow.tensors)
    assert fast.widths.keys() == slow.widths.keys() and len(slow.widths) >= 2
    for key in slow.widths:
        assert torch.equal(fast.widths[key], slow.widths[key]), key
    assert torch.equal(fast.lengths, slow.lengths)
    assert fast.rows == slow.rows
    if "drugs_hist" in items[0]:  # a one-visit drug_rec row's empty drug history is really among them
        assert any(not item["drugs_hist"]["ids"] for item in items)


def test_a_codec_whose_row_widths_miss_a_key_or_misfit_is_a_clear_error():
    bundle = bundle_for("transformer")
    items = bundle.encode(FRAMES["drug_rec"](n=9, seed=2))
    codec = bundle.collate.__self__

    class Forgetful(type(codec)):
        def row_widths(self, batch):
            widths = super().row_widths(batch)
            widths.pop("conditions_visit")
            return widths

    class Wide(type(codec)):
        def row_widths(self, batch):
            return {k: w + 1 for k, w in super().row_widths(batch).items()}

    forgetful, wide = Forgetful(**vars(codec)), Wide(**vars(codec))
    with pytest.raises(ValueError, match=r"Forgetful.row_widths gives widths for .*conditions_visit"):
        EncodedSet(items, forgetful.collate)
    with pytest.raises(ValueError, match=r"Wide.row_widths\['.*'\] does not fit the batch's"):
        EncodedSet(items, wide.collate)


@pytest.mark.parametrize("name", ["transformer", "behrt", "retain"])
def test_the_data_dependent_start_from_the_encoded_set_is_the_start_from_the_items(name):
    """A run's data-dependent start (output bias, copy-gate weights) reads batches cut from the training
    EncodedSet instead of collating the items again: the same parameters, bit for bit, over several chunks."""
    items = bundle_for(name).encode(FRAMES["drug_rec"](n=2500, seed=6))  # 3 chunks of up to 1,024
    states = {}
    for source in ("none", "items", "encoded"):
        torch.manual_seed(0)
        bundle = bundle_for(name)
        if source != "none":
            bundle.init_from_train(items if source == "items" else EncodedSet(items, bundle.collate))
        states[source] = bundle.model.state_dict()
    assert any(not torch.equal(states["none"][k], states["items"][k]) for k in states["none"])  # it starts somewhere
    assert all(torch.equal(states["items"][k], states["encoded"][k]) for k in states["items"])


def test_length_buckets_are_deterministic_and_cover_every_sample_once():
    lengths = torch.randint(1, 100, (1003,))
    first = length_buckets(lengths, 32, torch.Generator().manual_seed(7), pool_batches=4)
    again = length_buckets(lengths, 32, torch.Generator().manual_seed(7), pool_batches=4)
    other = length_buckets(lengths, 32, torch.Generator().manual_seed(8), pool_batches=4)
    assert [b.tolist() for b in first] == [b.tolist() for b in again]
    assert [b.tolist() for b in first] != [b.tolist() for b in other]
    assert sorted(torch.cat(first).tolist()) == list(range(1003))
    assert max(len(b) for b in first) == 32
    # batches are length-homogeneous: far less padding than plain shuffled batches
    def padded(batches):
        return sum(len(b) * int(lengths[b].max()) for b in batches)
    plain = shuffled_batches(1003, 32, torch.Generator().manual_seed(7))
    assert padded(first) < 0.75 * padded(plain)


def test_bucket_pools_keep_at_least_eight_pools_an_epoch_and_small_sets_the_plain_shuffle():
    assert bucket_pool(2357, 32, 16) == 9  # synth_10000's drug_rec training set: 74 batches
    assert bucket_pool(100_000, 32, 16) == 16  # a large set: the configured cap
    assert bucket_pool(449, 64, 16) == 0  # synth_2000 under the default pipeline's batch 64: 8 batches
    assert bucket_pool(449, 32, 16) == 0  # 15 batches: one per pool would sort nothing
    assert bucket_pool(1003, 32, 0) == 0  # off stays off


def test_fit_says_what_length_buckets_amount_to(tmp_path, caplog):
    bundle = bundle_for("transformer")
    items = bundle.encode(FRAMES["drug_rec"](n=40, seed=5))
    train, val = EncodedSet(items[:32], bundle.collate), EncodedSet(items[32:], bundle.collate)
    with caplog.at_level("INFO", logger="medtx.training"):
        fit(bundle.model, train, val, bundle.collate, TrainConfig(epochs=1, batch_size=4, device="cpu",
                                                                  length_buckets=16), tmp_path / "a")
        fit(bundle.model, train, val, bundle.collate, TrainConfig(epochs=1, batch_size=2, device="cpu",
                                                                  length_buckets=16), tmp_path / "b")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training batches")]
    assert lines == ["training batches: plain shuffle (length_buckets: too few batches for 8 pools of 2 or more)",
                     "training batches: length-bucketed, pools of 2 batches"]


def test_training_batches_of_a_small_set_are_the_plain_shuffle_bit_for_bit():
    from medtx.training.trainer import _EncodedLoader

    bundle = bundle_for("transformer")
    encoded = EncodedSet(bundle.encode(FRAMES["drug_rec"](n=40, seed=5)), bundle.collate)
    small = _EncodedLoader(encoded, 4, shuffle=True, seed=11, pool_batches=16)  # 10 batches
    plain = shuffled_batches(40, 4, torch.Generator().manual_seed(11))
    assert [b.tolist() for b in small.index] == [b.tolist() for b in plain]
    bucketed = _EncodedLoader(encoded, 2, shuffle=True, seed=11, pool_batches=16)  # 20 batches: pools of 2
    want = length_buckets(encoded.lengths, 2, torch.Generator().manual_seed(11), 2)
    assert [b.tolist() for b in bucketed.index] == [b.tolist() for b in want]


def test_shuffled_batches_match_a_shuffled_dataloader():
    loader = torch.utils.data.DataLoader(list(range(50)), batch_size=8, shuffle=True,
                                         generator=torch.Generator().manual_seed(3))
    ours = shuffled_batches(50, 8, torch.Generator().manual_seed(3))
    assert [b.tolist() for b in loader] == [b.tolist() for b in ours]


@pytest.mark.parametrize("causal,cross", [(False, False), (True, False), (False, True)])
def test_fused_attention_equals_explicit_attention(causal, cross):
    torch.manual_seed(1)
    attn = MultiHeadAttention(16, 4, dropout=0.1).eval()
    x, memory = torch.randn(5, 7, 16), torch.randn(5, 9, 16)
    mask = torch.rand(5, 9 if cross else 7) > 0.4
    mask[:, 0] = True
    mask[2] = False  # a fully hidden row: both paths give uniform weights, not NaN
    kw = {"memory": memory} if cross else {"causal": causal}
    explicit, weights = attn(x, mask, need_weights=True, **kw)
    fused, none = attn(x, mask, need_weights=False, **kw)
    assert none is None and weights.shape == (5, 4, 7, mask.shape[1])
    assert torch.allclose(explicit, fused, atol=1e-5)


def test_explicit_attention_weights_are_the_masked_softmax_of_the_scaled_scores():
    """The explicit path scales q and adds the mask (round 4); its weights are still softmax(q k^T / sqrt(d))
    over the real keys, exactly 0 on hidden keys, uniform on a fully hidden row."""
    torch.manual_seed(4)
    attn = MultiHeadAttention(16, 4, dropout=0.1).eval()
    x = torch.randn(3, 6, 16)
    mask = torch.rand(3, 6) > 0.4
    mask[:, 0] = True
    mask[1] = False
    _, weights = attn(x, mask, need_weights=True)
    q, k = attn._split(attn.q(x)), attn._split(attn.k(x))
    scores = (q @ k.transpose(-2, -1)) / 2.0  # sqrt(head_dim 4)
    want = scores.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
    want[1] = 1 / 6
    torch.testing.assert_close(weights, want)
    assert torch.count_nonzero(weights[0][..., ~mask[0]]) == 0 and torch.count_nonzero(weights[2][..., ~mask[2]]) == 0


def test_encoder_fused_path_equals_explicit_path_and_returns_no_weights():
    torch.manual_seed(2)
    encoder = Encoder(16, 4, 32, 2, dropout=0.1).eval()
    x, mask = torch.randn(3, 11, 16), torch.rand(3, 11) > 0.3
    mask[:, 0] = True
    states, weights = encoder(x, mask, need_weights=True)
    fused, none = encoder(x, mask, need_weights=False)
    assert len(weights) == 2 and none == ()
    assert torch.allclose(states, fused, atol=1e-5)


@pytest.mark.parametrize("name", ["transformer", "transformer_rope", "behrt"])
def test_model_outputs_equal_with_and_without_attention_weights(name):
    bundle = bundle_for(name)
    batch = bundle.collate(bundle.encode(FRAMES["drug_rec"](n=6)))
    model = bundle.model.eval()
    with torch.no_grad():
        plain, with_weights = model(batch), model(batch, output_attentions=True)
    assert plain.attentions is None and with_weights.attentions
    assert torch.allclose(plain.logits, with_weights.logits, atol=1e-5)


def test_fit_and_predict_take_an_encoded_set(tmp_path):
    bundle = bundle_for("transformer")
    items = bundle.encode(FRAMES["drug_rec"](n=24, seed=5))
    train, val = EncodedSet(items[:16], bundle.collate), EncodedSet(items[16:], bundle.collate)
    cfg = TrainConfig(epochs=2, batch_size=4, seed=0, device="cpu", length_buckets=2)
    result = fit(bundle.model, train, val, bundle.collate, cfg, tmp_path)
    assert result.best_epoch >= 1 and np.isfinite(result.history[-1]["train_loss"])
    fast = predict(bundle.model, val, bundle.collate, "cpu", batch_size=3)
    plain = predict(bundle.model, items[16:], bundle.collate, "cpu", batch_size=3)
    assert fast.sample_ids == plain.sample_ids
    np.testing.assert_allclose(fast.probs, plain.probs, atol=1e-6)
    np.testing.assert_array_equal(fast.y_true, plain.y_true)


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_cpu_dropout_drops_at_rate_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(1_000_003)
    out = dropout(x, p)
    dropped = float((out == 0).float().mean())
    assert abs(dropped - p) < 0.003  # 1M draws: sd of the rate ~ 0.0005
    assert abs(float(out.mean()) - 1.0) < 0.006
    values = torch.unique(out).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(1 / (1 - p), rel=1e-4)
    # every 16-bit lane of the random words is uniform (a lane with a fixed sign bit would drop 0 or 2p)
    lanes = (out == 0)[: 1_000_000].view(-1, 4).float().mean(0)
    assert torch.all((lanes - p).abs() < 0.006), lanes


def test_cpu_dropout_is_seeded_and_its_gradient_is_its_mask():
    x = torch.randn(4, 5, 6, requires_grad=True)
    torch.manual_seed(3)
    first = dropout(x, 0.3)
    torch.manual_seed(3)
    again = dropout(x, 0.3)
    assert torch.equal(first, again)
    first.sum().backward()
    kept = first.detach() != 0
    assert torch.allclose(x.grad[kept], torch.full_like(x.grad[kept], 65536 / (65536 - round(0.3 * 65536))))
    assert torch.all(x.grad[~kept] == 0)


def test_dropout_module_is_identity_in_eval_and_at_p0_and_zero_at_p1():
    x = torch.randn(7, 3)
    assert torch.equal(Dropout(0.4).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    with pytest.raises(ValueError, match="between 0 and 1"):
        Dropout(1.5)


def test_training_attention_on_cpu_drops_weights_and_equals_fused_without_dropout(monkeypatch):
    torch.manual_seed(4)
    attn = MultiHeadAttention(16, 4, dropout=0.1).train()
    x, mask = torch.randn(3, 6, 16), torch.rand(3, 6) > 0.3
    mask[:, 0] = True
    calls = []
    monkeypatch.setattr(attn, "_fused", lambda *a: calls.append("fused"))
    out, weights = attn(x, mask, need_weights=False)
    assert calls == [] and weights is None and out.shape == (3, 6, 16)  # the explicit path, weights not returned
    monkeypatch.undo()
    attn.dropout.p = 0.0  # no dropout: training takes the fused kernel, same function
    explicit, _ = attn(x, mask, need_weights=True)
    fused, _ = attn(x, mask, need_weights=False)
    assert torch.allclose(explicit, fused, atol=1e-5)


def test_fused_adamw_makes_the_loop_update():
    torch.manual_seed(5)
    models = [torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 3)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    fused = make_optimizer(models[0], TrainConfig(), torch.device("cpu"))
    loop = torch.optim.AdamW(models[1].parameters(), lr=TrainConfig().lr, weight_decay=TrainConfig().weight_decay,
                             foreach=False)
    assert fused.defaults["fused"] is True
    ids = torch.randint(0, 50, (16, 5))
    for _ in range(20):
        for model, optimizer in zip(models, (fused, loop)):
            optimizer.zero_grad()
            model(ids).pow(2).mean().backward()
            optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_label_attention_head_equals_its_written_out_definition():
    """Scores and values from one GEMM, softmax over tokens: the same logits and gradients as pooling per label
    then a dot product, over features of different lengths with padding (a row with a single real token too)."""
    torch.manual_seed(0)
    head = LabelAttentionPooling(n_features=2, n_labels=7, d_model=8)
    with torch.no_grad():
        head.bias.normal_()
    states = [torch.randn(5, 9, 8, requires_grad=True), torch.randn(5, 4, 8, requires_grad=True)]
    masks = [torch.rand(5, 9) > 0.4, torch.rand(5, 4) > 0.4]
    for mask in masks:
        mask[:, 0] = True
    masks[1][2] = torch.tensor([True, False, False, False])
    got, want = head(states, masks), head.written_out(states, masks)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    grads = torch.autograd.grad(got.square().sum(), [*states, head.query, head.weight])
    wanted = torch.autograd.grad(want.square().sum(), [*states, head.query, head.weight])
    for g, w in zip(grads, wanted, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    # padding positions do not reach the logits
    padded = [s.detach().clone() for s in states]
    padded[0][~masks[0]] = 1e3
    torch.testing.assert_close(head(padded, masks), got.detach(), rtol=1e-5, atol=1e-5)


def test_label_attention_head_predicts_in_place_with_the_same_bits():
    """Without gradients the head reuses its [B, L, labels] buffers (two alive instead of four, the peak of a
    next_visit prediction at batch 512): the logits are bit for bit those of the training-mode forward."""
    torch.manual_seed(1)
    head = LabelAttentionPooling(n_features=2, n_labels=300, d_model=16)
    states = [torch.randn(64, 40, 16), torch.randn(64, 12, 16)]
    masks = [torch.rand(64, 40) > 0.3, torch.rand(64, 12) > 0.3]
    for mask in masks:
        mask[:, 0] = True
    with torch.enable_grad():
        trained = head(states, masks).detach()
    with torch.no_grad():
        predicted = head(states, masks)
    assert torch.equal(predicted, trained)


def test_listing_and_building_ehr_models_does_not_import_transformers():
    """transformers takes seconds to import; an EHR run lists every model (task vocabularies) and builds one,
    and must not pay for it (it did: medtx.models.bert_text imported it at module level)."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from medtx.models.registry import model_names\n"
            "assert 'bert' in model_names('text') and 'transformer' in model_names('ehr')\n"
            "from tests.test_models import bundle_for\n"
            "bundle_for('transformer')\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'transformers')\n"
            "assert not loaded, loaded[:5]\n")
    root = str(Path(__file__).resolve().parent.parent)  # `tests` importable whatever the working directory
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]


def test_pad_right_pads_to_the_widest_row():
    from medtx.models.ehr_data import _pad

    torch.testing.assert_close(_pad([[1, 2, 3], [], (4,)]), torch.tensor([[1, 2, 3], [0, 0, 0], [4, 0, 0]]))
    torch.testing.assert_close(_pad([[5], [6, 7]], value=-1), torch.tensor([[5, -1], [6, 7]]))
    assert _pad([[], []]).shape == (2, 1) and _pad([]).shape == (0, 1)
    assert _pad([[1]]).dtype == torch.long


def test_pad_and_mask_are_the_written_out_padding_of_nested_lists():
    """`_pad` (one flat tensor scattered to the real positions) and `_mask` equal padding the lists by hand."""
    from medtx.models.ehr_data import _mask, _pad

    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 300):
        rows = [rng.integers(-5, 3000, size=int(rng.integers(0, 40))).tolist() for _ in range(n)]
        width = max(1, *(len(r) for r in rows))
        for value in (0, -100):
            want = torch.tensor([[*r, *[value] * (width - len(r))] for r in rows], dtype=torch.long)
            assert torch.equal(_pad(rows, value=value), want)
        mask = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
        assert torch.equal(_mask([len(r) for r in rows]), mask)
    assert torch.equal(_mask([0, 0]), torch.zeros(2, 1, dtype=torch.bool)) and _mask([]).shape == (0, 1)


def test_cpu_dropout_mask_is_the_16_bit_lane_comparison_scaled():
    """The mask written straight into x's dtype equals the definition: lane >= cut - 32768, times 1 / (1 - p)."""
    x = torch.randn(3, 7, 5, requires_grad=True)
    torch.manual_seed(11)
    out = dropout(x, 0.1)
    torch.manual_seed(11)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(1 << 63), None)
    cut = round(0.1 * 65536)
    keep = (words.view(torch.int16)[: x.numel()].view(x.shape) >= cut - 32768).to(torch.float32)
    assert torch.equal(out, x * (keep * (65536 / (65536 - cut))))
    out.sum().backward()
    assert torch.equal(x.grad, keep * (65536 / (65536 - cut)))


def test_train_vs_pyhealth_times_medtx_over_its_whole_epoch_loop(tiny_db):  # noqa: F811
    """PyHealth's Trainer.train is timed with its checkpoint writes; medtx's side is timed over its whole epoch loop
    too (each epoch's checkpoints and ml.epochs rows), not only the seconds ml.epochs records per epoch."""
    from benchmarks.train_vs_pyhealth import medtx_worker
    from medtx.training import trainer
    from tests.test_training_experiment import DATASET

    before = (trainer._train_and_validate, trainer.load_weights)
    result = medtx_worker(str(tiny_db), DATASET, 2, "1", 0)
    assert (trainer._train_and_validate, trainer.load_weights) == before  # the clock is taken off again
    assert result["seconds"] > result["epoch_seconds"] > 0
    assert result["samples_per_s"] == pytest.approx(result["n_train"] * 2 / result["seconds"])


# ----------------------------------------------------------------------------------------------- BEHRT pre-training


def test_behrt_mlm_head_on_masked_positions_gives_the_all_positions_loss_and_gradients():
    from medtx.models.behrt import IGNORE, BehrtForMaskedLM

    bundle = bundle_for("behrt")
    mlm = BehrtForMaskedLM(bundle.model.behrt).eval()  # eval: no dropout, both passes see the same states
    batch = MLMCollator(bundle.collate, bundle.config)(bundle.encode(FRAMES["drug_rec"](n=8, seed=2)))
    out = mlm(batch)
    out.loss.backward()
    fast = {n: p.grad.clone() for n, p in mlm.named_parameters() if p.grad is not None}
    mlm.zero_grad()
    states, _ = mlm.behrt(batch, input_ids=batch["mlm_input_ids"], need_weights=False)
    scores = mlm.decoder(mlm.transform(states))  # the head on every position, as before
    full = torch.nn.functional.cross_entropy(scores.flatten(0, 1), batch["mlm_labels"].flatten(), ignore_index=IGNORE)
    full.backward()
    torch.testing.assert_close(out.loss, full)
    masked = batch["mlm_labels"] != IGNORE
    torch.testing.assert_close(out.logits, scores[masked])
    assert fast.keys() == {n for n, p in mlm.named_parameters() if p.grad is not None}
    for name, param in mlm.named_parameters():
        if name in fast:
            torch.testing.assert_close(fast[name], param.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_mlm_pretraining_without_buckets_is_the_dataloader_path_bit_for_bit(tmp_path):
    """pretrain_mlm cuts its batches from an EncodedSet and masks each afresh; without length_buckets that is the
    DataLoader + MLMCollator path it replaced: the same batches, masks, losses and weights."""
    torch.manual_seed(0)
    new = bundle_for("behrt", "next_visit")
    torch.manual_seed(0)
    old = bundle_for("behrt", "next_visit")
    items = new.encode(FRAMES["next_visit"](n=20, seed=4))
    cfg = TrainConfig(epochs=3, batch_size=4, lr=1e-2, patience=5, device="cpu", progress=False, monitor="loss")
    torch.manual_seed(1)  # the MLM head is built inside: the same generator state for both
    got = pretrain_mlm(new.mlm, items[:14], items[14:], cfg, tmp_path / "new")
    torch.manual_seed(1)
    want = fit(old.mlm.make_model(), items[:14], fixed_masks(items[14:], old.config, cfg.seed),
               MLMCollator(old.mlm.collate, old.config), cfg, tmp_path / "old")
    assert [h["train_loss"] for h in got.history] == [h["train_loss"] for h in want.history]
    assert [h["val_loss"] for h in got.history] == [h["val_loss"] for h in want.history]
    for a, b in zip(new.model.behrt.parameters(), old.model.behrt.parameters(), strict=True):
        assert torch.equal(a, b)
    # the experiment hands over its fine-tuning EncodedSet: pre-training masks a view of it, the set stays unmasked
    torch.manual_seed(0)
    shared = bundle_for("behrt", "next_visit")
    encoded = EncodedSet(items[:14], shared.collate)
    torch.manual_seed(1)
    again = pretrain_mlm(shared.mlm, encoded, items[14:], cfg, tmp_path / "shared")
    assert [h["val_loss"] for h in again.history] == [h["val_loss"] for h in want.history]
    assert encoded.transform is None and "mlm_input_ids" not in encoded.batch([0, 1])
    masked = EncodedSet(items, new.collate).with_transform(MLMCollator(new.collate, new.config).masking)
    torch.manual_seed(5)
    cut = masked.batch([3, 0, 7])
    torch.manual_seed(5)
    assert_same_batch(cut, MLMCollator(new.collate, new.config)([items[i] for i in (3, 0, 7)]))


def test_length_buckets_reach_mlm_pretraining(tmp_path, caplog):
    bundle = bundle_for("behrt", "next_visit")
    items = bundle.encode(FRAMES["next_visit"](n=40, seed=6))
    cfg = TrainConfig(epochs=1, batch_size=2, device="cpu", progress=False, monitor="loss", length_buckets=16)
    with caplog.at_level("INFO", logger="medtx.training"):
        result = pretrain_mlm(bundle.mlm, items[:32], items[32:], cfg, tmp_path)
    assert np.isfinite(result.history[0]["train_loss"])
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("training batches")] == [
        "training batches: length-bucketed, pools of 2 batches"]


def test_throughput_benchmark_precisions_and_batch_sweep(monkeypatch):
    """benchmarks/train.py: each precision really runs (bf16 is a real autocast), and a batch sweep stops at a
    model's first failure (the GPU fill: sizes past an out-of-memory would fail too)."""
    import argparse

    from benchmarks import train as bench

    dev = torch.device("cpu")
    with bench.precision_context(dev, "bf16"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with bench.precision_context(dev, "fp32"):
        assert not torch.is_autocast_enabled("cpu")
    assert bench.precision_name(dev, "auto") == "fp32 (auto)"
    with pytest.raises(ValueError, match="--precision 'fp16'"):
        bench.precision_context(dev, "fp16")
    row = bench.measure("transformer", "cpu", n_batches=1, batch_size=4, precision="bf16")
    assert row["precision"] == "bf16" and row["batch_size"] == 4 and row["train_samples_per_s"] > 0

    calls = []

    def fake_worker(model, device, n_batches, size, threads, precision):
        calls.append(size)
        return {"model": model, "error": "out of memory at batch 256"} if size >= 256 else {"model": model}

    monkeypatch.setattr(bench, "run_worker", fake_worker)
    rows = bench.sweep("gru", "cuda", 3, [1024, 64, 256, 4096], None, "bf16")
    assert calls == [64, 256] and "error" in rows[-1] and len(rows) == 2
    assert bench.int_list("64, 256") == [64, 256]
    for bad in ("0", "64,x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.int_list(bad)
