"""One registry of every model medtx trains: each model file registers itself, everything else reads views.

A model file calls `register_model(ModelSpec(...))` at import time: its name, family (which runner trains
it), the task kinds it serves, its config dataclass, its defaults, and (neural EHR models) how to build it.
Adding a model is adding one file to medtx/models: `specs()` imports every module of the package once.

Views: `ehr_neural_models()`, `model_tasks()` (neural EHR model -> tasks it serves), `model_names(family, kind)`,
`model_defaults(model, task)`. A function here about a task takes its `Task` record, not its name. The neural EHR
entry point:

    task = get_task("drug_rec")          # a name is resolved once, where it enters; the Task travels
    vocabs = {f: load_vocab(con, dataset, task.name, f) for f in required_features(name, task)}
    bundle = build_ehr_model(name, task, vocabs, load_vocab(con, dataset, task.name, task.samples.label_feature))
    items = bundle.encode(train_frame)   # rows of samples.<task> for the training patients
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from medtx.models.checkpoint import load_weights, saved_model_config
from medtx.models.ehr_data import LabelSpace
from medtx.models.encoded import EncodedSet
from medtx.models.frames import Frame
from medtx.tasks import Task, tasks_of_family

KINDS = ("multilabel", "binary", "multiclass", "generation")
# Which runner trains the model, and how error messages name the family.
FAMILIES = {"ehr": "neural EHR", "ehr_baseline": "EHR baseline", "text": "neural text",
            "text_baseline": "text baseline", "faq": "FAQ"}
# The model families that can train a task of each task family (generation: the FAQ runner).
TASK_FAMILY_MODELS = {"ehr": ("ehr", "ehr_baseline"), "text": ("text_baseline", "text")}
# Config fields computed from the vocabularies: never overridden, and compared when a checkpoint is loaded.
DERIVED_FIELDS = ("n_labels", "vocab_sizes", "vocab_size", "src_vocab_size", "tgt_vocab_size", "n_codes")


@dataclass
class MaskedLM:
    """What a model offers for masked-LM pre-training; `medtx.training.pretrain.pretrain_mlm` runs it."""

    # Builds the MLM head over the fine-tuning model's (shared) encoder; built only when pre-training
    # starts, so the head's random init draws from the same generator state as before this registry.
    make_model: Callable[[], nn.Module]
    collate: Callable[[list[dict]], dict]  # the model's collate (labels included; masking is added on top)
    config: Any  # masking settings: mlm_prob, mask_id, n_codes


@dataclass
class EHRModelBundle:
    model: nn.Module  # forward(batch, output_attentions=False) -> medtx.models.base.ModelOutput
    config: Any  # the model's config dataclass (dataclasses.asdict -> ml.runs.config JSON)
    encode: Callable[[Frame], list[dict]]  # sample-table rows -> items for collate
    collate: Callable[[list[dict]], dict]  # items -> batch dict (tensors + sample_id, subject_id, tokens)
    predict_proba: Callable[[nn.Module, dict], Tensor]  # batch -> [B, n_labels] probabilities
    mlm: MaskedLM | None = None  # BEHRT: pre-trained with masked LM before fine-tuning
    label_names: list[str] = field(default_factory=list)  # column j of labels/probabilities
    generate: Callable[[nn.Module, dict], list[list[str]]] | None = None  # seq2seq: decoded label sequences
    # Data-dependent initialisation from the encoded training items (or their EncodedSet), called once before
    # training (e.g. output bias = log-odds of each label's training frequency).
    init_from_train: Callable[[Sequence[dict] | EncodedSet], None] | None = None

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


class TextTools(Protocol):
    """The text layer's pieces a text model's `build` may use (medtx.training.text_fitting provides them), handed down
    so that models never import medtx.text or medtx.training. The tokenizer settings (vocab size) are bound."""

    tokenizer_key: tuple[Any, ...]  # the tokenizer settings, for cache keys

    def train_tokenizer(self, texts: list[str]) -> Any: ...  # WordPiece trained on these (training) notes

    def load_tokenizer(self, path: str | Path) -> Any: ...

    def sequence_collate(self, tokenizer: Any, *, max_len: int, with_tokens: bool) -> Callable[[list[dict]], dict]: ...

    def chunk_collate(self, tokenizer: Any, *, max_len: int, stride: int, max_chunks: int | None,
                      with_tokens: bool) -> Callable[[list[dict]], dict]: ...

    def pretrain_mlm(self, bert_config: Any, tokenizer: Any, train_texts: list[str], val_texts: list[str],
                     folder: Path, *, epochs: int, batch_size: int, lr: float, seed: int, max_len: int,
                     max_windows: int | None) -> Path: ...  # MLM pre-training (loss on val_texts): encoder folder


@dataclass
class TextModelBundle:
    """A neural text model as its `build` returns it; the text runner trains it with the shared trainer."""

    tokenizer: Any  # turns notes into ids (saved beside the checkpoint)
    model: nn.Module  # forward(batch, output_attentions=False) -> ModelOutput; BERT models expose `.encoder`
    make_collate: Callable[..., Callable[[list[dict]], dict]]  # make_collate(with_tokens=False) -> collate
    checkpoints: dict[str, Path] = field(default_factory=dict)  # extra folders (kind -> folder) to record


class FAQTools(Protocol):
    """The text layer's pieces an FAQ model's `build` may use (medtx.training.runners.faq provides them)."""

    device: str  # where the run's models train and decode (the trainer's resolved device)

    def word_vocab(self, texts: list[str]) -> Any: ...  # words -> ids (`ids(text, limit)`, `text(ids)`, len)

    def train(self, model: nn.Module, items: list[dict], collate: Callable[[list[dict]], dict], folder: Path,
              on_epoch: Callable | None = None) -> Any: ...  # the shared trainer with the run's trainer settings,
    # selecting on the training loss (no held-out question steers training); returns its FitResult

    def sentence_embedder(self) -> Callable[[list[str]], Any]: ...  # MiniLM mean-pooled sentence embeddings


@dataclass
class FAQAnswerer:
    """An FAQ model as its `build` returns it: `answer(fold, questions, answers, queries, folder, on_epoch)`
    learns the fold's (question, answer) pairs and answers its held-out queries; `info` what the run records
    (n_params, best_epochs, train_seconds)."""

    answer: Callable[..., list[str]]
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelContext:
    """What every model's `build` gets (ModelSpec.build: the one build contract); each family's runner fills the
    fields its models read and leaves the rest at their defaults.

    - neural EHR models: `task`, `vocabs` (its training vocabularies), `labels`, `overrides` (the model's defaults
      for this task, then the run's overrides) -> EHRModelBundle;
    - EHR baselines: `task`, `labels`, `overrides` (the run's), `seed`, `oracle_rows` (the oracle's) -> a baseline
      (`fit`, `predict_proba`, `fixed_threshold`, `config`);
    - text models and text baselines: `task`, `settings` (the run's flat text settings), the training and validation
      notes, `n_outputs`, `binary`, `class_weights`, `seed`, `cache`, `tools` (TextTools; None for the
      scikit-learn baselines) -> TextModelBundle, or an unfitted scikit-learn classifier;
    - FAQ models: `settings` (the run's flat FAQ settings), `seed`, `tools` (FAQTools) -> FAQAnswerer.

    `config(Cls)` cuts a model's own config (a `ModelSpec.settings` class) out of the run's flat settings, whose
    keys are the YAML/CLI override keys."""

    task: Task | None = None
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    vocabs: dict[str, Any] = field(default_factory=dict)
    labels: LabelSpace | None = None
    oracle_rows: Frame | None = None  # the generator's rows (raw.synth_oracle_<task>) for the oracle baseline
    settings: Any = None  # text: medtx.training.text_config.TextConfig; FAQ: medtx.training.runners.faq.FAQConfig
    train_texts: list[str] = field(default_factory=list)
    val_texts: list[str] = field(default_factory=list)
    n_outputs: int = 0  # classes, or 1 (binary)
    binary: bool = False
    class_weights: Tensor | None = None  # CE loss weights (multi-class), from the runner's class_weighting
    cache: Path | None = None  # a folder shared by the runs of one models folder (pre-trained encoders)
    tools: Any = None  # TextTools or FAQTools: the text runner's pieces, handed down (models import no runner)

    def config(self, cls: type) -> Any:
        return cls(**{f.name: getattr(self.settings, f.name) for f in dataclasses.fields(cls)})


def merge_settings(name: str, parts: Sequence[type], module: str) -> type:
    """One flat dataclass holding every field of `parts` (in order; a field two parts share must agree in
    type and default), whose `__post_init__` builds each part so its own checks run. The flat keys are what a
    YAML/CLI `overrides` mapping sets; the bounds of each field (medtx.models.bounds) come along."""
    import typing

    fields: dict[str, tuple[str, Any, Any]] = {}
    for part in parts:
        hints = typing.get_type_hints(part, include_extras=True)
        for f in dataclasses.fields(part):
            entry = (f.name, hints[f.name], dataclasses.field(default=f.default))
            if f.name in fields and (fields[f.name][1] != entry[1] or fields[f.name][2].default != f.default):
                raise ValueError(f"{name}: field {f.name!r} of {part.__name__} disagrees with another part's")
            fields.setdefault(f.name, entry)

    def __post_init__(self) -> None:
        for part in parts:
            part(**{f.name: getattr(self, f.name) for f in dataclasses.fields(part)})

    merged = dataclasses.make_dataclass(name, list(fields.values()), namespace={"__post_init__": __post_init__,
                                                                            "parts": tuple(parts)})
    merged.__module__ = module  # where it is bound, so it pickles and reads as that module's class
    return merged


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # one of FAMILIES
    kinds: tuple[str, ...]  # task kinds served (KINDS)
    # the config dataclass (None: the family's own, e.g. text models' TextConfig; an EHR baseline registering none
    # takes no overrides)
    config: type | None = None
    # ModelContext -> the model (the one build contract; see ModelContext for what each family gets and returns)
    build: Callable[[Any], Any] | None = None
    # text and FAQ models: the config dataclasses holding the settings the model reads (flat keys, bounds
    # declared on the fields); a run's settings are its runner's and every model of the family's, merged
    settings: tuple[type, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)  # for every task
    kind_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # task kind -> defaults
    # Per-task defaults live with the tasks (`Task.model_defaults`); a model that shares another's per-task
    # defaults names it here (transformer_rope takes the transformer's).
    task_defaults_of: str | None = None
    source_features: tuple[str, ...] | None = None  # sample features it reads (None: all the task's features)
    # Values of config fields a checkpoint written before the field existed was trained with.
    checkpoint_defaults: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 100  # display order in tables and benchmarks (lower first)
    # a non-neural model that may be its task's reference baseline (medtx.evaluation.comparisons): its place in
    # the fixed preference order used when no candidate recorded a validation figure (lower first)
    reference: int | None = None
    # reads the synthetic generator's own label probabilities (raw.synth_oracle_<task>): trains on synthetic
    # cohorts only, and its training step carries those tables
    reads_generator: bool = False

    def serves(self, task: Task) -> bool:
        """The model serves the task's kind, finds the sample features it reads, and the task takes it."""
        needed = self.source_features or ()
        return task.kind in self.kinds and all(f in task.samples.features for f in needed) and task.applies_to(self.name)


_SPECS: dict[tuple[str, str], ModelSpec] = {}
_DISCOVERED = False


def register_model(spec: ModelSpec) -> ModelSpec:
    """Add a model (called by its own file at import time); a second model of that name and family is an error."""
    if spec.family not in FAMILIES:
        raise ValueError(f"model {spec.name!r}: unknown family {spec.family!r}; expected one of {list(FAMILIES)}")
    unknown = sorted(set(spec.kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"model {spec.name!r}: unknown task kind(s) {unknown}; expected among {KINDS}")
    key = (spec.family, spec.name)
    if key in _SPECS and _SPECS[key] != spec:
        raise ValueError(f"model {spec.name!r} ({spec.family}) is registered twice")
    _SPECS[key] = spec
    return spec


def specs(family: str | None = None) -> list[ModelSpec]:
    """Every registered model (of one family), in display order; imports each medtx.models module once."""
    global _DISCOVERED
    if not _DISCOVERED:
        package = importlib.import_module("medtx.models")
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"medtx.models.{module.name}")
        _DISCOVERED = True
    chosen = [s for s in _SPECS.values() if family is None or s.family == family]
    return sorted(chosen, key=lambda s: (s.rank, s.name))


def get_spec(name: str, family: str = "ehr") -> ModelSpec:
    known = {s.name: s for s in specs(family)}
    if name not in known:
        raise ValueError(f"unknown {FAMILIES[family]} model {name!r}; expected one of {list(known)}")
    return known[name]


def reads_generator(name: str) -> bool:
    """Whether the model called `name` (of any family) reads the synthetic generator's tables (ModelSpec)."""
    return any(s.reads_generator for s in specs() if s.name == name)


def model_names(family: str, kind: str | None = None) -> tuple[str, ...]:
    return tuple(s.name for s in specs(family) if kind is None or kind in s.kinds)


def ehr_models_for(task: Task, families: tuple[str, ...] = ("ehr", "ehr_baseline")) -> tuple[str, ...]:
    """The EHR models (neural, then baselines) that serve this task."""
    return tuple(s.name for f in families for s in specs(f) if s.serves(task))


def model_families(task: Task) -> tuple[str, ...]:
    """The model families that train a task (its family's, or the FAQ's for a generation task)."""
    return ("faq",) if task.kind == "generation" else TASK_FAMILY_MODELS[task.family]


def models_for(task: Task) -> tuple[str, ...]:
    """Every model (of any family that trains the task's family) that applies to the task."""
    return tuple(s.name for f in model_families(task) for s in specs(f) if s.serves(task))


def model_modules(model: str, task: Task) -> tuple[str, ...]:
    """The modules that define the model of that name serving the task (its build and config): its own file,
    which the registry imports by discovery, so no import names it (a training step's cache key adds it)."""
    found = {getattr(part, "__module__", None) for s in specs() if s.name == model and s.serves(task)
             for part in (s.build, s.config)}
    return tuple(sorted(m for m in found if m and m.startswith("medtx.models.")))


def model_defaults(model: str, task: Task, family: str = "ehr") -> dict[str, Any]:
    """A model's config defaults for a task: the model's for every task < for the task's kind < the task's
    own for this model (`Task.defaults_for`, the one home of per-task defaults)."""
    spec = get_spec(model, family)
    task_own = task.defaults_for(spec.task_defaults_of or spec.name)
    return {**spec.defaults, **spec.kind_defaults.get(task.kind, {}), **task_own}


def reference_models() -> tuple[str, ...]:
    """The models that may be a task's reference baseline, in their fixed preference order."""
    return tuple(s.name for s in sorted((s for s in specs() if s.reference is not None), key=lambda s: s.reference))


def ehr_neural_models() -> tuple[str, ...]:
    """The neural EHR models, in table order."""
    return model_names("ehr")


def model_tasks() -> dict[str, tuple[str, ...]]:
    """Neural EHR model -> the EHR tasks it serves."""
    return {s.name: ehr_models_tasks(s) for s in specs("ehr")}


def ehr_models_tasks(spec: ModelSpec) -> tuple[str, ...]:
    return tuple(t.name for t in tasks_of_family("ehr") if spec.serves(t))


# ----------------------------------------------------------------------------------------------- building


def required_features(name: str, task: Task) -> tuple[str, ...]:
    """The samples.vocab features (= sample columns) the model needs a vocabulary for (labels excluded)."""
    spec = _check(name, task)
    return spec.source_features or task.samples.features


def _check(name: str, task: Task) -> ModelSpec:
    spec = get_spec(name, "ehr")
    if task.family != "ehr" or not spec.serves(task):  # the task list is read only for the message
        raise ValueError(f"model {name!r} does not support task {task.name!r} "
                         f"(supports {list(ehr_models_tasks(spec))})")
    return spec


def make_config(cls: type, fixed: dict[str, Any], overrides: dict | None) -> Any:
    """`cls(**fixed, **overrides)`, refusing unknown fields and overrides of data-derived fields."""
    overrides = dict(overrides or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}; fields: {sorted(names - set(fixed))}")
    derived = sorted(set(overrides) & set(fixed))
    if derived:
        raise ValueError(f"{cls.__name__} field(s) {derived} come from the vocabularies and cannot be overridden")
    return cls(**fixed, **overrides)


def sigmoid_proba(model: nn.Module, batch: dict) -> Tensor:
    """Default probabilities: sigmoid of the model's logits."""
    return torch.sigmoid(model(batch).logits.float())


def chunked_init(model: nn.Module, collate: Callable[[list[dict]], dict]
                 ) -> Callable[[Sequence[dict] | EncodedSet], None]:
    """`init_from_train` for a model with `init_from_train(batches)`: 1,024 items at a time (bounded memory at
    full-MIMIC scale), cut from the training set's EncodedSet when given one (the same batches, not collated
    again), else collated."""
    def init(train_items: Sequence[dict] | EncodedSet) -> None:
        chunks = [range(i, min(i + 1024, len(train_items))) for i in range(0, len(train_items), 1024)]
        if isinstance(train_items, EncodedSet):
            model.init_from_train(train_items.batch(chunk) for chunk in chunks)
        else:
            model.init_from_train(collate([train_items[i] for i in chunk]) for chunk in chunks)
    return init


def build_ehr_model(name: str, task: Task, vocabs: dict[str, Any], label_vocab: Any,
                    overrides: dict | None = None) -> EHRModelBundle:
    """Model + codec for (model name, task) on these training vocabularies; `overrides` set config fields.

    `vocabs` maps each of `required_features(name, task)` to its `medtx.samples.vocab.Vocab`;
    `label_vocab` is the task's label vocabulary (ignored for a binary task).
    """
    spec = _check(name, task)
    labels = LabelSpace.from_vocab(label_vocab, task.binary, task.samples.label_name)
    merged = {**model_defaults(name, task), **(overrides or {})}
    return spec.build(ModelContext(task=task, vocabs=vocabs, labels=labels, overrides=merged))


def load_ehr_model(name: str, task: Task, vocabs: dict[str, Any], label_vocab: Any, folder: Path,
                   device: str = "cpu") -> EHRModelBundle:
    """Rebuild a bundle from a checkpoint folder (config.json + model.safetensors) written by the trainer.

    The vocabularies must be the ones the model was trained on: a size mismatch is a clear error naming
    the field, instead of a shape error deep inside safetensors.
    """
    folder = Path(folder)
    saved = saved_model_config(folder)
    current = dataclasses.asdict(build_ehr_model(name, task, vocabs, label_vocab).config)
    overrides = {k: (tuple(v) if isinstance(v, list) else v) for k, v in saved.items()
                 if k in current and k not in DERIVED_FIELDS and k not in ("features", "mask_id", "cell")}
    if saved:  # a checkpoint from before a config field existed was trained without that option
        overrides.update({k: v for k, v in get_spec(name).checkpoint_defaults.items()
                          if k in current and k not in saved})
    bundle = build_ehr_model(name, task, vocabs, label_vocab, overrides)
    # Compared on the model as the checkpoint configures it: the data-derived sizes can depend on its options
    # (the transformer's joint sequence adds vocab_sizes["codes"]).
    current = dataclasses.asdict(bundle.config)
    mismatch = {k: (saved[k], current[k]) for k in DERIVED_FIELDS if k in saved and saved[k] != current[k]}
    if mismatch:
        raise ValueError(f"vocab/label mismatch between checkpoint {folder} and the current vocabularies "
                         f"(saved, current): {mismatch}")
    load_weights(bundle.model, folder, device)
    return bundle
