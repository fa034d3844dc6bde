"""The shared trainer: overfits a tiny problem, early-stops, checkpoints, resumes, and fails clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from medtx.models.base import ModelOutput
from medtx.training.trainer import TrainConfig, fit, predict, resolve_device


class BagOfCodes(nn.Module):
    """A minimal real model obeying the ModelOutput contract: embedding bag + linear multi-label head."""

    def __init__(self, n_codes: int, n_labels: int):
        super().__init__()
        self.config = {"n_codes": n_codes, "n_labels": n_labels}
        self.emb = nn.EmbeddingBag(n_codes, 16, mode="mean", padding_idx=0)
        self.head = nn.Linear(16, n_labels)

    def forward(self, batch, output_attentions=False):
        logits = self.head(self.emb(batch["codes"]))
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch["labels"]) if "labels" in batch else None
        return ModelOutput(logits=logits, loss=loss)


def collate(items):
    width = max(len(i["codes"]) for i in items)
    codes = torch.tensor([i["codes"] + [0] * (width - len(i["codes"])) for i in items])
    return {"codes": codes, "labels": torch.tensor([i["y"] for i in items], dtype=torch.float32),
            "sample_id": [i["id"] for i in items]}


def make_items(n: int, n_labels: int = 3, seed: int = 0):
    """Label j is on exactly when code j+2 is present: learnable, so loss must fall."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        on = rng.random(n_labels) < 0.5
        codes = [j + 2 for j in range(n_labels) if on[j]] or [1]
        items.append({"codes": codes, "y": on.astype(float).tolist(), "id": f"s{i}"})
    return items


def score(y_true, y_prob):
    return {"acc": float(((y_prob >= 0.5) == (y_true >= 0.5)).mean())}


def test_fit_overfits_and_keeps_best(tmp_path: Path):
    items = make_items(16)
    model = BagOfCodes(6, 3)
    cfg = TrainConfig(epochs=60, batch_size=8, lr=0.05, patience=100, num_threads=1)
    seen = []
    result = fit(model, items, items, collate, cfg, tmp_path, score=score,
                 on_epoch=lambda e, m: seen.append((e, m["train_loss"])))
    losses = [h["train_loss"] for h in result.history]
    assert losses[-1] < 0.1 * losses[0]
    assert len(seen) == 60 and result.device == "cpu"
    for name in ("config.json", "model.safetensors", "trainer_state.json"):
        assert (result.best_dir / name).exists() and (result.last_dir / name).exists()
    assert json.loads((result.best_dir / "config.json").read_text())["model"] == {"n_codes": 6, "n_labels": 3}
    preds = predict(model, items, collate, "cpu")
    assert preds.probs.shape == (16, 3) and preds.sample_ids[:2] == ["s0", "s1"]
    assert score(preds.y_true, preds.probs)["acc"] == 1.0


def test_early_stopping_on_score(tmp_path: Path):
    items = make_items(16)
    cfg = TrainConfig(epochs=50, batch_size=8, lr=0.05, patience=2, monitor="acc", num_threads=1)
    result = fit(BagOfCodes(6, 3), items, items, collate, cfg, tmp_path, score=score)
    assert result.stopped_early and len(result.history) < 50
    assert result.best_value == max(h["val_acc"] for h in result.history)


def test_resume_continues_like_an_uninterrupted_run(tmp_path: Path):
    items = make_items(16)
    full_cfg = TrainConfig(epochs=6, batch_size=4, lr=0.05, patience=100, num_threads=1)
    torch.manual_seed(0)
    full = fit(BagOfCodes(6, 3), items, items, collate, full_cfg, tmp_path / "full")
    # Interrupted after 3 epochs, then resumed to 6 with a freshly built model.
    torch.manual_seed(0)
    fit(BagOfCodes(6, 3), items, items, collate, TrainConfig(**{**full_cfg.__dict__, "epochs": 3}), tmp_path / "r")
    resumed = fit(BagOfCodes(6, 3), items, items, collate, full_cfg, tmp_path / "r", resume=True)
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([h["train_loss"] for h in resumed.history],
                               [h["train_loss"] for h in full.history], rtol=1e-5)


def test_clear_errors(tmp_path: Path):
    items = make_items(4)
    cfg = TrainConfig(epochs=1, num_threads=1)
    with pytest.raises(ValueError, match="training split is empty"):
        fit(BagOfCodes(6, 3), [], items, collate, cfg, tmp_path)
    with pytest.raises(ValueError, match="validation split is empty"):
        fit(BagOfCodes(6, 3), items, [], collate, cfg, tmp_path)
    with pytest.raises(ValueError, match="label/vocab mismatch"):
        fit(BagOfCodes(6, 5), items, items, collate, cfg, tmp_path)


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fit_on_gpu_with_bf16_autocast(tmp_path: Path):
    items = make_items(16)
    cfg = TrainConfig(epochs=30, batch_size=8, lr=0.05, patience=100, device="cuda")
    result = fit(BagOfCodes(6, 3), items, items, collate, cfg, tmp_path)
    assert result.device.startswith("cuda")
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
