"""Checks of a pipeline config that need more than its schema: models exist and fit their task, override keys
exist on the model/trainer config dataclass, numbers are in range, local sources exist.

Why here and not at step time: a typo in `epochs` or a model name used to surface 20-36 s later, inside a
Prefect task, without the config file or key. These run at load, before any Prefect server starts, and
each problem is one line: `FILE: KEY.PATH = VALUE: what is wrong; allowed: ...`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

BASELINE_OVERRIDES = {"most_frequent": (), "copy_last": (), "oracle": (), "logreg": ("C", "max_iter")}

# Range rules by override key (the keys every model family shares); `allowed` is what the message shows.
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "epochs": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "batch_size": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "eval_batch_size": (lambda v: v is None or (_is_int(v) and v >= 1), "an integer >= 1 or null"),
    "patience": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "lr": (lambda v: _is_num(v) and v > 0, "a number > 0"),
    "weight_decay": (lambda v: _is_num(v) and v >= 0, "a number >= 0"),
    "dropout": (lambda v: _is_num(v) and 0 <= v < 1, "a number in [0, 1)"),
    "max_iter": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def models_for(task: str) -> tuple[str, ...]:
    """The model names a task accepts (baselines first): a view of the model and task registries."""
    from medtx.models.registry import model_names
    from medtx.models.registry import models_for as registry_models_for

    takes = registry_models_for(task)
    baselines = set(model_names("ehr_baseline")) | set(model_names("text_baseline"))
    return tuple(m for m in takes if m in baselines) + tuple(m for m in takes if m not in baselines)


def _fields(cls: type) -> dict[str, Any]:
    # fields without a default (vocabulary sizes, label counts) come from the data, never from a config
    return {f.name: f.default for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def override_fields(task: str, model: str) -> dict[str, Any]:
    """Override key -> default value, for the config dataclass(es) a (task, model) run is built from: the
    model's registered config (+ the trainer's) for neural EHR models, else the family's run config."""
    from medtx.models.registry import specs
    from medtx.tasks import get_task

    info = get_task(task)
    spec = next((s for s in specs() if s.name == model and s.serves(info)), None)
    if spec is None or spec.family == "ehr_baseline":
        return {k: None for k in BASELINE_OVERRIDES.get(model, ())}
    if spec.family == "ehr":
        from medtx.training.trainer import TrainConfig

        return _fields(spec.config) | _fields(TrainConfig)
    # text and FAQ runs take their overrides on the family's run config (which holds the model's settings)
    if spec.family == "faq":
        from medtx.text.faq import FAQConfig

        return _fields(FAQConfig)
    from medtx.text.experiment import TextConfig

    return _fields(TextConfig)


def _check_value(key: str, value: Any, default: Any) -> str | None:
    rule = _RANGES.get(key)
    if rule is not None:
        ok, allowed = rule
        return None if ok(value) else f"must be {allowed}"
    if _is_int(default) and not _is_int(value):
        return "must be an integer"
    if isinstance(default, float) and not _is_num(value):
        return "must be a number"
    if isinstance(default, bool) and not isinstance(value, bool):
        return "must be true or false"
    return None


def model_problems(cfg: Any) -> list[tuple[str, Any, str]]:
    """(key path, value, problem) for every model spec of the config."""
    out: list[tuple[str, Any, str]] = []
    for task, tc in cfg.tasks.items():
        allowed = models_for(task)
        for i, spec in enumerate(tc.models):
            where = f"tasks.{task}.models[{i}]"
            if spec.model not in allowed:
                out.append((f"{where}.model", spec.model, f"unknown for task {task}; allowed: {', '.join(allowed)}"))
                continue
            fields = override_fields(task, spec.model)
            for key, value in spec.overrides.items():
                if key not in fields:
                    shown = ", ".join(sorted(fields)) or "none (this model takes no overrides)"
                    out.append((f"{where}.overrides.{key}", value, f"not a setting of {spec.model}; allowed: {shown}"))
                elif (why := _check_value(key, value, fields[key])) is not None:
                    out.append((f"{where}.overrides.{key}", value, why))
    return out


def source_problems(cfg: Any) -> list[tuple[str, Any, str]]:
    """Local folder/file sources that do not exist (URLs and synth:N are checked when they are fetched)."""
    out = []
    for i, ds in enumerate(cfg.datasets):
        if ds.kind == "folder" and not Path(cfg.resolve(ds.source)).is_dir():
            out.append((f"datasets[{i}].source", ds.source,
                        f"folder {cfg.resolve(ds.source)} does not exist; allowed: a folder, an http(s) URL or synth:N"))
    if cfg.mtsamples is not None:
        src = cfg.mtsamples.source
        if not src.startswith(("http://", "https://")) and not Path(cfg.resolve(src)).is_file():
            out.append(("mtsamples.source", src, f"file {cfg.resolve(src)} does not exist; allowed: a CSV(.gz) file or URL"))
    return out


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class found by walking `loc` from `root` (for the allowed keys of an unknown-key error)."""
    current: Any = root
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return None
        current = current.model_fields[part].annotation
        # unwrap X | None, then list[X] / dict[str, X] (whose index/key is the next loc part)
        while typing.get_origin(current) is not None:
            origin, args = typing.get_origin(current), [a for a in typing.get_args(current) if a is not type(None)]
            if origin in (list, dict) and parts:
                parts.pop(0)
            current = args[-1]
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def schema_lines(path: Path, exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per pydantic error of the config model `root`: file, key path, value, message, and the
    allowed keys of a typo."""
    lines = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if p not in ("function-after", "function-before"))
        line = f"{path}: {_path(loc) or '(top level)'}: {err['msg']}"
        if err["type"] == "extra_forbidden":
            model = _model_at(root, loc)
            if model is not None:
                keys = [k for k, f in model.model_fields.items() if not f.exclude]
                line = f"{path}: {_path(loc)}: unknown key; allowed: {', '.join(keys)}"
        elif "input" in err and not isinstance(err["input"], dict | list):
            line += f" (got {err['input']!r})"
        lines.append(line)
    return lines
