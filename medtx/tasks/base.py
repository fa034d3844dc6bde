"""What a task is: the `Task` record every other part of medtx reads instead of spelling task names.

A task module in `medtx/tasks/` defines one module-level `TASK = Task(...)`; `medtx.tasks` discovers the
modules, so adding a task is adding one file (docs/EXTENDING.md). The record is its identity (name, kind, family)
and four parts: `Clock` (when it predicts, what features may hold, when the outcome is known), `Samples` (the
table, features and label the models read, the split unit), `Lineage` (the builder, the tables it reads and
writes, declared beside the builder's SQL so the pipeline's cache lineage comes from here, and its cohort
exclusions) and `Scoring` (metrics, early stopping, threshold, paired comparisons); plus the models that apply and
their per-task entries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

Kind = Literal["multilabel", "binary", "multiclass", "generation"]
Family = Literal["ehr", "text"]  # which runner trains it: EHR code sequences, or text (notes, FAQ)
SplitUnit = Literal["patient", "text_group", "pair"]

# The shared building blocks every EHR sample builder reads (medtx.samples.common: visits + unknown-code
# counts) and the bookkeeping tables every builder writes (scoped by dataset and task).
EHR_VISIT_READS = (
    "raw.admissions", "raw.patients", "raw.diagnoses_icd", "raw.procedures_icd", "core.prescriptions_atc3",
    "ref.icd9_diagnoses", "ref.icd9_procedures",
    "raw.meds_splits",  # a dataset imported from MEDS keeps its own splits (medtx/samples/splits.py)
    "raw.noteevents",  # the event-time view (medtx.samples.clock) holds notes too
)
SAMPLE_EXTRAS = ("samples.splits", "samples.vocab", "samples.task_summary")
# The leakage gate's record (medtx.tasks.leakage), written after an EHR task's samples are built.
GATE_WRITES = ("samples.leakage_gate", "samples.leakage_shortcuts")
# Every EHR task's builder rewrites the dataset's one patient split (medtx.samples.splits.write_task_splits).
EHR_SAMPLE_EXTRAS = (*SAMPLE_EXTRAS, "samples.patient_splits", *GATE_WRITES)


@dataclass(frozen=True)
class BuildContext:
    """Everything a sample builder may need besides the connection; each builder takes what it uses."""

    dataset: str | None
    data_dir: Path
    seed: int
    fractions: tuple[float, ...]
    min_count: int = 1
    k_folds: int = 5


Builder = Callable[["duckdb.DuckDBPyConnection", BuildContext], int]


@dataclass(frozen=True)
class Clock:
    """When the task predicts and what its features may hold (docs/TASKS.md); the leakage gate checks it.

    `prediction_time`: a SQL expression over the sample's index admission's `admittime` and `dischtime` (e.g.
    "dischtime", "admittime + INTERVAL 48 HOUR"; the admission is also `stay`, for a correlated subquery such as
    readmission_notes' summary time); every sample row stores it as `prediction_time` and its features hold only
    events known at or before it (medtx.samples.clock's rule, read through medtx.samples.common.create_history).
    None: the task has no admission clock (text corpora).
    """

    prediction_time: str | None = None
    # The sample column storing the prediction time (a task trained on another task's samples with its own clock,
    # readmission_notes, stores it in another column).
    column: str = "prediction_time"
    words: str = ""  # the prediction time in words, e.g. "48 hours after admission"
    observation_window: str = ""  # what the features may hold, in words
    # feature column -> the medtx.samples.clock event source its codes come from ('diagnosis', 'procedure', 'drug'),
    # or 'static' for tokens known at admission (age, sex, admission type: not events). The leakage gate checks
    # every code of an event-sourced feature against the warehouse's event times (medtx.tasks.leakage).
    feature_sources: tuple[tuple[str, str], ...] = ()
    # The prefixes of the task's `static` tokens (medtx.samples.static: each names one column with a time rule);
    # a prefix without a rule is refused at build, naming the task, the prefix and the declared columns.
    static_tokens: tuple[str, ...] = ()
    # What the task predicts, in words, and when that outcome is known: a SQL expression over the index admission's
    # `admittime`, `dischtime` and `deathtime` (e.g. "dischtime" for an in-hospital outcome). The leakage gate
    # refuses a sample whose prediction time is at or after it. None: no bound declared (the record says so).
    outcome: str = ""
    outcome_known: str | None = None


@dataclass(frozen=True)
class Samples:
    """What the models read: the sample table, its features and label, and what a sample is split by."""

    table: str  # schema-qualified, e.g. "samples.readmission"
    columns: tuple[str, ...]
    features: tuple[str, ...]  # the model inputs: nested-list code columns [visit][code] (EHR) or text columns
    label_column: str
    split_unit: SplitUnit
    label_feature: str | None = None  # samples.vocab feature holding the label vocabulary (None: binary)
    label_name: str = "positive"  # the single output label of a binary task
    filter: str | None = None  # the rows the task trains on (a SQL predicate over the table; None: all)
    shared: bool = False  # the table holds several tasks' rows, told apart by a `task` column
    dataset: str | None = None  # fixed warehouse dataset (text corpora); None: every EHR dataset


@dataclass(frozen=True)
class CohortExclusion:
    """One exclusion of the task's cohort flow (the card's attrition, medtx.evaluation.population), declared in the
    task's file in the order its builder applies it. `counted` says how the flow counts it:
    - "stored": the builder stored `excluded_<reason>` in samples.task_summary;
    - "admissions": `rule` is SQL over one of the dataset's admissions (raw.admissions, one row per hadm_id as the
      builders read it, `admission_type` upper-cased and trimmed), counted among the admissions the earlier
      "admissions" rules left (the first rule that holds takes the admission);
    - "figures": `figures` names two samples.task_summary figures, before and after it (excluded = before - after).
    """

    reason: str  # a key (the summary's `excluded_<reason>` when stored)
    words: str  # what it leaves out, in words ("excluded: <words>" on the card)
    rule: str | None = None  # the rule as SQL (or words where no SQL says it), shown beside the count
    counted: Literal["stored", "admissions", "figures"] = "stored"
    figures: tuple[str, str] | None = None  # (before, after), for counted="figures"

    def __post_init__(self) -> None:
        if (self.counted == "figures") != (self.figures is not None):
            raise ValueError(f"cohort exclusion {self.reason!r}: `figures` goes with counted='figures' only")
        if self.counted == "admissions" and not self.rule:
            raise ValueError(f"cohort exclusion {self.reason!r}: counted='admissions' needs its SQL in `rule`")


@dataclass(frozen=True)
class Lineage:
    """How the samples are built and what that reads and writes: the pipeline's cache lineage comes from here
    (tests/test_lineage.py enforces it). `builds` names the task whose builder fills this task's sample table (a
    task trained on another task's samples, e.g. the note-text view of readmission, builds nothing itself)."""

    build: Builder | None = None
    builds: str | None = None  # None: this task builds its own samples
    reads: tuple[str, ...] = ()  # tables the builder reads
    writes: tuple[str, ...] = ()  # tables the builder writes (sample table + bookkeeping)
    train_reads: tuple[str, ...] = ()  # extra tables training reads beyond samples/splits/vocab/oracle
    files: tuple[str, ...] = ()  # data_dir-relative files/folders the builder reads (hashed into cache keys)
    # The builder's exclusions in the order it applies them: the card's cohort flow reads them (a task built by
    # another reads that task's)
    exclusions: tuple[CohortExclusion, ...] = ()


@dataclass(frozen=True)
class Scoring:
    """How a run of the task is selected and scored."""

    metrics: tuple[str, ...]  # headline test metrics, in leaderboard order
    monitor: str  # validation metric that drives early stopping
    tune_metric: str | None = None  # validation metric the decision threshold maximises (None: fixed 0.5)
    recall_ks: tuple[int, ...] = ()
    # What the paired comparisons against the reference baseline are made on (medtx.evaluation.comparisons): the
    # headline metric first, then the set (thresholded) metric, as (metric, averaging). (): no comparisons.
    compared: tuple[tuple[str, str], ...] = ()


def ehr_lineage(table: str, build: Builder, *, reads: tuple[str, ...] = EHR_VISIT_READS, writes: tuple[str, ...] = (),
                train_reads: tuple[str, ...] = (), files: tuple[str, ...] = (),
                exclusions: tuple[CohortExclusion, ...] = ()) -> Lineage:
    """The lineage of an EHR task's builder: it reads the visit building blocks (`reads`, to which a builder adds
    what else it reads) and writes its sample table, `writes` and the EHR bookkeeping tables."""
    return Lineage(build=build, reads=reads, writes=(table, *writes, *EHR_SAMPLE_EXTRAS), train_reads=train_reads,
                   files=files, exclusions=exclusions)


# The scoring of a binary task: the ranking metrics, early stopping on AUPRC, paired comparisons on the headline
# and the set metric against the reference baseline.
BINARY_SCORING = Scoring(metrics=("auroc", "auprc", "rp80"), monitor="auprc",
                         compared=(("auprc", "none"), ("rp80", "none")))


@dataclass(frozen=True)
class Task:
    """One prediction task, declared once: its identity, clock, samples, lineage and scoring, and the models
    that apply with their per-task defaults."""

    name: str
    kind: Kind
    family: Family
    samples: Samples
    scoring: Scoring
    lineage: Lineage = Lineage()
    clock: Clock = Clock()
    description: str = ""
    order: int = 100  # position in listings (CLI help, leaderboard); ties by name
    # Models that apply: (): any model serving the task's kind and family (so a new model file applies to
    # every task of its kinds without editing them), less `excluded_models`; a listed set is the only ones.
    models: tuple[str, ...] = ()
    excluded_models: tuple[str, ...] = ()
    # model name (or "*" for every model) -> what that model reads of this task: its config defaults (a run's
    # overrides win; e.g. BEHRT's `visit_ages`, the column of per-visit ages), or, for a model without a config,
    # its settings for the task (copy_last's `source` column and `skips_current`, the oracle's `code_column`)
    model_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # model name (or "*") -> trainer defaults for this task (medtx.training.trainer.TrainConfig fields, e.g.
    # length_buckets); a run's overrides win
    train_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A static token prefix without a time rule is refused where the task is declared (and so at every build).
        from medtx.samples.static import check_prefixes

        check_prefixes(self.name, self.clock.static_tokens)

    @property
    def binary(self) -> bool:
        return self.kind == "binary"

    @property
    def classifies_text(self) -> bool:
        """A text task whose models classify notes (medtx.training.runners.text trains it, the dashboard's note
        explorer shows it); the FAQ's generation task has its own runner (medtx.training.runners.faq)."""
        return self.family == "text" and self.kind != "generation"

    @property
    def samples_are_admissions(self) -> bool:
        """Each sample is one admission of a patient (its table stores subject_id and hadm_id, split by patient): the
        EHR tasks and the note view of readmission. Their runs get subgroups by the admission's demographics,
        calibration and operating points (medtx.evaluation.trust)."""
        return self.samples.split_unit == "patient" and {"subject_id", "hadm_id"} <= set(self.samples.columns)

    @property
    def module(self) -> str:
        """The module holding the task (its source is in the pipeline's cache keys): `medtx.tasks.<name>`, or its
        builder's own module (a config-declared ACES task's is medtx.aces.task)."""
        import importlib.util

        own = f"medtx.tasks.{self.name}"  # a task file (its builder may be medtx.tasks.outcome's, which it imports)
        build = self.lineage.build
        builder = getattr(build, "func", build)  # a functools.partial names its function's module
        if builder is None or importlib.util.find_spec(own) is not None:
            return own
        return builder.__module__

    @property
    def samples_task(self) -> str:
        """The task whose builder fills the sample table (itself unless `lineage.lineage.builds` says otherwise)."""
        return self.lineage.builds or self.name

    @property
    def unit_name(self) -> str:
        """What the test-set bootstrap resamples, in words (ml.runs.test_unit)."""
        return {"patient": "patients", "text_group": "text groups", "pair": "pairs"}[self.samples.split_unit]

    @property
    def table(self) -> str:
        """The sample table without its schema (`samples.<table>`)."""
        return self.samples.table.split(".", 1)[1]

    def applies_to(self, model: str) -> bool:
        """The task takes this model (the model registry also checks that the model serves the task's kind)."""
        return (not self.models or model in self.models) and model not in self.excluded_models

    def defaults_for(self, model: str) -> dict[str, Any]:
        """The task's config defaults for one model ("*" entries first, the model's own win)."""
        return _for_model(self.model_defaults, model)

    def train_defaults_for(self, model: str) -> dict[str, Any]:
        """The task's trainer defaults for one model ("*" entries first, the model's own win)."""
        return _for_model(self.train_defaults, model)


def _for_model(table: Mapping[str, Mapping[str, Any]], model: str) -> dict[str, Any]:
    """A per-model defaults table read for one model: the "*" entries, then the model's own over them."""
    return {**table.get("*", {}), **table.get(model, {})}
