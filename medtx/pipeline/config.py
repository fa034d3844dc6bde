"""The pipeline's YAML config: which sources to ingest, which (task, model) pairs to train, how to run.

One file drives a whole `medtx pipeline` run (`config/default.yaml` for the bundled data on 2 CPU cores,
`config/full.yaml` for full MIMIC-III on a GPU machine). Relative source paths resolve against the folder
of the config file, so a config can travel with its data.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from medtx.tasks import all_tasks, get_task

# Views of the task registry (medtx/tasks/): tasks that run once per EHR dataset, and those bound to one
# fixed corpus (MTSamples, the FAQ).
EHR_TASKS = tuple(t.name for t in all_tasks() if t.dataset is None)
TEXT_TASKS = tuple(t.name for t in all_tasks() if t.dataset is not None)
ALL_TASKS = EHR_TASKS + TEXT_TASKS

_NAME = re.compile(r"^[a-z0-9_]+$")
_SYNTH = re.compile(r"^synth:(\d+)$")


class _Strict(BaseModel):
    # A typo in a config key must fail loudly rather than silently fall back to a default.
    model_config = ConfigDict(extra="forbid")


class DatasetConfig(_Strict):
    """One MIMIC-III-format EHR cohort: a local folder, a base URL, or `synth:N` generated patients."""

    source: str
    name: str | None = None  # dataset key in the warehouse; derived from the source when omitted
    tables: list[str] | None = None  # ingest only these MIMIC tables (default: all the ingest stage knows)
    notes: bool = True  # synth only: also generate discharge notes (for readmission_notes)
    seed: int = 0  # synth only: generator seed
    format: Literal["mimic3", "meds"] = "mimic3"  # meds: a MEDS 0.4 folder, loaded by `medtx ingest meds`
    codes: str | None = None  # meds only: code mapping (shipped name `medtx`/`mimic4` or YAML file)

    @property
    def kind(self) -> Literal["folder", "url", "synth", "meds"]:
        if self.format == "meds":
            return "meds"
        if _SYNTH.match(self.source):
            return "synth"
        if self.source.startswith(("http://", "https://")):
            return "url"
        return "folder"

    @property
    def n_patients(self) -> int | None:
        match = _SYNTH.match(self.source)
        return int(match[1]) if match else None

    @property
    def key(self) -> str:
        """The warehouse `dataset` value (ARCHITECTURE.md: folder name, or `synth_<N>`)."""
        if self.name:
            return self.name
        if self.kind == "synth":
            return f"synth_{self.n_patients}"
        from medtx.ingest.sources import dataset_name  # one naming rule for the CLI and the pipeline

        return dataset_name(self.source)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"dataset name {value!r} must match [a-z0-9_]+")
        return value


class TextSourceConfig(_Strict):
    """The MTSamples CSV(.gz) file or URL."""

    source: str


class ModelEntry(_Strict):
    """One model to train and evaluate for a task; `overrides` go to the model/trainer config."""

    model: str
    name: str | None = None  # label for this spec when one model appears twice with different overrides
    overrides: dict[str, Any] = Field(default_factory=dict)
    seeds: list[int] | None = None  # default: the config's top-level seeds
    # EHR tasks: only these datasets (default: the task's datasets; `oracle` runs on synth datasets only,
    # the only ones with a known generating process)
    datasets: list[str] | None = None

    @property
    def label(self) -> str:
        return self.name or self.model


class TaskConfig(_Strict):
    """The models of one task and, for EHR tasks, the datasets they run on (default: all)."""

    models: list[ModelEntry]
    datasets: list[str] | None = None
    samples: dict[str, Any] = Field(default_factory=dict)  # options for the sample builder

    @model_validator(mode="after")
    def _unique_labels(self) -> TaskConfig:
        labels = [m.label for m in self.models]
        duplicated = sorted({x for x in labels if labels.count(x) > 1})
        if duplicated:
            raise ValueError(f"model specs {duplicated} appear twice: give each a distinct `name`")
        return self


class IngestConfig(_Strict):
    """Row-count guard of the ingest steps (medtx.ingest.ShrinkGuard; the CLI's --allow-shrink/--max-shrink)."""

    allow_shrink: bool = False  # accept a table dropping to 0 rows or by more than max_shrink
    max_shrink: float = Field(default=0.5, ge=0.0, le=1.0)  # largest accepted fraction of rows lost per table


class RunnerConfig(_Strict):
    """Where tasks run: a thread pool in the flow's process, or a Dask cluster (local or remote)."""

    kind: Literal["thread", "dask"] = "thread"
    max_workers: int = Field(default=2, ge=1)  # thread pool size
    address: str | None = None  # dask: scheduler address (tcp://host:8786); None = start a local cluster
    n_workers: int = Field(default=2, ge=1)  # dask local cluster
    threads_per_worker: int = Field(default=1, ge=1)
    # How many training runs execute at once. "auto" (default): one per GPU with `devices: [auto]` on a GPU
    # machine, else available cores // torch_threads (medtx.runtime.resources: affinity mask capped by the cgroup
    # quota). The warehouse writer stays single either way: steps open short transactions of their own.
    train_concurrency: int | Literal["auto"] = "auto"
    # torch CPU threads per training. "auto" (default): available cores // trainings at once, so concurrent
    # trainings never oversubscribe the cores (OpenMP threads spin-waiting on each other: 22 s vs 96 s for the
    # same demo transformer under load); None: torch's own default (one per core, whatever runs beside it).
    torch_threads: int | Literal["auto"] | None = "auto"

    @field_validator("train_concurrency", "torch_threads")
    @classmethod
    def _positive(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return value

    def resolved(self, gpus: int = 0, cpus: int | None = None) -> tuple[int, int | None]:
        """(trainings at once, torch threads per training) for a machine with `cpus` cores and `gpus` GPUs."""
        from medtx.runtime.resources import auto_train_concurrency, available_cpus, threads_per_training

        cpus = available_cpus() if cpus is None else cpus
        fixed_threads = self.torch_threads if isinstance(self.torch_threads, int) else 1
        width = (auto_train_concurrency(cpus, fixed_threads, gpus) if self.train_concurrency == "auto"
                 else self.train_concurrency)
        threads = threads_per_training(width, cpus) if self.torch_threads == "auto" else self.torch_threads
        return width, threads


class ScheduleConfig(_Strict):
    cron: str = "0 3 * * *"
    timezone: str = "UTC"


class PipelineConfig(_Strict):
    """The whole pipeline config (see config/default.yaml for an annotated example)."""

    name: str = "default"
    datasets: list[DatasetConfig] = Field(default_factory=list)
    mtsamples: TextSourceConfig | None = None  # the FAQ task always reads the bundled mental-health FAQ
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    tasks: dict[str, TaskConfig] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [42])
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    # Training devices: "cpu", "cuda", "cuda:1", or "auto" (every visible GPU, else the CPU).
    devices: list[str] = Field(default_factory=lambda: ["cpu"])
    base_dir: Path = Field(default=Path("."), exclude=True)  # folder relative sources resolve against

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: dict[str, TaskConfig]) -> dict[str, TaskConfig]:
        unknown = sorted(set(tasks) - set(ALL_TASKS))
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; known: {list(ALL_TASKS)}")
        return tasks

    @model_validator(mode="after")
    def _consistent(self) -> PipelineConfig:
        keys = [d.key for d in self.datasets]
        if len(set(keys)) != len(keys):
            raise ValueError(f"dataset names {keys} are not unique: set `name` on one of them")
        for task, tc in self.tasks.items():
            named = set(tc.datasets or []).union(*(m.datasets or [] for m in tc.models))
            missing = sorted(named - set(keys))
            if missing:
                raise ValueError(f"tasks.{task}.datasets names unknown dataset(s) {missing}; known: {keys}")
            task_def = get_task(task)
            # Which models a task takes is checked in load_config (medtx.pipeline.checks.model_problems): one
            # line per wrong model with its key path, beside every other problem of the file.
            if "raw.mtsamples" in task_def.reads and self.mtsamples is None:
                raise ValueError(f"tasks.{task} needs an `mtsamples` source")
        return self

    def resolve(self, source: str) -> str:
        """A folder/file source as an absolute path (URLs and synth:N pass through)."""
        if _SYNTH.match(source) or source.startswith(("http://", "https://")):
            return source
        path = Path(source).expanduser()
        return str(path if path.is_absolute() else (self.base_dir / path).resolve())

    def datasets_for(self, task: str) -> list[DatasetConfig]:
        """The EHR datasets a task runs on (all of them unless the task lists some)."""
        wanted = self.tasks[task].datasets
        return [d for d in self.datasets if wanted is None or d.key in wanted]

    def fingerprint(self) -> str:
        """Stable hash of the config's content (not of its file path or formatting)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ConfigError(ValueError):
    """A pipeline config that cannot run; `lines` holds one line per problem (file, key path, allowed)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def load_config(path: Path | str, *, sources: bool = False) -> PipelineConfig:
    """Read and validate a pipeline YAML config: its schema, models, override keys and ranges
    (medtx.pipeline.checks); with `sources` (a run, not a plan listing) also that local sources exist.
    Every problem is one line naming the file and the key path; all of them are raised at once."""
    from pydantic import ValidationError

    from medtx.pipeline.checks import model_problems, schema_lines, source_problems

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pipeline config {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {' '.join(str(exc).split())}"]) from exc
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: top level must be a mapping, got {type(raw).__name__}"])
    # `x-...` keys hold YAML anchors shared by several entries (as in docker-compose files).
    raw = {k: v for k, v in raw.items() if not str(k).startswith("x-")}
    try:
        cfg = PipelineConfig(**raw, base_dir=path.resolve().parent)
    except ValidationError as exc:
        raise ConfigError(schema_lines(path, exc, PipelineConfig)) from None
    problems = model_problems(cfg) + (source_problems(cfg) if sources else [])
    if problems:
        raise ConfigError([f"{path}: {key} = {value!r}: {why}" for key, value, why in problems])
    return cfg


def resolve_devices(devices: list[str]) -> list[str]:
    """Expand "auto" to every visible CUDA device (or "cpu" without one); keep explicit names."""
    if devices != ["auto"]:
        return devices
    import torch

    count = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(count)] or ["cpu"]
