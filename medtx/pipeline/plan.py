"""The pipeline as data: every step a config implies, with what it reads, writes and depends on.

The flow (flows/pipeline.py) walks this plan layer by layer; the cache key of a step is built from the
fingerprints named here, and `medtx run-task NAME` looks a step up by its name. Step names read like paths:
`ingest.mimic3_demo`, `samples.drug_rec.synth_2000`, `train.drug_rec.mimic3_demo.logreg.s42`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from functools import lru_cache

from medtx.codes import mapping as codes_stage
from medtx.codes.reference import WRITES as REFERENCE
from medtx.store.fingerprint import import_closure
from medtx.pipeline.config import ModelEntry, PipelineConfig, resolve_devices
from medtx.evaluation.groups import READS as TRUST_READS
from medtx.synth.oracle import WRITES as SYNTH_ORACLE
from medtx.tasks import Task, get_task

# Layers run in this order; steps inside a layer do not depend on each other.
KINDS = ("synth", "ingest", "reference", "codes", "samples", "train")

MIMIC_TABLES = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents")
RAW_MIMIC = tuple(f"raw.{t}" for t in MIMIC_TABLES)
CORE = codes_stage.WRITES
# Tables every train step reads besides its task's: the split, the vocabularies and the leakage gate's record (a
# blocked task's trainings refuse to start: medtx.tasks.leakage.require_pass), plus the synthetic generator's
# oracle tables, SYNTH_ORACLE: the "is this dataset synthetic" rule and the oracle baseline read them.
TRAIN_READS = ("samples.splits", "samples.vocab", "samples.leakage_gate")
# The module(s) each kind's step function runs; a step's code key is their import closure (plus its task's
# module), so an edit to the models redoes training but not ingest, and editing one task's builder redoes
# that task's samples only.
ENTRY = {
    "synth": ("medtx.synth.generate",),
    "ingest": ("medtx.ingest",),
    "meds": ("medtx.meds.ingest",),
    "oracle": ("medtx.synth.oracle",),
    "reference": ("medtx.codes.reference",),
    "codes": ("medtx.codes.mapping",),
    "samples": ("medtx.tasks.build",),
    "train": ("medtx.training.experiment",),
    "train_text": ("medtx.text.experiment",),
}


@lru_cache(maxsize=None)
def _closure(entries: tuple[str, ...]) -> tuple[str, ...]:
    return import_closure(*entries)


@dataclass(frozen=True)
class Step:
    """One unit of work: one Prefect task run, one row in ml.pipeline_steps."""

    name: str
    kind: str
    params: dict[str, Any]  # JSON-able arguments of the step function (source, overrides, seed, ...)
    dataset: str | None = None  # warehouse dataset key the step reads/writes (None: dataset-independent)
    task: str | None = None
    model: str | None = None  # model spec label (train steps)
    needs: tuple[str, ...] = ()  # names of upstream steps; a failed upstream skips this step
    reads: tuple[str, ...] = ()  # warehouse tables fingerprinted (filtered by dataset) into the cache key
    writes: tuple[str, ...] = ()  # warehouse tables fingerprinted after the step (filtered by dataset)
    device: str = "cpu"  # train steps: where to train (not part of the cache key)
    files: tuple[str, ...] = ()  # local files/folders hashed into the cache key
    # Column filters for fingerprinting `reads`/`writes` (applied to tables that have the column).
    scope: dict[str, Any] = field(default_factory=dict)

    @property
    def code(self) -> tuple[str, ...]:
        """The medtx modules (import closure of the step's entry points) whose source is in its cache key."""
        table = self.params.get("table")
        kind = table if table in ("oracle", "meds") else self.kind
        task = get_task(self.task) if self.task else None
        if kind == "train" and task is not None and task.family != "ehr":
            kind = "train_text"
        entries = ENTRY[kind]
        if task is not None and kind in ("samples", "train", "train_text"):
            entries += (f"medtx.tasks.{task.name}",) + ((f"medtx.tasks.{task.builds}",) if task.builds else ())
        return _closure(entries)

    def spec(self) -> dict[str, Any]:
        """What the step function needs (and the Prefect cache key covers): not its place in the plan."""
        return {"dataset": self.dataset, "task": self.task, "model": self.model, "params": self.params}


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    def __getitem__(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"no pipeline step named {name!r}; known steps:\n  " + "\n  ".join(self.names))

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def layers(self) -> list[list[Step]]:
        """Steps grouped by kind, in execution order."""
        return [[s for s in self.steps if s.kind == kind] for kind in KINDS if any(s.kind == kind for s in self.steps)]

    def downstream(self, name: str) -> list[str]:
        """Every step that (transitively) needs `name`."""
        found: list[str] = []
        frontier = {name}
        for step in self.steps:  # steps are in topological order
            if frontier & set(step.needs):
                found.append(step.name)
                frontier.add(step.name)
        return found


def _ingest_steps(cfg: PipelineConfig, synth_dir: Path) -> list[Step]:
    """One step per dataset: its tables are one atomic unit (medtx/ingest/staging.py: all staged and
    checked, then swapped in by one transaction). Synth cohorts first generate their CSV folder, then load
    like any folder, plus their oracle tables."""
    guard = {"allow_shrink": cfg.ingest.allow_shrink, "max_shrink": cfg.ingest.max_shrink,
             "plausibility": cfg.ingest.plausibility}
    steps = []
    for ds in cfg.datasets:
        scope = {"dataset": ds.key}
        needs: tuple[str, ...] = ()
        source = cfg.resolve(ds.source)
        if ds.kind == "synth":
            # Generation writes files only; the ingest steps load them like any MIMIC-III folder.
            source = str(synth_dir / f"{ds.key}-n{ds.n_patients}-seed{ds.seed}{'-notes' if ds.notes else ''}")
            synth = Step(f"synth.{ds.key}", "synth",
                         {"n_patients": ds.n_patients, "seed": ds.seed, "notes": ds.notes, "out_dir": source},
                         ds.key, scope=scope)
            steps.append(synth)
            needs = (synth.name,)
        if ds.kind == "meds":
            steps.append(_meds_ingest_step(ds, source, scope, guard))
            continue
        files = () if ds.kind == "url" else (source,)
        tables = list(ds.tables or MIMIC_TABLES)
        steps.append(Step(f"ingest.{ds.key}", "ingest", {"source": source, "tables": tables, **guard}, ds.key,
                          needs=needs, writes=tuple(f"raw.{t}" for t in tables), files=files, scope=scope))
        if ds.kind == "synth":
            steps.append(Step(f"ingest.{ds.key}.oracle", "ingest", {"source": source, "table": "oracle"}, ds.key,
                              needs=needs, writes=SYNTH_ORACLE, files=files, scope=scope))
    if cfg.mtsamples:
        src = cfg.resolve(cfg.mtsamples.source)
        steps.append(Step("ingest.mtsamples", "ingest", {"source": src, "table": "mtsamples", **guard}, "mtsamples",
                          writes=("raw.mtsamples",), files=(src,)))
    return steps


def _meds_ingest_step(ds, source: str, scope: dict, guard: dict) -> Step:
    """A MEDS folder loads in one step (one transaction over every raw table, under the same row-count guard
    as a CSV dataset); its cache key covers each shard (symlinked folders included, as the import reads
    them) and metadata file (the folder itself has no top-level files)."""
    from medtx.meds.validate import MedsFormatError, shard_files

    root = Path(source)
    try:
        shards = shard_files(root / "data") if (root / "data").is_dir() else []
    except MedsFormatError:  # a dangling link or a loop: the import says so; the key then covers the folder
        shards = []
    files = tuple(str(p) for p in sorted([*shards, *root.glob("metadata/*")]))
    params = {"source": source, "table": "meds", "codes": ds.codes, **({"cast_types": True} if ds.cast_types else {}),
              **guard}
    return Step(f"ingest.{ds.key}.meds", "ingest", params, ds.key,
                writes=(*RAW_MIMIC, "raw.meds_splits", "raw.meds_codes"), files=files or (source,), scope=scope)


def ingest_steps_of(steps: list[Step], dataset: str) -> tuple[str, ...]:
    return tuple(s.name for s in steps if s.kind == "ingest" and s.dataset == dataset)


def _task_datasets(cfg: PipelineConfig, task: Task) -> list[str]:
    """The warehouse datasets a configured task runs on: its fixed corpus, or the config's EHR datasets."""
    return [task.dataset] if task.dataset is not None else [d.key for d in cfg.datasets_for(task.name)]


def _sample_step_name(builder: Task, dataset: str) -> str:
    """The samples step of a building task (`get_task(task.samples_task)`) on a dataset."""
    return f"samples.{builder.name}" if builder.dataset is not None else f"samples.{builder.name}.{dataset}"


def _sample_steps(cfg: PipelineConfig, ingest: list[Step], data_dir: Path) -> list[Step]:
    """One step per (building task, dataset); reads/writes/files come from the task's declaration."""
    steps: dict[str, Step] = {}
    seed = cfg.seeds[0]  # the split seed: every model of a task sees the same split
    for name, tc in cfg.tasks.items():
        task = get_task(name)  # the config's task name, resolved once
        builder = get_task(task.samples_task)
        for dataset in _task_datasets(cfg, task):
            step_name = _sample_step_name(builder, dataset)
            if step_name in steps:
                continue  # tasks sharing a builder (readmission, readmission_notes) share one sample step
            mapped = any(t.startswith("core.") for t in builder.reads)
            steps[step_name] = Step(
                step_name, "samples", {"options": tc.samples, "seed": seed}, dataset, builder.name,
                needs=(*((f"codes.{dataset}",) if mapped else ()), *ingest_steps_of(ingest, dataset)),
                reads=builder.reads, writes=builder.writes, files=tuple(str(data_dir / f) for f in builder.files),
                scope={"dataset": dataset, "task": builder.name},
            )
    return list(steps.values())


def _runs_on(spec: ModelEntry, dataset: str, cfg: PipelineConfig) -> bool:
    """A model spec runs on a dataset unless it names others; a model reading the synthetic generator's tables
    (the oracle) needs a synthetic cohort."""
    from medtx.models.registry import reads_generator

    if spec.datasets is not None and dataset not in spec.datasets:
        return False
    if reads_generator(spec.model):
        return any(d.key == dataset and d.kind == "synth" for d in cfg.datasets)
    return True


def train_step(task: Task, dataset: str, model: str, *, label: str | None = None,
               overrides: dict[str, Any] | None = None, seed: int = 0, device: str = "cpu") -> Step:
    """The step that trains `model` on (task, dataset) with one seed: what the pipeline plans and what
    `medtx train` runs (same reads, so the same training package). The step records the task's name."""
    task_name = task.name
    sample_step = _sample_step_name(get_task(task.samples_task), dataset)
    return Step(
        f"train.{task_name}.{dataset}.{label or model}.s{seed}",
        "train",
        {"model": model, "overrides": dict(overrides or {}), "seed": seed},
        dataset,
        task_name,
        label or model,
        needs=(sample_step,),
        # every family's run reads the oracle tables: one "is this dataset synthetic" rule (medtx.training.runs)
        # a binary/multi-label EHR run's evaluation reads its test admissions' demographics (its subgroups)
        reads=(task.sample_table, *TRAIN_READS, *task.train_reads, *SYNTH_ORACLE,
               *(TRUST_READS if task.family == "ehr" and task.kind in ("binary", "multilabel") else ())),
        writes=("ml.runs", "ml.metrics"),  # scoped to the run ids the step wrote
        device=device,
        scope={"dataset": dataset, "task": task.samples_task},
    )


def _train_steps(cfg: PipelineConfig) -> list[Step]:
    devices = itertools.cycle(resolve_devices(cfg.devices))
    steps = []
    for name, tc in cfg.tasks.items():
        task = get_task(name)
        for dataset, spec in itertools.product(_task_datasets(cfg, task), tc.models):
            if not _runs_on(spec, dataset, cfg):
                continue
            for seed in spec.seeds or cfg.seeds:
                steps.append(train_step(task, dataset, spec.model, label=spec.label, overrides=spec.overrides,
                                        seed=seed, device=next(devices)))
    return steps


def build_plan(cfg: PipelineConfig, synth_dir: Path, data_dir: Path) -> Plan:
    """Every step of a config, in dependency order (synth, ingest, reference, codes, samples, train).

    `synth_dir` is where generated cohorts are written; `data_dir` holds the bundled dictionaries, drug
    maps and FAQ, whose files are hashed into the cache keys of the steps that read them.
    """
    from medtx.codes.reference import reference_files

    ingest = _ingest_steps(cfg, synth_dir)
    steps = list(ingest)
    if cfg.datasets:
        refs = tuple(str(p) for p in reference_files(data_dir).values())
        steps.append(Step("reference", "reference", {}, writes=REFERENCE, files=refs))
        for ds in cfg.datasets:
            rx = tuple(s.name for s in ingest if s.dataset == ds.key and "raw.prescriptions" in s.writes)
            steps.append(
                Step(f"codes.{ds.key}", "codes", {}, ds.key, needs=(*rx, "reference"),
                     reads=codes_stage.READS, writes=CORE, scope={"dataset": ds.key})
            )
    steps += _sample_steps(cfg, ingest, data_dir)
    steps += _train_steps(cfg)
    order = {kind: i for i, kind in enumerate(KINDS)}
    return Plan(tuple(sorted(steps, key=lambda s: order[s.kind])))
