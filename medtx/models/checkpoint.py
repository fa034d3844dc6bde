"""Checkpoint folders: `config.json` + `model.safetensors` + `trainer_state.json` (+ `vocab.json`).

The models layer owns this format, so rebuilding a model from its folder (`registry.load_ehr_model`)
needs nothing from medtx.training; the trainer writes through the same functions.

Every file is written to a temporary sibling and renamed over the old one (`replace_file`), so a kill leaves each
file whole, old or new. The weights carry their epoch in the safetensors metadata (`weights_epoch`) and
`trainer_state.json` is written last, so a folder a kill left between two epochs is detectable: its weights'
epoch differs from its trainer state's (the trainer refuses to resume from it).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model
from torch import nn


def jsonable(obj: Any) -> Any:
    """A config dataclass as a dict (anything else unchanged), for config.json."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def replace_file(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` to a temporary sibling of `path`, then rename it over `path` (atomic on one file system): a
    reader, or a kill at any moment, sees the old file or the new one, never part of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_checkpoint(model: nn.Module, folder: Path, config: dict[str, Any], state: dict[str, Any]) -> Path:
    """Write `model.safetensors` (stamped with `state["epoch"]`), `config.json`, then `trainer_state.json` into
    `folder` (created or overwritten), each file replaced whole (`replace_file`)."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = {"epoch": str(state.get("epoch", ""))}
    # save_model handles tied/shared weights
    replace_file(folder / "model.safetensors", lambda p: save_model(model, str(p), metadata=stamp))
    replace_file(folder / "config.json", lambda p: p.write_text(json.dumps(config, indent=2, default=str)))
    replace_file(folder / "trainer_state.json", lambda p: p.write_text(json.dumps(state, indent=2, default=str)))
    return folder


def weights_epoch(folder: Path) -> int | None:
    """The epoch `save_checkpoint` stamped into `folder/model.safetensors` (None: written before the stamp)."""
    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as f:
        epoch = (f.metadata() or {}).get("epoch")
    return int(epoch) if epoch not in (None, "") else None


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
