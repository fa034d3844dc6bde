"""One entry point for every neural EHR model: `build_ehr_model(name, task, vocabs, label_vocab)`.

It returns an `EHRModelBundle`: the model, its config dataclass, and the functions the trainer needs
(encode sample rows, collate a batch, turn a batch into probabilities, and BEHRT's MLM pre-training).
Loop over `EHR_NEURAL_MODELS` (and `MODEL_TASKS`) for benchmarks and results tables.

    vocabs = {f: load_vocab(con, dataset, task, f) for f in required_features(name, task)}
    bundle = build_ehr_model(name, task, vocabs, load_vocab(con, dataset, task, label_feature(task)))
    items = bundle.encode(train_frame)   # rows of samples.<task> for the training patients
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import torch
from torch import Tensor, nn

from medtx.models.behrt import BehrtConfig, BehrtForMultiLabel, pretrain_mlm
from medtx.models.ehr_data import (
    MASK,
    N_TARGET_SPECIALS,
    SEQ2SEQ_SOURCE,
    CodeIndex,
    LabelSpace,
    behrt_codec,
    history_codec,
    seq2seq_codec,
    task_spec,
    vocab_tokens,
)
from medtx.models.rnn import RNNConfig, RNNModel
from medtx.models.seq2seq import Seq2SeqConfig, Seq2SeqForDrugRec
from medtx.models.transformer import TransformerConfig, TransformerModel
from medtx.models.transformer_rope import TransformerRoPEConfig, TransformerRoPEModel
from medtx.tasks import tasks_of_family

EHR_NEURAL_MODELS = ("transformer", "transformer_rope", "behrt", "rnn", "gru", "lstm", "seq2seq")
# Views of the task registry (medtx/tasks/): which EHR tasks list each model, each task's label feature.
MODEL_TASKS: dict[str, tuple[str, ...]] = {
    name: tuple(t.name for t in tasks_of_family("ehr") if t.applies_to(name)) for name in EHR_NEURAL_MODELS
}
LABEL_FEATURE = {t.name: t.label_feature for t in tasks_of_family("ehr")}  # samples.vocab feature


@dataclass
class EHRModelBundle:
    model: nn.Module  # forward(batch, output_attentions=False) -> medtx.models.base.ModelOutput
    config: Any  # the model's config dataclass (dataclasses.asdict -> ml.runs.config JSON)
    encode: Callable[[pl.DataFrame], list[dict]]  # sample-table rows -> items for collate
    collate: Callable[[list[dict]], dict]  # items -> batch dict (tensors + sample_id, subject_id, tokens)
    predict_proba: Callable[[nn.Module, dict], Tensor]  # batch -> [B, n_labels] probabilities
    pretrain: Callable[..., Any] | None = None  # BEHRT: pretrain(train_items, val_items, cfg, out_dir) -> FitResult
    label_names: list[str] = field(default_factory=list)  # column j of labels/probabilities
    generate: Callable[[nn.Module, dict], list[list[str]]] | None = None  # seq2seq: decoded label sequences
    # Data-dependent initialisation from the encoded training items, called once before training
    # (transformer / transformer_rope: output bias = log-odds of each label's training frequency).
    init_from_train: Callable[[list[dict]], None] | None = None

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


# Transformer / Transformer+RoPE config defaults per task (overrides win). drug_rec: the COGNet-style copy
# gate from the previous visit's drugs (medtx.models.transformer.DrugCopyGate), chosen on validation.
TRANSFORMER_TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    t.name: t.defaults_for("transformer") for t in tasks_of_family("ehr") if t.defaults_for("transformer")}
# BEHRT config defaults per task (overrides win), chosen on validation (issue #5; see medtx/models/behrt.py).
# next_visit: the copy gate from the current visit's diagnoses (recency 0); without it BEHRT stayed at the
# label prior on synth_10000 (val PR-AUC 0.198 vs most_frequent 0.199; with it 0.294 at the same budget).
# drug_rec: the copy gate from the previous visit's drugs, as the Transformer (val PR-AUC 0.748 -> 0.777).
BEHRT_TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    t.name: t.defaults_for("behrt") for t in tasks_of_family("ehr") if t.defaults_for("behrt")}


def _behrt_copy_targets(task: str, vocabs: dict[str, Any], labels: LabelSpace, index: CodeIndex,
                        config: BehrtConfig) -> list[int]:
    """Label index of each BEHRT token id that is a code of the copy feature (-1 elsewhere)."""
    features = task_spec(task).features
    feature = config.copy_feature or (features[0] if len(features) == 1 else None)
    if feature not in features:
        raise ValueError(f"BehrtConfig.copy_feature={config.copy_feature!r}: expected one of {list(features)}")
    targets = [-1] * len(index)
    for token in vocab_tokens(vocabs[feature])[2:]:  # idx 0/1 are <pad>/<unk>
        code_id = index.code(feature, token)
        if code_id > 1:
            targets[code_id] = labels.index.get(token, -1)
    return targets


def _copy_targets(vocabs: dict[str, Any], labels: LabelSpace, copy_feature: str | None) -> list[int] | None:
    """Label index of each code id of `copy_feature` (-1: not a label), in the history codec's id order."""
    if copy_feature is None or copy_feature not in vocabs:
        return None  # the model raises a clear error when it was asked to copy from a missing feature
    return [labels.index.get(token, -1) for token in CodeIndex(vocabs, [copy_feature]).labels]


def required_features(name: str, task: str) -> tuple[str, ...]:
    """The samples.vocab features (= sample columns) the model needs a vocabulary for (labels excluded)."""
    _check(name, task)
    return SEQ2SEQ_SOURCE if name == "seq2seq" else task_spec(task).features


def label_feature(task: str) -> str | None:
    """The samples.vocab feature holding the task's label vocabulary (None: binary task)."""
    task_spec(task)
    return LABEL_FEATURE[task]


def _check(name: str, task: str) -> None:
    if name not in EHR_NEURAL_MODELS:
        raise ValueError(f"unknown neural EHR model {name!r}; expected one of {list(EHR_NEURAL_MODELS)}")
    task_spec(task)
    if task not in MODEL_TASKS[name]:
        raise ValueError(f"model {name!r} does not support task {task!r} (supports {list(MODEL_TASKS[name])})")


def _config(cls: type, fixed: dict[str, Any], overrides: dict | None) -> Any:
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


def build_ehr_model(name: str, task: str, vocabs: dict[str, Any], label_vocab: Any,
                    overrides: dict | None = None) -> EHRModelBundle:
    """Model + codec for (model name, task) on these training vocabularies; `overrides` set config fields.

    `vocabs` maps each of `required_features(name, task)` to its `medtx.samples.vocab.Vocab`;
    `label_vocab` is the task's label vocabulary (ignored for the binary readmission task).
    """
    _check(name, task)
    spec = task_spec(task)
    labels = LabelSpace.from_vocab(label_vocab, spec.binary, spec.label_name)
    n_labels = len(labels)

    if name in ("transformer", "transformer_rope", "rnn", "gru", "lstm"):
        sizes = {f: len(vocab_index) for f, vocab_index in history_codec(task, vocabs, labels, 1, 1).index.items()}
        fixed: dict[str, Any] = {"n_labels": n_labels, "vocab_sizes": sizes, "features": spec.features}
        if name in ("rnn", "gru", "lstm"):
            config = _config(RNNConfig, {**fixed, "cell": name}, overrides)
            model: nn.Module = RNNModel(config)
        else:
            cls, config_cls = ((TransformerModel, TransformerConfig) if name == "transformer"
                               else (TransformerRoPEModel, TransformerRoPEConfig))
            config = _config(config_cls, fixed, {**TRANSFORMER_TASK_DEFAULTS.get(task, {}), **(overrides or {})})
            model = cls(config, _copy_targets(vocabs, labels, config.copy_feature))
        codec = history_codec(task, vocabs, labels, config.max_visits, config.max_codes)
        init = None
        if isinstance(model, TransformerModel):
            def init(train_items: list[dict]) -> None:
                chunks = range(0, len(train_items), 1024)  # bounded memory at full-MIMIC scale
                model.init_from_train(codec.collate(train_items[i: i + 1024]) for i in chunks)
        return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba, label_names=labels.names,
                              init_from_train=init)

    if name == "behrt":
        index = behrt_codec(task, vocabs, labels, 1).index
        fixed = {"vocab_size": len(index), "n_labels": n_labels, "n_codes": index.n_codes,
                 "mask_id": index.special(MASK)}
        config = _config(BehrtConfig, fixed, {**BEHRT_TASK_DEFAULTS.get(task, {}), **(overrides or {})})
        codec = behrt_codec(task, vocabs, labels, config.max_len)
        model = BehrtForMultiLabel(config, _behrt_copy_targets(task, vocabs, labels, codec.index, config)
                                   if config.copy_recencies else None)

        def pretrain(train_items: list[dict], val_items: list[dict], cfg: Any, out_dir: Path) -> Any:
            return pretrain_mlm(model, codec, train_items, val_items, cfg, out_dir)

        def init_behrt(train_items: list[dict]) -> None:
            chunks = range(0, len(train_items), 1024)  # bounded memory at full-MIMIC scale
            model.init_from_train(codec.collate(train_items[i: i + 1024]) for i in chunks)

        return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba, pretrain=pretrain,
                              label_names=labels.names, init_from_train=init_behrt)

    # seq2seq (drug_rec)
    index = seq2seq_codec(vocabs, labels, 1, 1).index
    fixed = {"src_vocab_size": len(index), "tgt_vocab_size": N_TARGET_SPECIALS + n_labels}
    config = _config(Seq2SeqConfig, fixed, overrides)
    model = Seq2SeqForDrugRec(config)
    codec = seq2seq_codec(vocabs, labels, config.max_src, config.max_tgt)

    def generate(m: nn.Module, batch: dict) -> list[list[str]]:
        return m.generate(batch, labels.names)

    # In eval mode Seq2SeqForDrugRec's logits already are the decoded label scores (noisy-OR over the
    # greedy decode), so the sigmoid default applies and the trainer decodes once per batch.
    return EHRModelBundle(model, config, codec.encode, codec.collate, sigmoid_proba, label_names=labels.names,
                          generate=generate)


def load_ehr_model(name: str, task: str, vocabs: dict[str, Any], label_vocab: Any, folder: Path,
                   device: str = "cpu") -> EHRModelBundle:
    """Rebuild a bundle from a checkpoint folder (config.json + model.safetensors) written by the trainer.

    The vocabularies must be the ones the model was trained on: a size mismatch is a clear error naming
    the field, instead of a shape error deep inside safetensors.
    """
    from medtx.training.trainer import load_weights

    folder = Path(folder)
    saved = json.loads((folder / "config.json").read_text()).get("model") or {}
    bundle = build_ehr_model(name, task, vocabs, label_vocab)
    current = dataclasses.asdict(bundle.config)
    derived = ("n_labels", "vocab_sizes", "vocab_size", "src_vocab_size", "tgt_vocab_size", "n_codes")
    mismatch = {k: (saved[k], current[k]) for k in derived if k in saved and saved[k] != current[k]}
    if mismatch:
        raise ValueError(f"vocab/label mismatch between checkpoint {folder} and the current vocabularies "
                         f"(saved, current): {mismatch}")
    overrides = {k: (tuple(v) if isinstance(v, list) else v) for k, v in saved.items()
                 if k in current and k not in derived and k not in ("features", "mask_id", "cell")}
    if "pooling" in current and saved and "pooling" not in saved:
        # checkpoints from before the option: the transformer pooled by masked mean, BEHRT by its [CLS] pooler
        overrides["pooling"] = "cls" if name == "behrt" else "mean"
    if "copy_feature" in current and saved and "copy_feature" not in saved:
        overrides["copy_feature"] = None  # checkpoints from before the copy gate have none
    if "copy_recencies" in current and saved and "copy_recencies" not in saved:
        overrides["copy_recencies"] = ()  # BEHRT checkpoints from before its copy gate have none
    bundle = build_ehr_model(name, task, vocabs, label_vocab, overrides)
    load_weights(bundle.model, folder, device)
    return bundle
