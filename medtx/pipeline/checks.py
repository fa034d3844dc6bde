"""Checks of a pipeline config that need more than its schema: models exist and fit their task, override keys
exist on the model/trainer config dataclass, numbers are in range, local sources exist.

Why here and not at step time: a typo in `epochs` or a model name used to surface 20-36 s later, inside a
Prefect task, without the config file or key. These run at load, before any Prefect server starts, and
each problem is one line: `FILE: KEY.PATH = VALUE: what is wrong; allowed: ...`.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

if typing.TYPE_CHECKING:
    from medtx.tasks import Task


def models_for(task: Task) -> tuple[str, ...]:
    """The model names a task accepts (baselines first): a view of the model and task registries."""
    from medtx.models.registry import model_names
    from medtx.models.registry import models_for as registry_models_for

    takes = registry_models_for(task)
    baselines = set(model_names("ehr_baseline")) | set(model_names("text_baseline"))
    return tuple(m for m in takes if m in baselines) + tuple(m for m in takes if m not in baselines)


def _settable(cls: type) -> list[str]:
    # fields without a default (vocabulary sizes, label counts) come from the data, never from a config
    return [f.name for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]


def config_classes(task: Task, model: str) -> list[tuple[type, dict[str, Any]]]:
    """(config dataclass, its defaults for this task) for each config a (task, model) run's overrides go to, as
    the runner of the model's family says (medtx.training.runners): the model's registered config and the
    trainer's for neural EHR models, the baseline's registered config (none for a baseline that registers none: it
    takes no overrides), a text or FAQ run's flat run config."""
    from medtx.models.registry import specs
    from medtx.training.runners import runner_for

    spec = next((s for s in specs() if s.name == model and s.serves(task)), None)
    if spec is None:
        return []
    return runner_for(task, model).config_classes(spec, task)


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def dataclass_problems(cls: type, defaults: dict[str, Any], overrides: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(key, value, problem) for the overrides of one config dataclass, validated by pydantic against the
    bounds its field types declare (medtx.models.bounds) and its `__post_init__` (fields that must agree)."""
    from medtx.models.bounds import FieldProblem

    names = {f.name for f in dataclasses.fields(cls)}
    # the fields the data fills in (label counts, vocabulary sizes): any valid placeholder
    required = {f.name: 1 for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    values = {**required, **{k: v for k, v in defaults.items() if k in names}, **overrides}
    try:
        _adapter(cls).validate_python(values)
    except ValidationError as exc:
        out = []
        for err in exc.errors():
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, FieldProblem):
                key = next((f for f in cause.fields if f in overrides), cause.fields[0])
                out.append((key, values.get(key), cause.message))
            elif err["loc"] and err["loc"][0] in names:
                key = err["loc"][0]
                line = (key, values.get(key), f"must be {describe_allowed(_hints(cls)[key])}")
                if line not in out:  # a union field (`C: float | "auto"`) fails once per member: one line
                    out.append(line)
            else:
                out.append(("", overrides, err["msg"].removeprefix("Value error, ")))
        return out
    return []


def override_problems(task: Task, model: str, overrides: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(override key, value, problem) for one model spec: keys that are no setting of the model, and values
    outside what the model's (and the trainer's) config dataclass allows."""
    classes = config_classes(task, model)
    settable = sorted({k for cls, _ in classes for k in _settable(cls)})
    shown = ", ".join(settable) or "none (this model takes no overrides)"
    out = [(key, value, f"not a setting of {model}; allowed: {shown}")
           for key, value in overrides.items() if key not in settable]
    for cls, defaults in classes:
        mine = {k: v for k, v in overrides.items() if k in _settable(cls)}
        out += dataclass_problems(cls, defaults, mine)
    return out


def model_problems(cfg: Any) -> list[tuple[str, Any, str]]:
    """(key path, value, problem) for every model spec of the config."""
    from medtx.tasks import get_task

    out: list[tuple[str, Any, str]] = []
    for task, tc in cfg.tasks.items():
        record = get_task(task)  # the config's task name, resolved once
        allowed = models_for(record)
        for i, spec in enumerate(tc.models):
            where = f"tasks.{task}.models[{i}]"
            if spec.model not in allowed:
                out.append((f"{where}.model", spec.model, f"unknown for task {task}; allowed: {', '.join(allowed)}"))
                continue
            for key, value, why in override_problems(record, spec.model, spec.overrides):
                out.append((f"{where}.overrides{'.' + key if key else ''}", value, why))
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
    for i, ds in enumerate(cfg.datasets):
        if ds.kind == "meds" and not ds.source.startswith(("http://", "https://")):
            from medtx.meds.validate import MedsFormatError, find_shards

            try:
                find_shards(Path(cfg.resolve(ds.source)))
            except MedsFormatError as exc:
                out.append((f"datasets[{i}].source", ds.source, f"is marked `format: meds` but {exc}; allowed: a "
                            "MEDS 0.4 folder (data/**/*.parquet, metadata/dataset.json, metadata/codes.parquet)"))
    return out


def task_choices() -> tuple[str, ...]:
    """Every task a config may name (the task registry): those that run once per EHR dataset first, then those
    bound to one fixed corpus (MTSamples, the FAQ)."""
    from medtx.tasks import all_tasks

    return tuple(t.name for t in sorted(all_tasks(), key=lambda t: t.samples.dataset is not None))


def plan_problems(cfg: Any) -> list[tuple[str, Any, str]]:
    """A config that would run nothing, or EHR tasks with no dataset to run on."""
    from medtx.tasks import get_task

    if not cfg.tasks:
        return [("tasks", {}, f"no task to run; allowed: a mapping of one or more of {', '.join(task_choices())} "
                             "to their models")]
    out = []
    ehr = [t for t in cfg.tasks if get_task(t).samples.dataset is None]
    if ehr and not cfg.datasets:
        out.append(("datasets", [], f"tasks {', '.join(ehr)} run on EHR datasets and none is listed; allowed: a "
                                    "list of at least 1 {source: FOLDER | URL | synth:N}"))
    return out


def device_problems(cfg: Any, gpus: int | None = None) -> list[tuple[str, Any, str]]:
    """Training devices this machine does not have (`cuda:7` on a 1-GPU or CPU-only machine)."""
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count()
    have = ["cpu", "auto"] + (["cuda"] + [f"cuda:{i}" for i in range(gpus)] if gpus else [])
    return [(f"devices[{i}]", d, f"no such device on this machine ({gpus} CUDA GPU(s)); allowed: {', '.join(have)}")
            for i, d in enumerate(cfg.devices) if d not in have]


def _unwrap(annotation: Any) -> tuple[Any, list]:
    """(type, constraints) of an annotation with Annotated layers peeled (their FieldInfos' metadata kept)."""
    meta: list = []
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *extra = typing.get_args(annotation)
        for m in extra:
            meta.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    return annotation, meta


def _members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def _bounds(meta: list) -> str:
    low = next((f">= {m.ge}" for m in meta if isinstance(m, annotated_types.Ge)), None) or next(
        (f"> {m.gt}" for m in meta if isinstance(m, annotated_types.Gt)), None)
    high = next((f"<= {m.le}" for m in meta if isinstance(m, annotated_types.Le)), None) or next(
        (f"< {m.lt}" for m in meta if isinstance(m, annotated_types.Lt)), None)
    if low and high:
        return f" in {'[' if low[1] == '=' else '('}{low.split()[-1]}, {high.split()[-1]}{']' if high[1] == '=' else ')'}"
    return f" {low or high}" if low or high else ""


def describe_allowed(annotation: Any, meta: list | None = None) -> str:
    """What a config field accepts, in words, from its type and pydantic/annotated-types constraints:
    `an integer in [1, 8192]`, `one of 'thread', 'dask'`, `a list of at least 1 ...`."""
    annotation, inner = _unwrap(annotation)
    meta = [*(meta or []), *inner]
    flat = []
    for m in meta:
        flat.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    members = _members(annotation)
    if len(members) > 1:
        text = " or ".join(describe_allowed(m) for m in members if m is not type(None))
        return text + (" or null" if type(None) in members else "")
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple):
        least = next((m.min_length for m in flat if isinstance(m, annotated_types.MinLen)), 0)
        return f"a list{f' (at least {least} item)' if least else ''} of: {describe_allowed(args[0])}"
    if origin is dict or annotation is dict:
        return "a mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a mapping with keys " + ", ".join(k for k, f in annotation.model_fields.items() if not f.exclude)
    if annotation is bool:
        return "true or false"
    if annotation is int:
        return "an integer" + _bounds(flat)
    if annotation is float:
        return "a finite number" + _bounds(flat)
    if annotation is str:
        pattern = next((m.pattern for m in flat if getattr(m, "pattern", None)), None)
        least = next((m.min_length for m in flat if isinstance(m, annotated_types.MinLen)), 0)
        return f"text matching {pattern}" if pattern else ("non-empty text" if least else "text")
    return getattr(annotation, "__name__", str(annotation))


def _field_at(root: type[BaseModel], loc: tuple) -> tuple[tuple, Any, list]:
    """Walk `loc` from the config model `root`: (the parts that name fields, list indices or mapping keys;
    the annotation and constraints found there). Parts left over are pydantic's union-member tags."""
    annotation: Any = root
    meta: list = []
    used = 0
    for part in loc:
        base, _ = _unwrap(annotation)
        nxt = None
        for member in _members(base):
            member, _ = _unwrap(member)
            origin, args = typing.get_origin(member), typing.get_args(member)
            if isinstance(member, type) and issubclass(member, BaseModel) and part in member.model_fields:
                field = member.model_fields[part]
                nxt = (field.annotation, list(field.metadata))
            elif origin is list and isinstance(part, int):
                nxt = (args[0], [])
            elif origin is dict and isinstance(part, str):
                nxt = (args[1], [])
            if nxt is not None:
                break
        if nxt is None:
            break
        annotation, meta = nxt
        used += 1
    return loc[:used], annotation, meta


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def shown(value: Any) -> str:
    """A value as a config error shows it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def schema_lines(path: Path, exc: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per config key with a pydantic error of the config model `root`: the file, the key path, the
    value, what is wrong and what is allowed (`FILE: KEY = VALUE: must be ALLOWED`). A value that fits no
    member of a union (`train_concurrency: abc`) is one line, not one per member; pydantic's own wording
    (which names internal classes) is not shown."""
    lines: dict[str, str] = {}
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if p not in ("function-after", "function-before"))
        if err["type"] == "extra_forbidden":
            _, annotation, _ = _field_at(root, loc[:-1])
            model, _ = _unwrap(annotation)
            keys = (", ".join(k for k, f in model.model_fields.items() if not f.exclude)
                    if isinstance(model, type) and issubclass(model, BaseModel) else "none")
            lines.setdefault(_path(loc), f"{path}: {_path(loc)}: unknown key; allowed: {keys}")
            continue
        used, annotation, meta = _field_at(root, loc)
        key = _path(used) or "(top level)"
        if key in lines:
            continue
        allowed = describe_allowed(annotation, meta)
        if err["type"] == "missing":
            lines[key] = f"{path}: {key}: required, missing; allowed: {allowed}"
        elif err["type"] == "value_error" and not used:  # a check across keys: its message names them
            lines[key] = f"{path}: {err['msg'].removeprefix('Value error, ')}"
        elif err["type"] == "value_error" and len(used) == len(loc):
            message = err["msg"].removeprefix("Value error, ")
            lines[key] = f"{path}: {key} = {shown(err.get('input'))}: {message}" + (
                "" if "allowed:" in message else f"; allowed: {allowed}")
        else:
            lines[key] = f"{path}: {key} = {shown(err.get('input'))}: must be {allowed}"
    return list(lines.values())
