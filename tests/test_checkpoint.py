"""Checkpoint weights (medtx.models.checkpoint): tensors that share storage without being one tensor, as cuDNN
leaves an RNN's weights on CUDA, save and load; a tied weight is stored once and restored tied."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_model
from torch import nn

from medtx.models.checkpoint import load_weights, save_checkpoint, weights_epoch


class Packed(nn.Module):
    """Two parameters that are views of one flat buffer, neither covering it (cuDNN's flatten_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        flat = torch.arange(10, dtype=torch.float32)
        self.a = nn.Parameter(flat[:4])
        self.b = nn.Parameter(flat[4:])
        self.a.data = flat[:4]
        self.b.data = flat[4:]


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 3)
        self.decoder = nn.Linear(3, 5, bias=False)
        self.decoder.weight = self.embed.weight


def test_views_of_one_buffer_save_and_load(tmp_path):
    model = Packed()
    assert model.a.untyped_storage().data_ptr() == model.b.untyped_storage().data_ptr()
    with pytest.raises(RuntimeError, match="no suitable name to keep"):  # what safetensors' own save_model does
        save_model(model, str(tmp_path / "refused.safetensors"))
    save_checkpoint(model, tmp_path, {"model": {}}, {"epoch": 3})
    assert weights_epoch(tmp_path) == 3
    fresh = Packed()
    with torch.no_grad():
        fresh.a.zero_(), fresh.b.zero_()
    load_weights(fresh, tmp_path)
    assert fresh.a.tolist() == [0, 1, 2, 3] and fresh.b.tolist() == [4, 5, 6, 7, 8, 9]


def test_tied_weight_is_stored_once_and_stays_tied(tmp_path):
    from safetensors import safe_open

    model = Tied()
    save_checkpoint(model, tmp_path, {"model": {}}, {"epoch": 1})
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        assert sorted(f.keys()) == ["embed.weight"]
    fresh = Tied()
    load_weights(fresh, tmp_path)
    assert torch.equal(fresh.embed.weight, model.embed.weight)
    assert fresh.decoder.weight is fresh.embed.weight


def test_a_different_architecture_is_refused(tmp_path):
    save_checkpoint(Tied(), tmp_path, {"model": {}}, {"epoch": 1})
    with pytest.raises(RuntimeError, match="Missing key|Unexpected key|size mismatch"):
        load_weights(Packed(), tmp_path)
