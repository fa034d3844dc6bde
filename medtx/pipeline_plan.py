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

from medtx.pipeline_config import EHR_TASKS, ModelSpec, PipelineConfig, resolve_devices

# Layers run in this order; steps inside a layer do not depend on each other.
KINDS = ("synth", "ingest", "reference", "codes", "samples", "train")

MIMIC_TABLES = ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions", "noteevents")
RAW_MIMIC = tuple(f"raw.{t}" for t in MIMIC_TABLES)
SYNTH_ORACLE = ("raw.synth_oracle_drug_rec", "raw.synth_oracle_next_visit", "raw.synth_oracle_readmission")
REFERENCE = (
    "ref.icd9_diagnoses",
    "ref.icd9_procedures",
    "ref.atc",
    "ref.ndc_rxcui",
    "ref.rxcui_atc",
    "ref.ndc_atc",
    "ref.ndc_atc3",
    "ref.drug_name_atc3",
    "ref.ddi_atc3",
)
CORE = ("core.prescriptions_atc3", "core.mapping_coverage")
SAMPLE_EXTRAS = ("samples.splits", "samples.vocab", "samples.task_summary")  # scoped by (dataset, task)
# The sample table each task trains on (readmission_notes reads the readmission samples' text).
SAMPLE_TABLE = {
    "drug_rec": "samples.drug_rec",
    "next_visit": "samples.next_visit",
    "readmission": "samples.readmission",
    "readmission_notes": "samples.readmission",
    "specialty": "samples.specialty",
    "faq": "samples.faq",
}
# Which medtx subpackages' source goes into each kind's cache key.
# Narrow on purpose: an edit to the models must not redo ingest. Data changes reach a step through the
# fingerprints of the tables it reads, so "samples/vocab" is the only samples code training depends on.
CODE = {
    "synth": ("synth",),
    "ingest": ("ingest",),
    "oracle": ("synth/oracle",),
    "reference": ("codes",),
    "codes": ("codes",),
    "samples": ("samples", "codes"),
    "train": ("training", "models", "metrics", "text", "samples/vocab"),
}


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
        """The medtx subpackages/modules whose source is part of this step's cache key."""
        return CODE["oracle" if self.params.get("table") == "oracle" else self.kind]

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
    guard = {"allow_shrink": cfg.ingest.allow_shrink, "max_shrink": cfg.ingest.max_shrink}
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


def ingest_steps_of(steps: list[Step], dataset: str) -> tuple[str, ...]:
    return tuple(s.name for s in steps if s.kind == "ingest" and s.dataset == dataset)


def _sample_steps(cfg: PipelineConfig, ingest: list[Step], data_dir: Path) -> list[Step]:
    steps = []
    seed = cfg.seeds[0]  # the split seed: every model of a task sees the same split
    for task, tc in cfg.tasks.items():
        if task in EHR_TASKS:
            built = "readmission" if task == "readmission_notes" else task  # notes read samples.readmission
            for ds in cfg.datasets_for(task):
                if any(s.name == f"samples.{built}.{ds.key}" for s in steps):
                    continue  # readmission and readmission_notes share one sample table per dataset
                steps.append(
                    Step(f"samples.{built}.{ds.key}", "samples", {"options": tc.samples, "seed": seed}, ds.key,
                         built, needs=(f"codes.{ds.key}", *ingest_steps_of(ingest, ds.key)), reads=RAW_MIMIC + CORE,
                         writes=(SAMPLE_TABLE[built], *SAMPLE_EXTRAS),
                         scope={"dataset": ds.key, "task": built})
                )
        elif task == "specialty":
            steps.append(
                Step("samples.specialty", "samples", {"options": tc.samples, "seed": seed}, "mtsamples", task,
                     needs=("ingest.mtsamples",), reads=("raw.mtsamples",),
                     writes=("samples.specialty", *SAMPLE_EXTRAS),
                     scope={"dataset": "mtsamples", "task": "specialty"})
            )
        elif task == "faq":
            faq_dir = str(data_dir / "mental_health_faq")
            steps.append(
                Step("samples.faq", "samples", {"options": tc.samples, "seed": seed}, "mental_health_faq", task,
                     writes=("samples.faq", "samples.task_summary"), files=(faq_dir,),
                     scope={"dataset": "mental_health_faq", "task": "faq"})
            )
    return steps


def _sample_step_name(task: str, dataset: str) -> str:
    if task in ("specialty", "faq"):
        return f"samples.{task}"
    return f"samples.{'readmission' if task == 'readmission_notes' else task}.{dataset}"


def _runs_on(spec: ModelSpec, dataset: str, cfg: PipelineConfig) -> bool:
    """A model spec runs on a dataset unless it names others; the oracle needs a synthetic cohort."""
    if spec.datasets is not None and dataset not in spec.datasets:
        return False
    if spec.model == "oracle":
        return any(d.key == dataset and d.kind == "synth" for d in cfg.datasets)
    return True


def _train_steps(cfg: PipelineConfig) -> list[Step]:
    devices = itertools.cycle(resolve_devices(cfg.devices))
    steps = []
    for task, tc in cfg.tasks.items():
        if task in EHR_TASKS:
            datasets = [d.key for d in cfg.datasets_for(task)]
        else:
            datasets = ["mtsamples" if task == "specialty" else "mental_health_faq"]
        for dataset, spec in itertools.product(datasets, tc.models):
            if not _runs_on(spec, dataset, cfg):
                continue
            for seed in spec.seeds or cfg.seeds:
                sample_step = _sample_step_name(task, dataset)
                steps.append(
                    Step(
                        f"train.{task}.{dataset}.{spec.label}.s{seed}",
                        "train",
                        {"model": spec.model, "overrides": spec.overrides, "seed": seed},
                        dataset,
                        task,
                        spec.label,
                        needs=(sample_step,),
                        reads=(SAMPLE_TABLE[task], "samples.splits", "samples.vocab"),
                        writes=("ml.runs", "ml.metrics"),  # scoped to the run ids the step wrote
                        device=next(devices),
                        scope={"dataset": dataset, "task": sample_step.split(".")[1]},
                    )
                )
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
                     reads=("raw.prescriptions",) + REFERENCE, writes=CORE, scope={"dataset": ds.key})
            )
    steps += _sample_steps(cfg, ingest, data_dir)
    steps += _train_steps(cfg)
    order = {kind: i for i, kind in enumerate(KINDS)}
    return Plan(tuple(sorted(steps, key=lambda s: order[s.kind])))
