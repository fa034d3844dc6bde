"""The pipeline's YAML config: which sources to ingest, which (task, model) pairs to train, how to run.

One file drives a whole `medtx pipeline` run (`config/default.yaml` for the bundled data on 2 CPU cores,
`config/full.yaml` for full MIMIC-III on a GPU machine). Relative source paths resolve against the folder
of the config file, so a config can travel with its data.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, field_validator,
                      model_validator)

from medtx.pipeline.checks import task_choices
from medtx.tasks import get_task

_NAME = re.compile(r"^[a-z0-9_]+$")
_SYNTH = re.compile(r"^synth:(\d+)$")
# synth:N bounds: a cohort is generated in memory (full MIMIC-III has 46,520 patients; 10,000 is the largest
# benchmarked). Seeds: what numpy's generators take.
MAX_SYNTH_PATIENTS = 1_000_000
MAX_SEED = 2**32 - 1
Seed = Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]
# A training device: cpu, cuda, cuda:N, or auto (every visible GPU, else the CPU; only alone).
DEVICE = re.compile(r"^(cpu|auto|cuda|cuda:\d+)$")


def _distinct_seeds(seeds: list[int] | None) -> list[int] | None:
    if seeds is not None:
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        if twice:
            raise ValueError(f"seed(s) {twice} appear more than once (each seed is one run); allowed: distinct "
                             f"integers in [0, {MAX_SEED}]")
    return seeds


def _distinct_names(names: list[str] | None) -> list[str] | None:
    if names is not None:
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"dataset(s) {twice} listed more than once; allowed: each dataset once")
    return names


class _Strict(BaseModel):
    # A typo in a config key must fail loudly rather than silently fall back to a default.
    model_config = ConfigDict(extra="forbid")


class DatasetConfig(_Strict):
    """One MIMIC-III-format EHR cohort: a local folder, a base URL, or `synth:N` generated patients."""

    source: str  # a folder, an http(s) URL or synth:N (a blank one is refused by _valid_source)
    name: str | None = None  # dataset key in the warehouse; derived from the source when omitted
    tables: list[str] | None = None  # ingest only these MIMIC tables (default: all the ingest stage knows)
    notes: StrictBool = True  # synth only: also generate discharge notes (for readmission_notes)
    seed: Seed = 0  # synth only: generator seed
    format: Literal["mimic3", "meds"] = "mimic3"  # meds: a MEDS 0.4 folder, loaded by `medtx ingest meds`
    codes: str | None = None  # meds only: code mapping (shipped name `medtx`/`mimic4` or YAML file)
    cast_types: bool = False  # meds only: cast the column types meds' DataSchema.align casts (`--cast-types`)

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
            raise ValueError("is not a dataset name; allowed: lower-case letters, digits and _ ([a-z0-9_]+)")
        return value

    @field_validator("source")
    @classmethod
    def _valid_source(cls, value: str) -> str:
        allowed = f"a folder, an http(s) URL or synth:N with N from 1 to {MAX_SYNTH_PATIENTS:,}"
        if not value.strip():
            raise ValueError(f"is blank; allowed: {allowed}")
        if value.startswith("synth:"):
            match = _SYNTH.match(value)
            if match is None or not 1 <= int(match[1]) <= MAX_SYNTH_PATIENTS:
                raise ValueError(f"is not a cohort size medtx generates; allowed: {allowed}")
        return value


class TextSourceConfig(_Strict):
    """The MTSamples CSV(.gz) file or URL."""

    source: Annotated[str, Field(min_length=1)]


class ModelEntry(_Strict):
    """One model to train and evaluate for a task; `overrides` go to the model/trainer config."""

    model: str
    name: str | None = None  # label for this spec when one model appears twice with different overrides
    overrides: dict[str, Any] = Field(default_factory=dict)
    seeds: Annotated[list[Seed], Field(min_length=1)] | None = None  # default: the config's top-level seeds
    # EHR tasks: only these datasets (default: the task's datasets; `oracle` runs on synth datasets only,
    # the only ones with a known generating process)
    datasets: Annotated[list[str], Field(min_length=1)] | None = None

    _seeds = field_validator("seeds")(_distinct_seeds)
    _datasets = field_validator("datasets")(_distinct_names)

    @property
    def label(self) -> str:
        return self.name or self.model


class SamplesOptions(_Strict):
    """Options for a task's sample builder (medtx.tasks.build.build_samples), each checked here: an unknown key
    or a value the builder cannot take is a config error at load, not a failure minutes into a run."""

    fractions: Annotated[list[Annotated[float, Field(ge=0.0, le=1.0)]], Field(min_length=3, max_length=3)] | None = None
    min_count: Annotated[StrictInt, Field(ge=1)] | None = None  # codes seen fewer times are dropped from the vocab
    k_folds: Annotated[StrictInt, Field(ge=2, le=100)] | None = None
    # the feature families whose shortcut a person checked (medtx.tasks.leakage), each with the reason the card and
    # the leaderboard show: `{<family>: <reason>}` (docs/TASKS.md)
    acknowledge: dict[str, str] | None = None

    @field_validator("acknowledge")
    @classmethod
    def _reasons(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and not all(k.strip() and v.strip() for k, v in value.items()):
            raise ValueError("acknowledge must map each acknowledged feature family to the reason a person gave, "
                             "e.g. {static:ADMISSION_TYPE: \"elective admissions are planned, checked by ...\"}; "
                             f"got {value!r}")
        return value

    @field_validator("fractions")
    @classmethod
    def _sum_to_one(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and abs(sum(value) - 1.0) > 1e-6:
            raise ValueError(f"train/val/test fractions {value} sum to {sum(value):g}; allowed: three numbers "
                             "summing to 1, e.g. [0.7, 0.1, 0.2]")
        return value

    def builder_options(self) -> dict[str, Any]:
        """The options as build_samples keywords: only those the config set (the step's cache key as before)."""
        return self.model_dump(exclude_unset=True)


class TaskConfig(_Strict):
    """The models of one task and, for EHR tasks, the datasets they run on (default: all)."""

    models: Annotated[list[ModelEntry], Field(min_length=1)]
    datasets: Annotated[list[str], Field(min_length=1)] | None = None
    samples: SamplesOptions = Field(default_factory=SamplesOptions)  # options for the sample builder
    # An ACES task config (YAML) makes this a task of its own (medtx/aces/task.py), declared by load_config;
    # `predicates`: the dataset's predicates file of a config whose predicates are `???` (MEDS-DEV's tasks).
    aces: Annotated[str, Field(min_length=1)] | None = None
    predicates: Annotated[str, Field(min_length=1)] | None = None

    _datasets = field_validator("datasets")(_distinct_names)

    @model_validator(mode="after")
    def _predicates_need_aces(self) -> TaskConfig:
        if self.predicates is not None and self.aces is None:
            raise ValueError("`predicates` is the predicates file of an ACES task; allowed: with `aces: TASK.yaml`")
        return self

    @model_validator(mode="after")
    def _unique_labels(self) -> TaskConfig:
        labels = [m.label for m in self.models]
        duplicated = sorted({x for x in labels if labels.count(x) > 1})
        if duplicated:
            raise ValueError(f"model specs {duplicated} appear twice; allowed: each once, or a distinct `name` on each")
        return self


class IngestConfig(_Strict):
    """Row-count guard of the ingest steps (medtx.ingest.ShrinkGuard; the CLI's --allow-shrink/--max-shrink) and
    the plausibility policy (medtx.ingest.plausibility; the CLI's --plausibility)."""

    allow_shrink: StrictBool = False  # accept a table dropping to 0 rows or by more than max_shrink
    max_shrink: float = Field(default=0.5, ge=0.0, le=1.0)  # largest accepted fraction of rows lost per table
    plausibility: Literal["warn", "reject", "fail"] = "warn"  # implausible rows: keep+report, move to rejects, fail


class RunnerConfig(_Strict):
    """Where tasks run: a thread pool in the flow's process, or a Dask cluster (local or remote)."""

    kind: Literal["thread", "dask"] = "thread"
    max_workers: StrictInt = Field(default=2, ge=1)  # thread pool size
    address: str | None = None  # dask: scheduler address (tcp://host:8786); None = start a local cluster
    n_workers: StrictInt = Field(default=2, ge=1)  # dask local cluster
    threads_per_worker: StrictInt = Field(default=1, ge=1)
    # How many training runs execute at once. "auto" (default): one per GPU with `devices: [auto]` on a GPU
    # machine, else available cores // torch_threads (medtx.runtime.resources: affinity mask capped by the cgroup
    # quota). The warehouse writer stays single either way: steps open short transactions of their own.
    train_concurrency: StrictInt | Literal["auto"] = "auto"
    # torch CPU threads per training. "auto" (default): available cores // trainings at once, so concurrent
    # trainings never oversubscribe the cores (OpenMP threads spin-waiting on each other: 22 s vs 96 s for the
    # same demo transformer under load); None: torch's own default (one per core, whatever runs beside it).
    torch_threads: StrictInt | Literal["auto"] | None = "auto"
    # DuckDB's memory limit in every process of the run that opens a warehouse (medtx.store.db: its buffer pool
    # and staged rows spill to disk beyond it). "auto" (default): 1/32 of the machine's memory, 1-8 GiB; or a size
    # such as 2GiB or 1500MB (>= 256MiB). MEDTX_DUCKDB_MEMORY_LIMIT, when set, wins over this key.
    duckdb_memory_limit: str = "auto"

    @field_validator("duckdb_memory_limit", mode="before")
    @classmethod
    def _memory_limit(cls, value: object) -> str:
        from medtx.store.db import parse_memory_limit

        value = str(value)
        try:
            parse_memory_limit(value, "duckdb_memory_limit")
        except ValueError as exc:
            raise ValueError(str(exc).split(": ", 1)[1]) from None  # the key path is added by the config's errors
        return value

    @model_validator(mode="after")
    def _address_needs_dask(self) -> RunnerConfig:
        if self.address is not None and self.kind != "dask":
            raise ValueError(f"address {self.address!r} is set with kind {self.kind!r}; allowed: address only with "
                             "kind: dask (a scheduler address such as tcp://host:8786)")
        return self

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
    cron: str = "0 3 * * *"  # five fields: minute hour day-of-month month day-of-week
    timezone: str = "UTC"  # an IANA name (Europe/Paris)

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        import datetime

        import cronsim  # a cron parser without Prefect (medtx is a library; importing Prefect makes its home)

        try:
            cronsim.CronSim(value, datetime.datetime(2026, 1, 1))
        except cronsim.CronSimError:
            raise ValueError("is not a cron expression; allowed: five fields (minute hour day-of-month month "
                             "day-of-week), e.g. '0 3 * * *'") from None
        return value

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        import zoneinfo

        if value not in zoneinfo.available_timezones():
            raise ValueError("is not a time zone; allowed: an IANA name, e.g. UTC or Europe/Paris")
        return value


StudyText = Annotated[StrictStr, Field(max_length=2000)] | None


class StudyConfig(_Strict):
    """What no pipeline can know about the study, written once here and shown on every model card of the run
    (medtx.evaluation.study, whose FIELDS name these keys; an absent or empty one reads "not stated")."""

    title: StudyText = None  # the study's title
    organization: StudyText = None  # who developed the model
    contact: StudyText = None  # where to send questions or comments
    data_source: StudyText = None  # where and when the data were collected (centres, dates)
    ethics_approval: StudyText = None  # the committee and reference, or the waiver
    funding: StudyText = None  # sources of funding and the funders' role
    conflicts_of_interest: StudyText = None
    protocol: StudyText = None  # where the protocol can be read
    registration: StudyText = None  # registry and number
    data_availability: StudyText = None
    code_availability: StudyText = None
    patient_public_involvement: StudyText = None
    ethical_considerations: StudyText = None
    license: StudyText = None


class PipelineConfig(_Strict):
    """The whole pipeline config (see config/default.yaml for an annotated example)."""

    name: str = "default"
    datasets: list[DatasetConfig] = Field(default_factory=list)
    mtsamples: TextSourceConfig | None = None  # the FAQ task always reads the bundled mental-health FAQ
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    tasks: dict[str, TaskConfig] = Field(default_factory=dict)
    seeds: Annotated[list[Seed], Field(min_length=1)] = Field(default_factory=lambda: [42])
    # The seed of each dataset's one patient split (samples.patient_splits): not a training seed, so a change of
    # `seeds` trains on the same split (issue 44). 42: medtx.samples.splits.DEFAULT_SEED, the MEDS export's too.
    split_seed: Seed = 42
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    study: StudyConfig = Field(default_factory=StudyConfig)  # shown on the model cards (docs/MODEL_CARD.md)
    # Training devices: "cpu", "cuda", "cuda:1", or "auto" (every visible GPU, else the CPU). Whether the
    # device exists on this machine is checked for a run (medtx.pipeline.checks.device_problems).
    devices: Annotated[list[Annotated[str, Field(pattern=DEVICE.pattern)]], Field(min_length=1)] = Field(
        default_factory=lambda: ["cpu"])
    base_dir: Path = Field(default=Path("."), exclude=True)  # folder relative sources resolve against

    _seeds = field_validator("seeds")(_distinct_seeds)

    @field_validator("devices")
    @classmethod
    def _auto_alone(cls, devices: list[str]) -> list[str]:
        if "auto" in devices and len(devices) > 1:
            raise ValueError("`auto` already means every visible GPU; allowed: [auto] alone, or named devices")
        return devices

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: dict[str, TaskConfig]) -> dict[str, TaskConfig]:
        unknown = sorted(set(tasks) - set(task_choices()))
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; allowed: {', '.join(task_choices())}")
        return tasks

    @model_validator(mode="after")
    def _consistent(self) -> PipelineConfig:
        keys = [d.key for d in self.datasets]
        if len(set(keys)) != len(keys):
            raise ValueError(f"datasets: names {keys} are not unique; allowed: distinct names (set `name` on one)")
        for task, tc in self.tasks.items():
            named = set(tc.datasets or []).union(*(m.datasets or [] for m in tc.models))
            missing = sorted(named - set(keys))
            if missing:
                raise ValueError(f"tasks.{task}.datasets names unknown dataset(s) {missing}; allowed: {', '.join(keys)}")
            task_def = get_task(task)
            # Which models a task takes is checked in load_config (medtx.pipeline.checks.model_problems): one
            # line per wrong model with its key path, beside every other problem of the file.
            if "raw.mtsamples" in task_def.lineage.reads and self.mtsamples is None:
                raise ValueError(f"tasks.{task} reads MTSamples and the config has no `mtsamples` source; allowed: "
                                 "`mtsamples: {source: FILE.csv(.gz) | URL}`")
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


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key written twice in one mapping is an error (PyYAML keeps the
    last one silently: `epochs: 5` then `epochs: 50` trained 50 epochs without a word)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` merges; its keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if isinstance(key, list | dict):
            continue  # unhashable: the schema refuses it with its key path
        if key in seen:
            raise ConfigError([f"{loader.name}: line {line}: key {key!r} appears twice in one mapping "
                               f"(lines {seen[key]} and {line}); allowed: each key once"])
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml(path: Path) -> Any:
    """The YAML document of a config file, or ConfigError with one line: not UTF-8 (the byte offset and line),
    not YAML, or a key written twice in one mapping."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError([f"{path}: line {line}: byte {exc.start} ({data[exc.start]:#04x}) is not UTF-8; "
                           "allowed: a UTF-8 text file"]) from None
    loader = _UniqueKeyLoader(text)
    loader.name = str(path)
    try:
        return loader.get_single_data()
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {' '.join(str(exc).split())}"]) from None
    finally:
        loader.dispose()


def load_config(path: Path | str, *, sources: bool = False) -> PipelineConfig:
    """Read and validate a pipeline YAML config: its schema, models, override keys and ranges
    (medtx.pipeline.checks); with `sources` (a run, not a plan listing) also that local sources exist.
    Every problem is one line naming the file and the key path; all of them are raised at once."""
    from pydantic import ValidationError

    from medtx.pipeline.checks import (device_problems, model_problems, plan_problems, schema_lines, shown,
                                       source_problems)

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"pipeline config {path} does not exist")
    raw = read_yaml(path)
    if raw is None:
        raise ConfigError([f"{path}: the config is empty; allowed: a mapping with `tasks` (and `datasets` for "
                           "EHR tasks), as in config/default.yaml"])
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: (top level) = {type(raw).__name__}: must be a mapping; allowed keys: "
                           f"{', '.join(k for k, f in PipelineConfig.model_fields.items() if not f.exclude)}"])
    # `x-...` keys hold YAML anchors shared by several entries (as in docker-compose files).
    raw = {k: v for k, v in raw.items() if not str(k).startswith("x-")}
    _declare_aces_tasks(path, raw.get("tasks"))
    try:
        cfg = PipelineConfig.model_validate({**raw, "base_dir": path.resolve().parent})
    except ValidationError as exc:
        raise ConfigError(schema_lines(path, exc, PipelineConfig)) from None
    problems = plan_problems(cfg) + model_problems(cfg) + (source_problems(cfg) + device_problems(cfg) if sources else [])
    if problems:
        raise ConfigError([f"{path}: {key} = {shown(value)}: {why}" for key, value, why in problems])
    return cfg


def _declare_aces_tasks(path: Path, tasks: Any) -> None:
    """Declare the config's ACES tasks (`tasks.<name>.aces`, relative paths from the config's folder) before the
    config is validated against the task registry, so they are tasks like the built-in ones in this process and
    every process it starts (medtx.aces.task.declare). A missing file, a bad name or a built-in task's name is
    one line naming the key."""
    from medtx.aces.task import ENV, AcesSpec, declare

    entries = {str(name): entry for name, entry in (tasks or {}).items()
               if isinstance(tasks, dict) and isinstance(entry, dict) and "aces" in entry}
    if not entries and not os.environ.get(ENV):
        return
    problems, specs = [], []
    for name, entry in entries.items():
        files = {}
        for key in ("aces", "predicates"):
            value = entry.get(key)
            if value is None:
                continue
            file = Path(str(value)).expanduser()
            file = file if file.is_absolute() else (path.resolve().parent / file).resolve()
            if not file.is_file():
                problems.append(f"{path}: tasks.{name}.{key} = {value}: file {file} does not exist; allowed: an "
                                f"ACES task YAML{' (its predicates file)' if key == 'predicates' else ''}")
            files[key] = file
        if "aces" in files:
            specs.append(AcesSpec(name, files["aces"], files.get("predicates")))
    if not problems:
        try:
            declare(specs)
        except ValueError as exc:
            problems.append(f"{path}: tasks: {exc}")
    if problems:
        raise ConfigError(problems)


def resolve_devices(devices: list[str]) -> list[str]:
    """Expand "auto" to every visible CUDA device (or "cpu" without one); keep explicit names."""
    if devices != ["auto"]:
        return devices
    import torch

    count = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(count)] or ["cpu"]
