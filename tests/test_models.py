"""Neural EHR models: encoding, overfitting, attention, masks, RoPE, MLM masking, decoding, registry.

Tiny configs on a handful of hand-made samples with the samples tables' columns; one torch thread so the
file stays fast on a shared 2-core machine.
"""

from __future__ import annotations

import dataclasses
import random

import polars as pl
import pytest
import torch

from medtx.models.behrt import BehrtForMaskedLM
from medtx.models.ehr_data import (
    CLS,
    SEP,
    LabelSpace,
    behrt_codec,
    behrt_sequence,
    flatten_history,
    history_codec,
    split_flat_codes,
)
from medtx.models.registry import (
    ehr_neural_models,
    model_tasks,
    build_ehr_model,
    load_ehr_model,
    required_features,
)
from medtx.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer, beam_search, greedy_decode
from medtx.models.transformer_rope import RotaryEmbedding
from medtx.training.pretrain import MLMCollator, fixed_masks, mask_tokens, pretrain_mlm
from medtx.samples.vocab import Vocab
from medtx.tasks import get_task
from tests.fixtures_samples import demo_db  # noqa: F401  (session fixture: the demo built by the real pipeline)

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0}
TINY_RNN = {"d_model": 16, "hidden": 16, "dropout": 0.0}
TINY_RETAIN = {"d_model": 16, "hidden": 16, "dropout": 0.0}
TINY_S2S = {"d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32, "dropout": 0.0}
CONDS = [f"c{i}" for i in range(20)]
PROCS = [f"p{i}" for i in range(10)]
DRUGS = [f"D{i}" for i in range(8)]


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield
    torch.set_num_threads(threads)


def vocab(tokens: list[str]) -> Vocab:
    return Vocab(["<pad>", "<unk>", *tokens])


def tiny(name: str) -> dict:
    if name == "retain":
        return TINY_RETAIN
    return TINY_S2S if name == "seq2seq" else TINY_RNN if name in ("rnn", "gru", "lstm") else TINY


def drug_rec_frame(n: int = 8, seed: int = 0) -> pl.DataFrame:
    """samples.drug_rec-shaped rows: 1-3 visits, drugs_hist[-1] = [], label = sorted ATC-3 set."""
    rng = random.Random(seed)
    rows = []
    for s in range(n):
        visits = rng.randint(1, 3)
        rows.append({
            "subject_id": s, "hadm_id": 100 + s,
            "conditions": [rng.sample(CONDS, rng.randint(1, 4)) for _ in range(visits)],
            "procedures": [rng.sample(PROCS, rng.randint(1, 2)) for _ in range(visits)],
            "drugs_hist": [rng.sample(DRUGS, 2) for _ in range(visits - 1)] + [[]],
            "drugs": sorted(rng.sample(DRUGS, rng.randint(1, 3))),
        })
    return pl.DataFrame(rows)


def next_visit_frame(n: int = 6, seed: int = 1) -> pl.DataFrame:
    """samples.next_visit-shaped rows, with the BEHRT flattening the samples stage writes."""
    rng = random.Random(seed)
    rows = []
    for s in range(n):
        visits = [rng.sample(CONDS, rng.randint(1, 3)) for _ in range(rng.randint(1, 3))]
        ages = [60 + i for i in range(len(visits))]
        codes, segments, ages_flat, positions = [CLS], [0], [ages[0]], [0]
        for i, v in enumerate(visits):
            codes += [*v, SEP]
            segments += [i % 2] * (len(v) + 1)
            ages_flat += [ages[i]] * (len(v) + 1)
            positions += [i] * (len(v) + 1)
        rows.append({"subject_id": s, "hadm_id": 200 + s, "next_hadm_id": 300 + s, "visits": visits, "ages": ages,
                     "codes": codes, "segments": segments, "ages_flat": ages_flat, "positions": positions,
                     "label": sorted(rng.sample(CONDS, 3))})
    return pl.DataFrame(rows)


def readmission_frame(n: int = 8, seed: int = 2) -> pl.DataFrame:
    rows = drug_rec_frame(n, seed).to_dicts()
    return pl.DataFrame([{"subject_id": r["subject_id"], "hadm_id": r["hadm_id"], "conditions": r["conditions"],
                          "procedures": r["procedures"], "drugs": [*r["drugs_hist"][:-1], r["drugs"]],
                          "label": i % 2 == 0} for i, r in enumerate(rows)])


FRAMES = {"drug_rec": drug_rec_frame, "next_visit": next_visit_frame, "readmission": readmission_frame}
FEATURE_TOKENS = {"conditions": CONDS, "procedures": PROCS, "drugs_hist": DRUGS, "drugs": DRUGS, "visits": CONDS}
LABEL_TOKENS = {"drug_rec": DRUGS, "next_visit": CONDS, "readmission": None}


def bundle_for(name: str, task: str = "drug_rec", **overrides):
    vocabs = {f: vocab(FEATURE_TOKENS[f]) for f in required_features(name, get_task(task))}
    labels = vocab(LABEL_TOKENS[task]) if LABEL_TOKENS[task] else None
    return build_ehr_model(name, get_task(task), vocabs, labels, {**tiny(name), **overrides})


def batch_of(bundle, frame: pl.DataFrame) -> dict:
    return bundle.collate(bundle.encode(frame))


# ----------------------------------------------------------------------------------------------- encoding


def test_flatten_history_keeps_the_most_recent_visits_and_codes():
    codes, visit, n = flatten_history([["a"], ["b", "c"], [], ["d", "e"]], max_visits=3, max_codes=3)
    assert (codes, visit, n) == (["c", "d", "e"], [0, 2, 2], 3)  # visit 1 (["a"]) dropped, then code "b"
    assert flatten_history([[]], 5, 5) == ([], [], 1)  # the blanked current drug history is still a visit


def test_history_codec_maps_unknown_codes_and_drops_unknown_labels():
    frame = pl.DataFrame([{"subject_id": 1, "hadm_id": 7, "conditions": [["c1"], ["zz"]], "procedures": [["p1"]],
                           "drugs_hist": [["D1"], []], "drugs": ["D2", "NEW"]}])
    labels = LabelSpace.from_vocab(vocab(DRUGS), binary=False)
    codec = history_codec(get_task("drug_rec"), {f: vocab(FEATURE_TOKENS[f]) for f in ("conditions", "procedures",
                                                                            "drugs_hist")}, labels, 20, 128)
    batch = codec.collate(codec.encode(frame))
    assert batch["conditions_ids"].tolist() == [[3, 1]]  # c1 -> idx 3, unknown "zz" -> <unk>
    assert batch["conditions_visit"].tolist() == [[0, 1]] and batch["drugs_hist_nvisits"].tolist() == [2]
    assert batch["tokens"]["conditions"] == [["v1:c1", "v2:zz"]]
    assert batch["labels"][0].nonzero().flatten().tolist() == [2] and labels.dropped == 1  # D2 kept, NEW dropped
    assert batch["sample_id"] == ["7"] and batch["subject_id"] == [1]


def test_joint_history_runs_visit_by_visit_with_every_features_current_visit_last():
    """The joint sequence holds each feature's kept codes, oldest visit first, features in order within a visit; a
    feature with a shorter history is aligned at the current visit; ids are the joint index's, tokens name the
    feature."""
    frame = pl.DataFrame([{"subject_id": 1, "hadm_id": 7,
                           "conditions": [["c1"], ["c2", "zz"], ["c3"]], "procedures": [["p1"]],
                           "drugs_hist": [["D1"], ["D2", "D3"], []], "drugs": ["D2"]}])
    vocabs = {f: vocab(FEATURE_TOKENS[f]) for f in ("conditions", "procedures", "drugs_hist")}
    labels = LabelSpace.from_vocab(vocab(DRUGS), binary=False)
    codec = history_codec(get_task("drug_rec"), vocabs, labels, max_visits=2, max_codes=128, joint=True)
    item = codec.encode(frame)[0]
    assert item["codes"]["tokens"] == ["v1:c2", "v1:zz", "v1:drugs_hist:D2", "v1:drugs_hist:D3", "v2:c3",
                                       "v2:procedures:p1"]
    assert item["codes"]["visit"] == [0, 0, 0, 0, 1, 1] and item["codes"]["nvisits"] == 2
    index = codec.joint
    assert [index.labels[i] for i in item["codes"]["ids"]] == ["c2", "<unk>", "drugs_hist:D2", "drugs_hist:D3",
                                                               "c3", "procedures:p1"]
    assert len(item["codes"]["ids"]) == sum(len(item[f]["ids"]) for f in codec.task.samples.features)  # no code lost or added
    batch = codec.collate(codec.encode(frame))
    assert batch["codes_mask"].tolist() == [[True] * 6] and "codes" in batch["tokens"]
    assert codec.sequences == ("conditions", "procedures", "drugs_hist", "codes")
    assert history_codec(get_task("drug_rec"), vocabs, labels, 2, 128).sequences == (
        "conditions", "procedures", "drugs_hist")


def test_missing_column_is_a_clear_error():
    with pytest.raises(ValueError, match="lacks column.*drugs_hist"):
        bundle_for("transformer").encode(drug_rec_frame().drop("drugs_hist"))


def test_behrt_sequence_reproduces_the_samples_flattening():
    row = next_visit_frame(1).to_dicts()[0]
    assert split_flat_codes(row["codes"]) == row["visits"]
    tokens, ages, segments, positions = behrt_sequence([[("visits", c) for c in v] for v in row["visits"]],
                                                       row["ages"], max_len=128)
    assert [t if isinstance(t, str) else t[1] for t in tokens] == row["codes"]
    assert segments == row["segments"] and positions == row["positions"]
    assert ages == [a + 1 for a in row["ages_flat"]]  # id 0 is reserved for 'age unknown'


def test_behrt_sequence_drops_oldest_visits_first():
    tokens, _, segments, positions = behrt_sequence([[("f", "a"), ("f", "b")], [("f", "c")]], None, max_len=4)
    assert [t if isinstance(t, str) else t[1] for t in tokens] == [CLS, "c", SEP]
    assert positions == [1, 1, 1] and segments == [0, 1, 1]


# ----------------------------------------------------------------------------------------------- training


def overfit(bundle, batch: dict, steps: int, lr: float = 1e-2) -> tuple[float, float]:
    optimizer = torch.optim.AdamW(bundle.model.parameters(), lr=lr, weight_decay=0.0)
    bundle.model.train()
    first = last = None
    for _ in range(steps):
        loss = bundle.model(batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        first = float(loss.detach()) if first is None else first
        last = float(loss.detach())
    return first, last


@pytest.mark.parametrize("name", ehr_neural_models())
def test_each_model_overfits_a_handful_of_drug_rec_samples(name):
    bundle = bundle_for(name)
    batch = batch_of(bundle, drug_rec_frame())
    first, last = overfit(bundle, batch, steps=150)
    assert last < 0.05 * first, (name, first, last)
    bundle.model.eval()
    with torch.no_grad():
        probs = bundle.predict_proba(bundle.model, batch)
    assert probs.shape == batch["labels"].shape
    assert ((probs > 0.5).float() == batch["labels"]).float().mean() > 0.95


@pytest.mark.parametrize(("name", "task"), [("behrt", "next_visit"), ("transformer_rope", "next_visit"),
                                            ("transformer", "readmission"), ("lstm", "readmission")])
def test_other_tasks_overfit(name, task):
    bundle = bundle_for(name, task)
    batch = batch_of(bundle, FRAMES[task]())
    first, last = overfit(bundle, batch, steps=120)
    assert last < 0.1 * first, (name, task, first, last)
    assert batch["labels"].shape[1] == (1 if task == "readmission" else len(CONDS))


@pytest.mark.parametrize("name", ["transformer", "transformer_rope", "behrt", "seq2seq"])
def test_attention_shapes_and_rows_sum_to_one_over_real_keys(name):
    bundle = bundle_for(name, n_layers=2) if name != "seq2seq" else bundle_for(name)
    batch = batch_of(bundle, drug_rec_frame())
    bundle.model.eval()
    with torch.no_grad():
        out = bundle.model(batch, output_attentions=True)
    assert out.attentions and set(out.attentions) == set(out.attention_tokens)
    for module, layers in out.attentions.items():
        q_tokens, k_tokens = out.attention_tokens[module]
        assert len(layers) == (2 if name != "seq2seq" else 1)
        for w in layers:
            assert w.shape[:2] == (8, 2)
            for i in range(8):
                nq, nk = len(q_tokens[i]), len(k_tokens[i])
                assert 0 < nq <= w.shape[2] and 0 < nk <= w.shape[3]
                torch.testing.assert_close(w[i, :, :nq, :nk].sum(-1), torch.ones(2, nq))
                assert float(w[i, :, :nq, nk:].abs().sum()) == 0.0  # padding keys get no weight
    if name == "seq2seq":  # causal: no decoder position looks ahead
        assert float(out.attentions["decoder_self"][0].triu(1).abs().sum()) == 0.0


@pytest.mark.parametrize("name", ehr_neural_models())
def test_padding_does_not_change_outputs(name):
    bundle = bundle_for(name)
    frame = drug_rec_frame()
    items = bundle.encode(frame)
    longest = max(range(len(items)), key=lambda i: len(str(items[i])))
    shortest = min(range(len(items)), key=lambda i: len(str(items[i])))
    bundle.model.eval()
    with torch.no_grad():
        alone = bundle.model(bundle.collate([items[shortest]])).logits
        padded = bundle.model(bundle.collate([items[shortest], items[longest]])).logits[:1]
    torch.testing.assert_close(alone, padded, atol=1e-5, rtol=1e-4)


def test_rope_scores_depend_only_on_relative_position():
    rotary = RotaryEmbedding(head_dim=8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        return float((rotary(q, torch.tensor([[m]])) * rotary(k, torch.tensor([[n]]))).sum())

    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(0, 5) == pytest.approx(score(7, 12), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)  # but it does depend on the distance
    torch.testing.assert_close(rotary(q, torch.tensor([[0]])), q)  # position 0 = identity
    torch.testing.assert_close(rotary(q, torch.tensor([[9]])).norm(), q.norm())  # rotations keep lengths


def test_rope_model_adds_no_positions_but_the_plain_one_does():
    rope, plain = bundle_for("transformer_rope").model, bundle_for("transformer").model
    assert all(enc.positions is None and enc.rotary is not None for enc in rope.encoders.values())
    assert all(enc.positions is not None and enc.rotary is None for enc in plain.encoders.values())


# ----------------------------------------------------------------------------------------------- BEHRT MLM


def test_mlm_masking_proportions_and_specials():
    bundle = bundle_for("behrt")
    cfg = bundle.config
    n_codes = cfg.n_codes
    ids = torch.randint(2, n_codes, (200, 100))
    index = behrt_codec(get_task("drug_rec"), {f: vocab(FEATURE_TOKENS[f]) for f in ("conditions", "procedures",
                                                                          "drugs_hist")},
                        LabelSpace.from_vocab(vocab(DRUGS), False), 128).index
    cls_id, sep_id = index.special(CLS), index.special(SEP)
    assert cfg.mask_id == index.special("[MASK]") and n_codes == index.n_codes
    ids[:, 0], ids[:, 50], ids[:, 90:] = cls_id, sep_id, 0  # a special, a separator, padding
    masked, labels = mask_tokens(ids, cfg, torch.Generator().manual_seed(0))
    selected = labels != -100
    maskable = (ids >= 2) & (ids < n_codes)
    assert not selected[~maskable].any()  # [CLS], [SEP], padding are never selected
    rate = selected.sum() / maskable.sum()
    assert 0.14 < rate < 0.16
    assert torch.equal(labels[selected], ids[selected])
    to_mask = (masked[selected] == cfg.mask_id).float().mean()
    unchanged = (masked[selected] == ids[selected]).float().mean()
    assert 0.77 < to_mask < 0.83 and 0.08 < unchanged < 0.13  # 10% kept (+ random draws equal to the original)
    assert ((masked[selected] >= 2) & (masked[selected] < n_codes) | (masked[selected] == cfg.mask_id)).all()
    assert torch.equal(masked[~selected], ids[~selected])


def test_mlm_masks_at_least_one_code_per_sequence():
    cfg = bundle_for("behrt").config
    ids = torch.tensor([[cfg.n_codes, 5, cfg.n_codes + 1, 0, 0]] * 50)  # [CLS] code [SEP] pad pad
    _, labels = mask_tokens(ids, cfg, torch.Generator().manual_seed(1))
    assert ((labels != -100).sum(1) == 1).all() and (labels[:, 1] == 5).all()


def test_behrt_pretraining_uses_the_shared_trainer_on_train_items(tmp_path):
    from medtx.training.trainer import TrainConfig

    bundle = bundle_for("behrt", "next_visit")
    items = bundle.encode(next_visit_frame(12))
    before = bundle.model.behrt.embeddings.code.weight.detach().clone()
    cfg = TrainConfig(epochs=3, batch_size=4, lr=1e-2, patience=5, device="cpu", progress=False)
    result = pretrain_mlm(bundle.mlm, items[:8], items[8:], cfg, tmp_path / "pretrain")
    assert (result.best_dir / "model.safetensors").exists() and len(result.history) == 3
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert not torch.equal(before, bundle.model.behrt.embeddings.code.weight.detach())  # shared module updated
    # validation masks are fixed (a stable early-stopping signal); training masks are redrawn per call
    val = fixed_masks(items[8:], bundle.config, seed=0)
    assert val == fixed_masks(items[8:], bundle.config, seed=0)
    collate = MLMCollator(behrt_codec(get_task("next_visit"), {"visits": vocab(CONDS)},
                                      LabelSpace.from_vocab(vocab(CONDS), False), 128).collate, bundle.config)
    batch = collate(items[:8])
    assert "labels" not in batch and batch["mlm_labels"].shape == batch["input_ids"].shape
    out = BehrtForMaskedLM(bundle.model.behrt)(batch)  # scores on the masked positions only
    n_masked = int((batch["mlm_labels"] != -100).sum())
    assert out.logits.shape == (n_masked, bundle.config.vocab_size) and n_masked > 0 and out.loss > 0
    unlabelled = BehrtForMaskedLM(bundle.model.behrt)({k: v for k, v in batch.items() if k != "mlm_labels"})
    assert unlabelled.loss is None and unlabelled.logits.shape == (*batch["input_ids"].shape, bundle.config.vocab_size)


# ----------------------------------------------------------------------------------------------- seq2seq


def tiny_seq2seq(seed: int = 0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    return Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=12, tgt_vocab_size=9, max_decode_len=6, **TINY_S2S)).eval()


def test_greedy_equals_beam_of_one():
    model = tiny_seq2seq()
    src = torch.randint(1, 12, (5, 7))
    mask = torch.ones_like(src, dtype=torch.bool)
    mask[2, 4:] = False
    greedy = greedy_decode(model, src, mask)
    assert greedy.sequences == beam_search(model, src, mask, beam_size=1).sequences
    assert greedy.step_probs.shape[:2] == (5, len(greedy.step_probs[0]))


def test_decoding_stops_at_eos():
    model = tiny_seq2seq()
    with torch.no_grad():
        model.out.bias.zero_()
        model.out.bias[model.config.eos_id] = 50.0  # the decoder now always says <eos> first
    src = torch.randint(1, 12, (3, 4))
    mask = torch.ones_like(src, dtype=torch.bool)
    greedy = greedy_decode(model, src, mask)
    assert greedy.sequences == [[], [], []] and greedy.step_probs.shape[1] == 1  # one step, then stop
    assert beam_search(model, src, mask, beam_size=3).sequences == [[], [], []]
    with torch.no_grad():  # favour token 5 then <eos>: generation is cut at <eos>, never runs to max_len
        model.out.bias[model.config.eos_id] = 0.0
        model.out.bias[5] = 50.0
    assert greedy_decode(model, src, mask).sequences == [[5] * 6] * 3  # no <eos>: stops at max_decode_len


def test_seq2seq_learns_to_generate_the_label_sets():
    bundle = bundle_for("seq2seq")
    frame = drug_rec_frame()
    batch = batch_of(bundle, frame)
    overfit(bundle, batch, steps=150)
    bundle.model.eval()
    with torch.no_grad():
        generated = bundle.generate(bundle.model, batch)
    assert generated == frame["drugs"].to_list()  # target order = label-vocabulary order (here sorted)


# ----------------------------------------------------------------------------------------------- registry


def test_registry_rejects_bad_names_tasks_and_overrides():
    with pytest.raises(ValueError, match="unknown neural EHR model"):
        bundle_for("gpt")
    with pytest.raises(ValueError, match="does not support task"):
        required_features("seq2seq", get_task("next_visit"))
    with pytest.raises(ValueError, match="has no field.*d_modle"):
        bundle_for("transformer", d_modle=8)
    with pytest.raises(ValueError, match="cannot be overridden"):
        bundle_for("transformer", n_labels=3)
    assert set(model_tasks()) == set(ehr_neural_models())


def test_checkpoint_roundtrip_through_the_trainer_and_vocab_mismatch(tmp_path):
    from medtx.training.trainer import TrainConfig, fit, predict

    bundle = bundle_for("transformer")
    items = bundle.encode(drug_rec_frame(12))
    cfg = TrainConfig(epochs=2, batch_size=4, device="cpu", progress=False)
    result = fit(bundle.model, items[:8], items[8:], bundle.collate, cfg, tmp_path)
    vocabs = {f: vocab(FEATURE_TOKENS[f]) for f in required_features("transformer", get_task("drug_rec"))}
    loaded = load_ehr_model("transformer", get_task("drug_rec"), vocabs, vocab(DRUGS), result.best_dir)
    assert loaded.config.d_model == 16  # rebuilt from config.json, not the defaults
    shown = predict(loaded.model, items[8:], loaded.collate, "cpu", output_attentions=True)
    original = predict(bundle.model, items[8:], bundle.collate, "cpu")
    torch.testing.assert_close(torch.tensor(shown.probs), torch.tensor(original.probs))
    weights, q_tokens, _ = shown.attentions[0]["codes"]  # drug_rec's transformer: one joint sequence
    assert q_tokens[0] == "[CLS]" and weights.sum(-1) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="vocab/label mismatch"):
        load_ehr_model("transformer", get_task("drug_rec"), vocabs, vocab(DRUGS[:5]), result.best_dir)


def test_transformer_pooling_options():
    """Label attention (default) and mean pooling both fit; an unknown pooling is a clear error."""
    from medtx.models.layers import LabelAttentionPooling

    assert isinstance(bundle_for("transformer").model.head, LabelAttentionPooling)
    bundle = bundle_for("transformer", pooling="mean")
    assert isinstance(bundle.model.head, torch.nn.Linear)
    first, last = overfit(bundle, batch_of(bundle, drug_rec_frame()), steps=150)
    assert last < 0.05 * first, (first, last)
    with pytest.raises(ValueError, match="pooling"):
        bundle_for("transformer", pooling="max")


@pytest.mark.parametrize("pooling", ["label_attention", "mean"])
def test_transformer_output_bias_starts_at_training_label_frequencies(pooling):
    bundle = bundle_for("transformer", pooling=pooling, copy_feature=None)
    items = bundle.encode(drug_rec_frame(12))
    bundle.init_from_train(items)
    labels = bundle.collate(items)["labels"]
    expected = (labels.sum(0) + 0.5) / (labels.shape[0] + 1.0)
    torch.testing.assert_close(torch.sigmoid(bundle.model.head.bias.detach()), expected)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_recurrent_output_bias_starts_at_training_label_frequencies(cell):
    """The recurrent baselines start at the label prior as the Transformer does (without it, next_visit GRU on
    synth_2000 ended 5 epochs at val PR-AUC 0.050, under the most-frequent baseline), from items or an
    EncodedSet alike, and the first loss is the prior's, not log 2."""
    from medtx.models.encoded import EncodedSet

    bundle = bundle_for(cell)
    items = bundle.encode(drug_rec_frame(12))
    labels = bundle.collate(items)["labels"]
    expected = (labels.sum(0) + 0.5) / (labels.shape[0] + 1.0)
    before = bundle.model(bundle.collate(items)).loss.item()
    bundle.init_from_train(EncodedSet(items, bundle.collate))
    torch.testing.assert_close(torch.sigmoid(bundle.model.head.bias.detach()), expected)
    after = bundle.model.eval()(bundle.collate(items)).loss.item()
    prior = torch.nn.functional.binary_cross_entropy(expected.expand_as(labels), labels.float()).item()
    assert after < before and abs(after - prior) < 0.5 * abs(before - prior), (before, after, prior)
    again = bundle_for(cell)
    again.init_from_train(items)
    torch.testing.assert_close(again.model.head.bias, bundle.model.head.bias)


def copy_frame(n: int, seed: int) -> pl.DataFrame:
    """drug_rec rows (2-3 visits) whose label set IS the previous visit's drugs; other codes random."""
    rng = random.Random(seed)
    rows = []
    for s in range(n):
        visits = rng.randint(2, 3)
        drugs_hist = [sorted(rng.sample(DRUGS, rng.randint(1, 4))) for _ in range(visits - 1)] + [[]]
        rows.append({"subject_id": s, "hadm_id": 100 + s,
                     "conditions": [rng.sample(CONDS, rng.randint(1, 4)) for _ in range(visits)],
                     "procedures": [rng.sample(PROCS, rng.randint(1, 2)) for _ in range(visits)],
                     "drugs_hist": drugs_hist, "drugs": drugs_hist[-2]})
    return pl.DataFrame(rows)


def test_copy_gate_is_on_for_drug_rec_by_default_and_configurable():
    from medtx.models.layers import DrugCopyGate

    for name in ("transformer", "transformer_rope"):  # one implementation, shared
        assert isinstance(bundle_for(name).model.copy, DrugCopyGate)
        assert bundle_for(name, copy_feature=None).model.copy is None
    assert bundle_for("transformer", "readmission").model.copy is None  # no drug-history -> label mapping there
    with pytest.raises(ValueError, match="copy_feature='drugs_hist' is not one of"):
        bundle_for("transformer", "readmission", copy_feature="drugs_hist")
    with pytest.raises(ValueError, match="copy_recencies"):
        bundle_for("transformer", copy_recencies=())
    # next_visit can copy the current visit's diagnoses (recency 0) into the next visit's label set
    assert bundle_for("transformer", "next_visit", copy_feature="visits", copy_recencies=(0,)).model.copy is not None


def test_copy_gate_marks_the_previous_visits_drugs():
    bundle = bundle_for("transformer", copy_recencies=(1, 2), max_visits=20)  # drug_rec keeps 2 by default
    frame = drug_rec_frame(8)
    present = bundle.model.copy_presence(batch_of(bundle, frame))
    for row, history in enumerate(frame["drugs_hist"].to_list()):
        for k, recency in enumerate((1, 2)):
            expected = set(history[-1 - recency]) if len(history) > recency else set()
            assert {DRUGS[j] for j in present[row, k].nonzero().flatten().tolist()} == expected, (row, recency)


def test_copy_gate_starts_at_the_copy_log_odds_and_ranks_copied_labels_first():
    """Label == previous visit's drugs: with the gate, training data alone gives near-perfect ranking on
    unseen patients; the same tiny model without the gate, after the same training, does not get there."""
    from medtx.metrics.multilabel import pr_auc_samples

    train, test = copy_frame(24, seed=3), copy_frame(24, seed=4)
    scores = {}
    for copy_feature in ("drugs_hist", None):
        torch.manual_seed(0)
        bundle = bundle_for("transformer", copy_feature=copy_feature)
        items = bundle.encode(train)
        bundle.init_from_train(items)
        if copy_feature:
            assert float(bundle.model.copy.weight.detach().min()) > 1.0  # copied labels: log-odds ratio far above 0
        overfit(bundle, bundle.collate(items), steps=30)
        bundle.model.eval()
        batch = batch_of(bundle, test)
        with torch.no_grad():
            probs = bundle.predict_proba(bundle.model, batch)
        scores[copy_feature] = pr_auc_samples(batch["labels"].numpy(), probs.numpy())
    assert scores["drugs_hist"] > 0.95, scores
    assert scores[None] < scores["drugs_hist"] - 0.05, scores


def test_checkpoint_without_pooling_field_loads_as_mean_pooling(tmp_path):
    """Transformer checkpoints written before the pooling option (mean pooling) still load."""
    import json

    from medtx.training.trainer import TrainConfig, fit, predict

    bundle = bundle_for("transformer", pooling="mean")
    items = bundle.encode(drug_rec_frame(12))
    cfg = TrainConfig(epochs=1, batch_size=4, device="cpu", progress=False)
    result = fit(bundle.model, items[:8], items[8:], bundle.collate, cfg, tmp_path)
    config_file = result.best_dir / "config.json"
    saved = json.loads(config_file.read_text())
    del saved["model"]["pooling"]
    config_file.write_text(json.dumps(saved))
    vocabs = {f: vocab(FEATURE_TOKENS[f]) for f in required_features("transformer", get_task("drug_rec"))}
    loaded = load_ehr_model("transformer", get_task("drug_rec"), vocabs, vocab(DRUGS), result.best_dir)
    assert loaded.config.pooling == "mean"
    torch.testing.assert_close(torch.tensor(predict(loaded.model, items[8:], loaded.collate, "cpu").probs),
                               torch.tensor(predict(bundle.model, items[8:], bundle.collate, "cpu").probs))


def test_checkpoint_from_before_the_copy_gate_loads_without_it(tmp_path):
    import json

    from medtx.training.trainer import TrainConfig, fit

    bundle = bundle_for("transformer", copy_feature=None)
    items = bundle.encode(drug_rec_frame(12))
    result = fit(bundle.model, items[:8], items[8:], bundle.collate,
                 TrainConfig(epochs=1, batch_size=4, device="cpu", progress=False), tmp_path)
    saved = json.loads((result.best_dir / "config.json").read_text())
    del saved["model"]["copy_feature"], saved["model"]["copy_recencies"]
    (result.best_dir / "config.json").write_text(json.dumps(saved))
    vocabs = {f: vocab(FEATURE_TOKENS[f]) for f in required_features("transformer", get_task("drug_rec"))}
    assert load_ehr_model("transformer", get_task("drug_rec"), vocabs, vocab(DRUGS), result.best_dir).model.copy is None


@pytest.mark.parametrize("name", ["transformer", "transformer_rope"])
def test_joint_sequence_is_one_encoder_over_every_features_codes(name):
    """joint_sequence: one encoder (batch keys `codes_*`) instead of one per feature; it fits, ignores padding, exports
    attention over the joint tokens, and within a visit the order of codes carries nothing (positions are visits)."""
    per_feature = bundle_for(name, joint_sequence=False).model
    assert set(per_feature.encoders) == {"conditions", "procedures", "drugs_hist"}
    bundle = bundle_for(name, joint_sequence=True)
    assert set(bundle.model.encoders) == {"codes"} and bundle.model.head.query.shape[0] == 1
    assert bundle.config.vocab_sizes["codes"] == 2 + len(CONDS) + len(PROCS) + len(DRUGS)
    batch = batch_of(bundle, drug_rec_frame())
    first, last = overfit(bundle, batch, steps=150)
    assert last < 0.05 * first, (first, last)
    bundle.model.eval()
    with torch.no_grad():
        out = bundle.model(batch, output_attentions=True)
        reversed_batch = dict(batch)
        n = batch["codes_mask"].sum(1)
        order = torch.stack([torch.cat([torch.arange(k).flip(0), torch.arange(k, batch["codes_ids"].shape[1])])
                             for k in n.tolist()])
        for key in ("codes_ids", "codes_visit", "codes_mask"):
            reversed_batch[key] = batch[key].gather(1, order)
        torch.testing.assert_close(bundle.model(reversed_batch).logits, out.logits, atol=1e-5, rtol=1e-4)
    assert set(out.attentions) == {"codes"}
    q_tokens, _ = out.attention_tokens["codes"]
    assert q_tokens[0][0] == "[CLS]" and any(t.split(":")[1] == "procedures" for t in q_tokens[0][1:])
    with pytest.raises(ValueError, match="vocab_sizes\\['codes'\\]"):
        type(bundle.model)(dataclasses.replace(bundle.config, vocab_sizes={
            f: v for f, v in bundle.config.vocab_sizes.items() if f != "codes"}), [-1] * len(DRUGS + ["", ""]))


def test_checkpoint_from_before_the_joint_sequence_loads_with_one_encoder_per_feature(tmp_path):
    """drug_rec's transformer reads one joint sequence by default; a checkpoint written before that option (per-feature
    encoders, no `joint_sequence` field) still loads as what it was and predicts as before."""
    import json

    from medtx.training.trainer import TrainConfig, fit, predict

    assert bundle_for("transformer").config.joint_sequence  # the drug_rec default
    bundle = bundle_for("transformer", joint_sequence=False)
    items = bundle.encode(drug_rec_frame(12))
    result = fit(bundle.model, items[:8], items[8:], bundle.collate,
                 TrainConfig(epochs=1, batch_size=4, device="cpu", progress=False), tmp_path)
    saved = json.loads((result.best_dir / "config.json").read_text())
    del saved["model"]["joint_sequence"]
    (result.best_dir / "config.json").write_text(json.dumps(saved))
    vocabs = {f: vocab(FEATURE_TOKENS[f]) for f in required_features("transformer", get_task("drug_rec"))}
    loaded = load_ehr_model("transformer", get_task("drug_rec"), vocabs, vocab(DRUGS), result.best_dir)
    assert not loaded.config.joint_sequence and set(loaded.model.encoders) == {"conditions", "procedures", "drugs_hist"}
    torch.testing.assert_close(torch.tensor(predict(loaded.model, items[8:], loaded.collate, "cpu").probs),
                               torch.tensor(predict(bundle.model, items[8:], bundle.collate, "cpu").probs))


# ----------------------------------------------------------------------------------------------- BEHRT head


@pytest.mark.parametrize("pooling", ["cls", "mean", "label_attention"])
def test_behrt_poolings_overfit_and_ignore_padding(pooling):
    bundle = bundle_for("behrt", "next_visit", pooling=pooling, copy_recencies=())
    items = bundle.encode(next_visit_frame(6))
    first, last = overfit(bundle, bundle.collate(items), steps=120)
    assert last < 0.1 * first, (pooling, first, last)
    bundle.model.eval()
    short, long = min(items, key=lambda it: len(it["input_ids"])), max(items, key=lambda it: len(it["input_ids"]))
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(bundle.collate([short])).logits,
                                   bundle.model(bundle.collate([short, long])).logits[:1], atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="pooling"):
        bundle_for("behrt", "next_visit", pooling="max")


def test_behrt_attention_dropout_is_its_own_setting_and_defaults_to_dropout():
    """BERT drops attention weights at the model's dropout; `attention_dropout` sets them apart (0 lets training
    run torch's fused attention), and every other dropout keeps `dropout`."""
    from medtx.models.layers import MultiHeadAttention

    def rates(model):
        attention = {m.dropout.p for m in model.modules() if isinstance(m, MultiHeadAttention)}
        others = {m.p for name, m in model.named_modules() if type(m).__name__ == "Dropout" and ".attn." not in name}
        return attention, others

    assert rates(bundle_for("behrt", "next_visit", copy_recencies=(), dropout=0.1).model) == ({0.1}, {0.1})
    assert rates(bundle_for("behrt", "next_visit", copy_recencies=(), dropout=0.1, attention_dropout=0.0).model
                 ) == ({0.0}, {0.1})


def test_behrt_copy_gate_marks_the_current_visits_codes_and_starts_at_the_copy_log_odds():
    """next_visit rows whose label IS the current visit's diagnoses: the copy gate finds them (recency 0 =
    the last visit of the BEHRT sequence) and, from training data alone, ranks them first on unseen rows."""
    from medtx.metrics.multilabel import pr_auc_samples

    def frame(n: int, seed: int) -> pl.DataFrame:
        rows = next_visit_frame(n, seed).to_dicts()
        return pl.DataFrame([{**r, "label": sorted(r["visits"][-1])} for r in rows])

    bundle = bundle_for("behrt", "next_visit", copy_recencies=(0, 1))
    train = frame(24, seed=3)
    batch = batch_of(bundle, train)
    present = bundle.model.copy_presence(batch)
    for row, visits in enumerate(train["visits"].to_list()):
        assert {CONDS[j] for j in present[row, 0].nonzero().flatten().tolist()} == set(visits[-1])
        assert {CONDS[j] for j in present[row, 1].nonzero().flatten().tolist()} == set(
            visits[-2] if len(visits) > 1 else [])
    bundle.init_from_train(bundle.encode(train))
    assert float(bundle.model.copy.weight.detach()[0].min()) > 1.0  # current-visit codes: strong positive start
    bundle.model.eval()
    test = batch_of(bundle, frame(24, seed=4))
    with torch.no_grad():
        assert pr_auc_samples(test["labels"].numpy(), bundle.predict_proba(bundle.model, test).numpy()) > 0.95
    with pytest.raises(ValueError, match="copy_feature"):  # three features: which one copies must be named
        bundle_for("behrt", "drug_rec", copy_feature=None, copy_recencies=(1,))
    assert bundle_for("behrt", "drug_rec").model.copy is not None  # registry default: previous visit's drugs
    assert bundle_for("behrt", "next_visit").model.copy is not None  # registry default: current visit's codes
    assert bundle_for("behrt", "readmission").model.copy is None


def test_behrt_output_bias_starts_at_training_label_frequencies_when_asked():
    bundle = bundle_for("behrt", "next_visit", init_bias=True, copy_recencies=())
    items = bundle.encode(next_visit_frame(12))
    bundle.init_from_train(items)
    labels = bundle.collate(items)["labels"]
    torch.testing.assert_close(torch.sigmoid(bundle.model.head.bias.detach()),
                               (labels.sum(0) + 0.5) / (labels.shape[0] + 1.0))
    plain = bundle_for("behrt", "next_visit", init_bias=False, copy_recencies=())
    plain.init_from_train(items)  # the paper's model: no data-dependent start
    assert float(plain.model.head.bias.detach().abs().max()) < 1.0


def test_behrt_checkpoint_from_before_the_head_options_loads_as_the_cls_model(tmp_path):
    import json

    from medtx.training.trainer import TrainConfig, fit

    bundle = bundle_for("behrt", "next_visit", pooling="cls", copy_recencies=())
    items = bundle.encode(next_visit_frame(12))
    result = fit(bundle.model, items[:8], items[8:], bundle.collate,
                 TrainConfig(epochs=1, batch_size=4, device="cpu", progress=False), tmp_path)
    saved = json.loads((result.best_dir / "config.json").read_text())
    for key in ("pooling", "init_bias", "copy_feature", "copy_recencies"):
        del saved["model"][key]
    (result.best_dir / "config.json").write_text(json.dumps(saved))
    loaded = load_ehr_model("behrt", get_task("next_visit"), {"visits": vocab(CONDS)}, vocab(CONDS), result.best_dir)
    assert loaded.config.pooling == "cls" and loaded.model.copy is None


# test_models_train_under_cuda_bf16_autocast lives in tests/test_cuda.py: no polars there, so it runs on the GPU image.


# ----------------------------------------------------------------------------------------------- real samples

def test_every_model_reads_the_real_demo_sample_tables(demo_db):  # noqa: F811
    """Every (model, task) encodes the demo's samples.* rows with its samples.vocab and runs forward."""
    from medtx.store.db import open_warehouse
    from medtx.samples.vocab import load_vocab

    with open_warehouse(demo_db, read_only=True) as con:
        for name, tasks in model_tasks().items():
            for task in tasks:
                spec = get_task(task)
                frame = con.sql(f"SELECT * FROM samples.{spec.table} WHERE dataset = 'mimic3_demo'").pl()
                assert frame.height > 0, task
                vocabs = {f: load_vocab(con, "mimic3_demo", task, f) for f in required_features(name, spec)}
                label = spec.samples.label_feature
                bundle = build_ehr_model(name, spec, vocabs, load_vocab(con, "mimic3_demo", task, label)
                                         if label else None, tiny(name))
                batch = bundle.collate(bundle.encode(frame))
                bundle.model.eval()
                with torch.no_grad():
                    out = bundle.model(batch, output_attentions=True)
                assert out.logits.shape == batch["labels"].shape == (frame.height, len(bundle.label_names))
                assert torch.isfinite(out.loss), (name, task)
                assert batch["labels"].sum() > 0, (name, task)  # labels really map onto the vocabulary
