"""The CUDA checks (marked `gpu`, skipped without CUDA). They import torch, pyarrow and medtx's model path only,
never polars or DuckDB, so `benchmarks/gpu/run.sh` runs them on a GPU machine whose image lacks those."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
import torch

from medtx.models.registry import build_ehr_model, model_names, required_features
from medtx.samples.tokens import Vocab
from medtx.tasks import get_task

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0}
TINY_RNN = {"d_model": 16, "hidden": 16, "dropout": 0.0}
TINY_S2S = {"d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32, "dropout": 0.0}
CONDS, PROCS, DRUGS = [f"c{i}" for i in range(20)], [f"p{i}" for i in range(10)], [f"D{i}" for i in range(8)]
TOKENS = {"conditions": CONDS, "procedures": PROCS, "drugs_hist": DRUGS}


def _tiny(name: str) -> dict:
    return TINY_S2S if name == "seq2seq" else TINY_RNN if name in ("rnn", "gru", "lstm", "retain") else TINY


def _frame(n: int = 8, seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    rows = []
    for s in range(n):
        visits = rng.randint(1, 3)
        rows.append({"subject_id": s, "hadm_id": 100 + s,
                     "conditions": [rng.sample(CONDS, rng.randint(1, 4)) for _ in range(visits)],
                     "procedures": [rng.sample(PROCS, rng.randint(1, 2)) for _ in range(visits)],
                     "drugs_hist": [rng.sample(DRUGS, 2) for _ in range(visits - 1)] + [[]],
                     "drugs": sorted(rng.sample(DRUGS, rng.randint(1, 3)))})
    return pa.Table.from_pylist(rows)


def _on_cuda(name: str):
    """A tiny drug_rec model of `name` on CUDA, and one collated batch there."""
    device = torch.device("cuda")
    vocabs = {f: Vocab(["<pad>", "<unk>", *TOKENS[f]]) for f in required_features(name, get_task("drug_rec"))}
    bundle = build_ehr_model(name, get_task("drug_rec"), vocabs, Vocab(["<pad>", "<unk>", *DRUGS]), _tiny(name))
    bundle.model.to(device)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v
             for k, v in bundle.collate(bundle.encode(_frame())).items()}
    return bundle.model, batch


@pytest.mark.parametrize("name", model_names("ehr"))
def test_models_train_under_cuda_bf16_autocast(name):
    from medtx.training.trainer import autocast_for

    model, batch = _on_cuda(name)
    with autocast_for(torch.device("cuda")):
        out = model(batch, output_attentions=True)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.logits.shape == batch["labels"].shape
    for layers in (out.attentions or {}).values():
        assert torch.isfinite(layers[0]).all()


@pytest.mark.parametrize("name", model_names("ehr"))
def test_checkpoint_round_trip_on_cuda(name, tmp_path):
    """On CUDA, cuDNN packs an RNN's weights into one flat buffer after a forward; the checkpoint still saves and
    loads (the first GPU run lost every rnn/gru/lstm/retain checkpoint to safetensors' save_model refusing it)."""
    from medtx.models.checkpoint import load_weights, save_checkpoint

    model, batch = _on_cuda(name)
    model(batch).loss.backward()
    save_checkpoint(model, tmp_path, {"model": {}}, {"epoch": 1})
    fresh, _ = _on_cuda(name)
    load_weights(fresh, tmp_path, "cuda")
    for (key, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), key


def test_fused_attention_avoids_cudnn_under_bf16():
    """Under bf16 autocast torch would pick cuDNN attention, which builds a plan per new (batch, length) shape:
    0.35-0.4 s of CPU per call on an H200, 25-40x slower training of the transformers (benchmarks/gpu/bf16_probe.py).
    medtx.models.layers keeps it off: no cuDNN attention op runs, over several lengths."""
    from torch.profiler import ProfilerActivity, profile

    from medtx.models.layers import MultiHeadAttention
    from medtx.training.trainer import autocast_for

    device = torch.device("cuda")
    attn = MultiHeadAttention(32, 4, dropout=0.0).to(device).train()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for length in (7, 13, 29):
            x = torch.randn(8, length, 32, device=device, requires_grad=True)
            mask = torch.ones(8, length, dtype=torch.bool, device=device)
            mask[:, -2:] = False
            with autocast_for(device):
                out, _ = attn(x, key_mask=mask, need_weights=False)
            out.float().sum().backward()
        torch.cuda.synchronize()
    names = {e.key for e in prof.key_averages()}
    assert not any("cudnn_attention" in n for n in names), sorted(n for n in names if "attention" in n)



def _bert_attention_ops(fixed: bool, device: torch.device | None = None) -> set[str]:
    """Profiled op names of three bf16-autocast training steps (lengths 7, 13, 29, padded rows) of a tiny BERT
    note classifier and of BERT's masked LM, both on transformers' own attention (SDPA). `fixed`: through medtx's
    modules (BertTextClassifier, MaskedLM); else the same transformers modules called directly (torch's default
    kernel choice, every backend allowed)."""
    from torch.profiler import ProfilerActivity, profile

    from medtx.models.bert_text import BertTextClassifier, BertTextConfig, load_encoder, scratch_config
    from medtx.text.mlm import MaskedLM
    from medtx.training.trainer import autocast_for

    device = device or torch.device("cuda")
    config = scratch_config(200, hidden=32, layers=1, heads=4, max_len=64)
    net = BertTextClassifier(load_encoder("scratch", config=config), BertTextConfig(n_outputs=3)).to(device).train()
    masked_lm = MaskedLM(config).to(device).train()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for length in (7, 13, 29):
            ids = torch.randint(5, 200, (6, length), device=device)
            mask = torch.ones(6, length, dtype=torch.long, device=device)
            mask[:, -2:] = 0
            labels = torch.full((6, length), -100, device=device)
            labels[:, 1] = ids[:, 1]
            with autocast_for(device):
                if fixed:
                    notes = {"labels": torch.tensor([0, 1, 2], device=device),
                             "chunk_note": torch.arange(6, device=device) // 2}  # 2 chunks per note
                    loss = net({"input_ids": ids, "attention_mask": mask, **notes}).loss
                    loss = loss + masked_lm({"input_ids": ids, "attention_mask": mask, "labels": labels}).loss
                else:
                    loss = net.encoder(input_ids=ids, attention_mask=mask).last_hidden_state.float().mean()
                    loss = loss + masked_lm.mlm(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.float().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
    return {e.key for e in prof.key_averages()}


def test_bert_attention_avoids_cudnn_under_bf16():
    """transformers' BertModel (the text models bert, minilm, bert_scratch; BERT's masked LM) calls torch's SDPA
    itself; medtx runs its encoder calls with cuDNN attention excluded (`fused_attention_kernels`), as it does its
    own attention: no cuDNN attention op runs (no plan built per new shape), over several lengths."""
    names = _bert_attention_ops(fixed=True)
    assert not any("cudnn_attention" in n for n in names), sorted(n for n in names if "attention" in n)
    assert any("attention" in n for n in names)  # the profile did see the attention ops


def test_bert_attention_unfixed_would_pick_cudnn_under_bf16():
    """The control: the same transformers modules called directly (every kernel allowed) run cuDNN attention on
    this torch, which is what the fix is for. If this fails, torch no longer picks it: the fix is moot, not wrong."""
    names = _bert_attention_ops(fixed=False)
    assert any("cudnn_attention" in n for n in names), sorted(n for n in names if "attention" in n)
