"""The FAQ runner (medtx.training.runners): question answering on the Mental Health FAQ (98 pairs), seq2seq
generation vs nearest-question retrieval.

Protocol (k-fold over held-out paraphrases, k = the folds of `samples.faq`): for fold k the model trains on all
98 original questions -> answers plus the paraphrases of the other folds, and is tested on the paraphrases of
fold k, whose wording it has never seen. Predictions of all folds are pooled; metrics are token F1 (SQuAD-style
bag-of-words overlap on lower-cased word tokens) and exact match, mean ± sd over resamples of 80% of pairs.
A question answered by memorising answers scores well here only if it maps the new wording to the right pair.

Models: the registry's FAQ family, each registering its build (ModelContext -> FAQAnswerer) and settings in its
own file: `seq2seq` (medtx/models/seq2seq.py) — `Seq2SeqTransformer` over word tokens, greedy decoding, trained
with the shared trainer; `retrieval` (medtx/models/text_baselines.py) — the answer of the most similar indexed
question (TF-IDF cosine, or MiniLM sentence embeddings with `embedding=minilm`). This runner hands them the
text layer's pieces (`_FAQTools`: word vocabulary, trainer, sentence embedder) and never names a model.

No warehouse here (pairs are a pyarrow Table; no polars, no DuckDB): the worker trains FAQ runs from a training
package (`FaqRunner`, `RUNNER`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from medtx.metrics.bootstrap import N_BOOT, bootstrap
from medtx.metrics.collapse import is_collapsed
from medtx.models import frames
from medtx.models.bounds import BatchSize, Device, Epochs, LearningRate, Patience, Positive
from medtx.models.registry import merge_settings
from medtx.tasks import Task, tasks_of_kind
from medtx.training.packages import package_table
from medtx.training.results import RunResults
from medtx.training.runners import OnEpoch

log = logging.getLogger("medtx.text")

MODEL_FAMILY = "faq"  # the model registry's family of question-answering models (medtx.models.registry)


SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3, matching Seq2SeqConfig pad/bos/eos defaults
_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass
class FAQTrainerConfig:
    """The FAQ runner's trainer settings (field types: bounds checked at config load, medtx.models.bounds)."""

    epochs: Epochs = 60
    batch_size: BatchSize = 16
    lr: LearningRate = 1e-3
    patience: Patience = 10
    device: Device = "auto"


@dataclass
class FAQReportConfig:
    n_boot: Positive = N_BOOT  # bootstrap resamples of the answer scores


def _model_settings() -> tuple[type, ...]:
    """The settings classes every FAQ model declares in its own file (ModelSpec.settings), each once."""
    from medtx.models.registry import specs

    out: list[type] = []
    for spec in specs(MODEL_FAMILY):
        out += [cls for cls in spec.settings if cls not in out]
    return tuple(out)


# Everything an FAQ run is configured by, one flat dataclass whose fields are the override keys: each FAQ
# model's settings (declared in its file), the trainer's and the report's.
FAQConfig = merge_settings("FAQConfig", (*_model_settings(), FAQTrainerConfig, FAQReportConfig), module=__name__)


def words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens."""
    return _WORD.findall(text.lower())


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token F1: harmonic mean of precision and recall of the shared word multiset (punctuation dropped)."""
    pred = [w for w in words(prediction) if w.isalnum()]
    ref = [w for w in words(reference) if w.isalnum()]
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, reference: str) -> float:
    return float([w for w in words(prediction) if w.isalnum()] == [w for w in words(reference) if w.isalnum()])


def fold_splits(faq: pa.Table) -> list[tuple[list[str], list[str], pa.Table]]:
    """Per fold: (training questions, their answers, the held-out paraphrase rows of the fold)."""
    faq = frames.arrow(faq)
    questions, answers = frames.values(faq, "question"), frames.values(faq, "answer")
    paraphrases, folds = frames.values(faq, "paraphrase"), frames.values(faq, "fold")
    rows = [i for i, p in enumerate(paraphrases) if p is not None]
    if not rows:
        raise ValueError("samples.faq has no paraphrases: the FAQ protocol tests on held-out paraphrases")
    out = []
    for fold in sorted(set(folds)):
        others = [i for i in rows if folds[i] is not None and folds[i] != fold]
        held_out = pa.array([i for i in rows if folds[i] == fold], pa.int64())
        out.append((questions + [paraphrases[i] for i in others], answers + [answers[i] for i in others],
                    faq.take(held_out)))
    return out


class WordVocab:
    """Word -> id over training texts; ids 0..3 are <pad> <bos> <eos> <unk>."""

    def __init__(self, texts: Sequence[str]) -> None:
        counts = Counter(w for t in texts for w in words(t))
        self.itos = list(SPECIALS) + sorted(counts)
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def ids(self, text: str, limit: int) -> list[int]:
        return [self.stoi.get(w, 3) for w in words(text)[:limit]]

    def text(self, ids: Sequence[int]) -> str:
        return " ".join(self.itos[i] for i in ids if i >= len(SPECIALS))


@dataclass(frozen=True)
class _FAQTools:
    """The text layer's pieces handed to an FAQ model's build (medtx.models.registry.FAQTools)."""

    cfg: Any  # FAQConfig
    seed: int

    @property
    def device(self) -> str:
        from medtx.training.trainer import resolve_device

        return resolve_device(self.cfg.device)

    def word_vocab(self, texts: Sequence[str]) -> WordVocab:
        return WordVocab(texts)

    def train(self, model, items: list[dict], collate, folder: Path, on_epoch=None):
        # No held-out data may steer training: select on the training loss itself (monitor="loss" over the
        # training pairs); the fold's paraphrases are only decoded at the end.
        from medtx.training.trainer import TrainConfig, fit

        train_cfg = TrainConfig(epochs=self.cfg.epochs, batch_size=self.cfg.batch_size, lr=self.cfg.lr,
                                patience=self.cfg.patience, seed=self.seed, device=self.cfg.device, monitor="loss")
        return fit(model, items, items, collate, train_cfg, folder, on_epoch=on_epoch)

    def sentence_embedder(self):
        """Mean-pooled MiniLM sentence embeddings (the all-MiniLM-L6-v2 recipe); needs the minilm extra."""
        from medtx.models.bert_text import load_encoder, minilm_dir
        from medtx.text.tokenize import load_tokenizer

        path = minilm_dir()
        tokenizer, encoder = load_tokenizer(path), load_encoder("local", path).eval()

        @torch.no_grad()
        def embed(texts: Sequence[str]) -> np.ndarray:
            enc = tokenizer(list(texts), padding=True, truncation=True, max_length=128, return_tensors="pt")
            hidden = encoder(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            return ((hidden * mask).sum(1) / mask.sum(1)).numpy()

        return embed


def answer_questions(faq: pa.Table, spec, cfg: Any, seed: int, folder: Path,
                     on_epoch=None) -> tuple[list[tuple[int, str]], dict]:
    """(pair_id, answer) for every held-out paraphrase: the model (its registered build) learns each fold's
    pairs and answers the fold's paraphrases; and what it reports (n_params, best_epochs, train_seconds)."""
    from medtx.models.registry import ModelContext

    answerer = spec.build(ModelContext(settings=cfg, seed=seed, tools=_FAQTools(cfg, seed)))
    out = []
    for k, (questions, answers, test) in enumerate(fold_splits(faq)):
        given = answerer.answer(k, questions, answers, frames.values(test, "paraphrase"), folder / f"fold{k}",
                                (lambda e, m, k=k: on_epoch(k, e, m)) if on_epoch else None)
        out += list(zip(frames.values(test, "pair_id"), given, strict=True))
    return out, answerer.info


def score_answers(faq: pa.Table, answers: list[tuple[int, str]], *, n_boot: int, seed: int):
    """Metric rows (token_f1, exact_match: mean ± sd over 80% of pairs) and the ml.predictions frame."""
    reference = dict(zip(frames.values(faq, "pair_id"), frames.values(faq, "answer"), strict=True))
    ids = np.array([p for p, _ in answers])
    f1 = np.array([token_f1(a, reference[p]) for p, a in answers])
    em = np.array([exact_match(a, reference[p]) for p, a in answers])
    boot = bootstrap(lambda idx: {"token_f1": float(f1[idx].mean()), "exact_match": float(em[idx].mean())},
                     ids, n_boot=n_boot, seed=seed)
    metrics = [(m, "none", boot[m][0], boot[m][1], n_boot) for m in ("token_f1", "exact_match")]
    predictions = pa.table({"sample_id": pa.array([str(p) for p in ids], pa.string()),
                            "label": pa.array(["answer"] * len(ids), pa.string()), "prob": f1,
                            "y_true": em.astype(bool), "predicted": em.astype(bool),
                            "text": pa.array([a for _, a in answers], pa.string())})
    return metrics, predictions


def faq_model(model: str):
    """The registered FAQ model (its ModelSpec); an unknown name is an error naming the known ones."""
    from medtx.models.registry import model_names, specs

    spec = next((s for s in specs(MODEL_FAMILY) if s.name == model), None)
    if spec is None:
        raise ValueError(f"unknown FAQ model {model!r}; choose one of {model_names(MODEL_FAMILY)}")
    return spec


def faq_config(overrides: dict[str, Any] | None = None) -> Any:
    """The run's FAQConfig: defaults < overrides; unknown keys are an error naming the known ones."""
    known = {f.name for f in dataclasses.fields(FAQConfig)}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise ValueError(f"unknown FAQ config keys {unknown}; known: {sorted(known)}")
    return FAQConfig(**(overrides or {}))


def faq_task() -> Task:
    """The registry's generation task (the one this runner trains)."""
    found = tasks_of_kind("generation")
    if len(found) != 1:
        raise ValueError(f"the FAQ runner trains one generation task; the registry has {[t.name for t in found]}")
    return found[0]


def faq_pairs(rows: Any, task: Task) -> pa.Table:
    """The question-answer pairs with their paraphrases and folds (the task's sample columns), by pair id; an
    empty table is an error naming the command that builds it."""
    rows = frames.arrow(rows).select(list(task.samples.columns))
    if rows.num_rows == 0:
        raise ValueError(f"{task.samples.table} is empty: run `medtx build-samples --task {task.name}`")
    return rows.sort_by("pair_id")


def answer_and_score(faq: pa.Table, spec, cfg: Any, seed: int, folder: Path, on_epoch) -> RunResults:
    """Fit and answer every fold's held-out paraphrases, score the answers, and say what to record."""
    # ml.epochs is keyed by epoch only: record fold 0's curve (the others follow the same recipe).
    def fold_epoch(fold, epoch, metrics):
        if fold == 0:
            on_epoch(epoch, metrics)

    answers, info = answer_questions(faq, spec, cfg, seed, folder, fold_epoch)
    metrics, predictions = score_answers(faq, answers, n_boot=cfg.n_boot, seed=seed)
    collapsed, reason = is_collapsed([a for _, a in answers])  # one answer for every question
    return RunResults(
        metrics={"test": metrics}, predictions=predictions,
        summary={"collapsed": collapsed, "collapse_reason": reason, "n_params": info.get("n_params"),
                 "train_seconds": info.get("train_seconds"), "best_epoch": (info.get("best_epochs") or [None])[0]},
    )


# ----------------------------------------------------------------------------------------------- the runner


@dataclass(frozen=True)
class FaqRun:
    """One FAQ run, its model and config checked (medtx.training.runners.Run): `samples` are the pairs."""

    task: Task
    spec: Any  # the FAQ model's ModelSpec
    seed: int
    cfg: Any  # FAQConfig

    def samples(self, tables: Any, dataset: str) -> pa.Table:
        return faq_pairs(package_table(tables, self.task.samples.table), self.task)

    def describe(self, samples: pa.Table) -> dict[str, Any]:
        return {"faq": dataclasses.asdict(self.cfg), "protocol": "kfold_paraphrase"}

    def train(self, samples: pa.Table, folder: Path, on_epoch: OnEpoch, cache: Path | None = None) -> RunResults:
        return answer_and_score(samples, self.spec, self.cfg, self.seed, folder, on_epoch)


class FaqRunner:
    """The FAQ models on the generation task (medtx.training.runners.Runner)."""

    model_families = (MODEL_FAMILY,)
    modules = ("medtx.training.runners.faq",)
    code_parts = ("text", "models", "training")

    def serves(self, task: Task) -> bool:
        return task.kind == "generation"

    def prepare(self, task: Task, model: str, seed: int, overrides: Any, *, device: str = "auto") -> FaqRun:
        return FaqRun(task, faq_model(model), seed, faq_config({"device": device, **overrides}))

    def config_classes(self, spec: Any, task: Task) -> list[tuple[type, dict[str, Any]]]:
        return [(FAQConfig, {})]


RUNNER = FaqRunner()
