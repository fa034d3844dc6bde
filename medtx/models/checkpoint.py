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
from safetensors.torch import load_file, save_file
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
    tensors = weight_tensors(model)
    replace_file(folder / "model.safetensors", lambda p: save_file(tensors, str(p), metadata=stamp))
    replace_file(folder / "config.json", lambda p: p.write_text(json.dumps(config, indent=2, default=str)))
    replace_file(folder / "trainer_state.json", lambda p: p.write_text(json.dumps(state, indent=2, default=str)))
    return folder


def weight_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state as CPU tensors that own their memory, a tied name left out (`tied_names`).

    A tied weight (one tensor under two names, e.g. an MLM decoder sharing the embedding) is kept once. Tensors
    that only share storage are copied apart: on CUDA, cuDNN packs an RNN's weights into one flat buffer
    (`flatten_parameters`), views that no single name covers, which safetensors' own `save_model` refuses
    ("found no suitable name to keep"): the first GPU run lost every recurrent model's checkpoint to it.
    """
    state = model.state_dict()
    tied = tied_names(state)
    return {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in state.items()
            if name not in tied}


def tied_names(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Names whose tensor is the very same tensor (same memory, shape and strides) as an earlier name's."""
    tied: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, tensor in state.items():
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() and key in seen:
            tied[name] = seen[key]
        else:
            seen[key] = name
    return tied


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
    state = load_file(str(path), device=str(device))
    for name, kept in tied_names(model.state_dict()).items():  # a tied name is stored once, under either of its names
        if name not in state and kept in state:
            state[name] = state[kept]
        elif kept not in state and name in state:
            state[kept] = state[name]
    model.load_state_dict(state, strict=True)  # copies into the model's own tensors, wherever they live
    return model


def saved_model_config(folder: Path) -> dict[str, Any]:
    """The model config dict a checkpoint folder's config.json holds ({} when it has none)."""
    return json.loads((Path(folder) / "config.json").read_text()).get("model") or {}
