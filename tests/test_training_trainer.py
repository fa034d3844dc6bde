"""The shared trainer: overfits a tiny problem, early-stops, checkpoints, resumes, and fails clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from medtx.models.base import ModelOutput
from medtx.training.trainer import FitResult, TrainConfig, fit, predict, resolve_device


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


def resume_cfg(epochs: int) -> TrainConfig:
    return TrainConfig(epochs=epochs, batch_size=4, lr=0.05, patience=1000, num_threads=1)


def full_and_stopped(tmp_path: Path, epochs: int, stopped_after: int) -> tuple[list, FitResult]:
    """(items, an uninterrupted run of `epochs`) and, in tmp_path / "r", the same run stopped after `stopped_after`."""
    items = make_items(16)
    torch.manual_seed(0)
    full = fit(BagOfCodes(6, 3), items, items, collate, resume_cfg(epochs), tmp_path / "full")
    torch.manual_seed(0)
    fit(BagOfCodes(6, 3), items, items, collate, resume_cfg(stopped_after), tmp_path / "r")
    return items, full


def assert_same_training(resumed: FitResult, full: FitResult) -> None:
    np.testing.assert_allclose([h["train_loss"] for h in resumed.history],
                               [h["train_loss"] for h in full.history], rtol=1e-5)


def test_resume_continues_like_an_uninterrupted_run(tmp_path: Path):
    # Interrupted after 3 epochs, then resumed to 6 with a freshly built model.
    items, full = full_and_stopped(tmp_path, 6, 3)
    resumed = fit(BagOfCodes(6, 3), items, items, collate, resume_cfg(6), tmp_path / "r", resume=True)
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3, 4, 5, 6]
    assert_same_training(resumed, full)


def test_checkpoint_files_carry_their_epoch_and_leave_no_partial_file(tmp_path: Path):
    from medtx.models.checkpoint import weights_epoch

    items = make_items(16)
    result = fit(BagOfCodes(6, 3), items, items, collate, resume_cfg(3), tmp_path)
    assert weights_epoch(result.last_dir) == 3 and weights_epoch(result.best_dir) == result.best_epoch
    assert torch.load(result.last_dir / "optimizer.pt", weights_only=True)["epoch"] == 3
    assert json.loads((result.last_dir / "trainer_state.json").read_text())["epoch"] == 3
    assert not list(tmp_path.rglob("*.tmp"))  # every file renamed into place


class _Killed(BaseException):
    """Stands for a kill: raised between two checkpoint writes, caught by nothing in medtx."""


def test_resume_refuses_a_checkpoint_a_kill_left_between_two_writes(tmp_path: Path, monkeypatch):
    """A kill after any number of epoch 4's checkpoint writes: resume either continues from a consistent `last/`
    (no write done, or all of them) exactly like an uninterrupted run, or refuses in one clear line. It never trains
    on, silently, from new weights with an old optimizer or trainer state (or the other way round)."""
    import shutil

    import medtx.models.checkpoint as checkpoint
    import medtx.training.trainer as trainer

    items, full = full_and_stopped(tmp_path, 4, 3)
    cfg = resume_cfg(4)
    real = checkpoint.replace_file
    outcomes = []
    for allowed in range(8):  # epoch 4 writes best/ (3 files, when it improves), optimizer.pt, last/ (3 files)
        run = tmp_path / f"kill{allowed}"
        shutil.copytree(tmp_path / "r", run)
        done = []

        def write(path, fn, done=done, allowed=allowed):
            if len(done) == allowed:
                raise _Killed
            real(path, fn)
            done.append(path.name)

        monkeypatch.setattr(checkpoint, "replace_file", write)
        monkeypatch.setattr(trainer, "replace_file", write)
        try:
            fit(BagOfCodes(6, 3), items, items, collate, cfg, run, resume=True)
            killed = False
        except _Killed:
            killed = True
        monkeypatch.setattr(checkpoint, "replace_file", real)
        monkeypatch.setattr(trainer, "replace_file", real)
        if not killed:  # epoch 4 wrote everything before this kill point
            outcomes.append("complete")
            break
        try:
            resumed = fit(BagOfCodes(6, 3), items, items, collate, cfg, run, resume=True)
        except RuntimeError as exc:
            assert "cannot resume" in str(exc) and "train again without resume" in str(exc)
            outcomes.append("refused")
            continue
        outcomes.append("resumed")
        assert_same_training(resumed, full)
    assert outcomes[0] == "resumed" and outcomes[-1] == "complete"  # killed before any write; after all of them
    assert set(outcomes[1:-1]) == {"refused"}, outcomes  # every kill between two writes is caught


def test_a_checkpoint_from_before_the_epoch_stamps_still_resumes(tmp_path: Path):
    """`last/` written before the stamps (weights without metadata, optimizer.pt a bare state dict) resumes as
    before."""
    from safetensors.torch import load_file, save_file

    items, full = full_and_stopped(tmp_path, 4, 2)
    for folder in ("last", "best"):
        weights = tmp_path / "r" / folder / "model.safetensors"
        save_file(load_file(weights), weights)  # no metadata: no epoch stamp
    optimizer = tmp_path / "r" / "last" / "optimizer.pt"
    torch.save(torch.load(optimizer, weights_only=True)["optimizer"], optimizer)
    resumed = fit(BagOfCodes(6, 3), items, items, collate, resume_cfg(4), tmp_path / "r", resume=True)
    assert_same_training(resumed, full)


_TRAIN_FOREVER = """
import sys, torch
from pathlib import Path
from tests.test_training_trainer import BagOfCodes, collate, make_items
from medtx.training.trainer import TrainConfig, fit
items = make_items(16)
torch.manual_seed(0)
print("started", flush=True)
fit(BagOfCodes(6, 3), items, items, collate, TrainConfig(epochs=5000, batch_size=4, lr=0.05, patience=100000,
    num_threads=1), Path(sys.argv[1]))
"""


@pytest.mark.slow
def test_a_training_process_killed_at_random_moments_resumes_exactly_or_refuses(tmp_path: Path):
    """SIGKILL a real training process at random moments (each epoch writes best/ and last/), then resume: the
    run continues exactly like an uninterrupted one, or refuses in one clear line; never a silent mix."""
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parent.parent
    items = make_items(16)
    rng = random.Random(7)
    outcomes = []
    for attempt in range(4):
        run = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", _TRAIN_FOREVER, str(run)], cwd=root, stdout=subprocess.PIPE,
                                text=True, env={**os.environ, "PYTHONPATH": str(root)})
        assert proc.stdout.readline().strip() == "started"
        deadline = time.time() + 60
        while not (run / "last" / "trainer_state.json").exists() and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.25))  # a few dozen epochs of ~7 ms, most of it checkpoint writes
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        cfg = resume_cfg(json.loads((run / "last" / "trainer_state.json").read_text())["epoch"] + 2)
        torch.manual_seed(0)
        full = fit(BagOfCodes(6, 3), items, items, collate, cfg, tmp_path / f"full{attempt}")
        try:
            resumed = fit(BagOfCodes(6, 3), items, items, collate, cfg, run, resume=True)
        except RuntimeError as exc:
            assert "cannot resume" in str(exc), exc
            outcomes.append("refused")
            continue
        assert_same_training(resumed, full)
        outcomes.append("resumed")
    assert len(outcomes) == 4, outcomes


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
