"""Checkpoint folders: `config.json` + `model.safetensors` + `trainer_state.json` (+ `vocab.json`).

The models layer owns this format, so rebuilding a model from its folder (`registry.load_ehr_model`)
needs nothing from medtx.training; the trainer writes through the same functions.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn


def jsonable(obj: Any) -> Any:
    """A config dataclass as a dict (anything else unchanged), for config.json."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def save_checkpoint(model: nn.Module, folder: Path, config: dict[str, Any], state: dict[str, Any]) -> Path:
    """Write `config.json`, `model.safetensors`, `trainer_state.json` into `folder` (created or overwritten)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_model(model, str(folder / "model.safetensors"))  # handles tied/shared weights
    (folder / "config.json").write_text(json.dumps(config, indent=2, default=str))
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=2, default=str))
    return folder


def load_weights(model: nn.Module, folder: Path, device: torch.device | str = "cpu") -> nn.Module:
    """Load `folder/model.safetensors` into `model` (strict: a different architecture is an error)."""
    path = Path(folder) / "model.safetensors"
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint weights at {path}")
    load_model(model, str(path), strict=True, device=str(device))
    return model


def saved_model_config(folder: Path) -> dict[str, Any]:
    """The model config dict a checkpoint folder's config.json holds ({} when it has none)."""
    return json.loads((Path(folder) / "config.json").read_text()).get("model") or {}
