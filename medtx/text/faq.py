"""FAQ question answering on the Mental Health FAQ (98 pairs): seq2seq generation vs nearest-question retrieval.

Protocol (k-fold over held-out paraphrases, k = the folds of `samples.faq`): for fold k the model trains on all
98 original questions -> answers plus the paraphrases of the other folds, and is tested on the paraphrases of
fold k, whose wording it has never seen. Predictions of all folds are pooled; metrics are token F1 (SQuAD-style
bag-of-words overlap on lower-cased word tokens) and exact match, mean ± sd over resamples of 80% of pairs.
A question answered by memorising answers scores well here only if it maps the new wording to the right pair.

Models: `seq2seq` — `medtx.models.seq2seq.Seq2SeqTransformer` over word tokens, greedy decoding, trained
with the shared trainer; `retrieval` — the answer of the most similar indexed question (TF-IDF cosine, or
MiniLM sentence embeddings with `embedding=minilm`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import polars as pl
import torch

from medtx.store.db import quote_ident, quote_table
from medtx.store.fingerprint import tables_fingerprint
from medtx.metrics.bootstrap import N_BOOT, bootstrap
from medtx.metrics.collapse import is_collapsed
from medtx.models.bounds import BatchSize, DropoutRate, Device, Epochs, Heads, Layers, LearningRate, Length, Patience
from medtx.models.bounds import Positive, Width, check_heads
from medtx.tasks import Task, tasks_of_kind
from medtx.training.skeleton import RunPlan, execute_run
from medtx.training import records

log = logging.getLogger("medtx.text")

MODEL_FAMILY = "faq"  # the model registry's family of question-answering models (medtx.models.registry)


SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")  # ids 0..3, matching Seq2SeqConfig pad/bos/eos defaults
_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass
class FAQConfig:
    # field types: bounds checked at config load (medtx.models.bounds)
    embedding: Literal["tfidf", "minilm"] = "tfidf"  # retrieval
    max_src: Length = 32  # question words kept
    max_answer: Length = 64  # answer words generated/trained (answers are cut here; F1 is against the full answer)
    d_model: Width = 64
    n_heads: Heads = 4
    layers: Layers = 2
    dropout: DropoutRate = 0.1
    epochs: Epochs = 60
    batch_size: BatchSize = 16
    lr: LearningRate = 1e-3
    patience: Patience = 10
    device: Device = "auto"
    n_boot: Positive = N_BOOT

    def __post_init__(self) -> None:
        check_heads(self.d_model, self.n_heads)


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


def fold_splits(faq: pl.DataFrame) -> list[tuple[list[str], list[str], pl.DataFrame]]:
    """Per fold: (training questions, their answers, the held-out paraphrase rows of the fold)."""
    rows = faq.filter(pl.col("paraphrase").is_not_null())
    if rows.height == 0:
        raise ValueError("samples.faq has no paraphrases: the FAQ protocol tests on held-out paraphrases")
    out = []
    for fold in sorted(faq["fold"].unique().to_list()):
        others = rows.filter(pl.col("fold") != fold)
        questions = faq["question"].to_list() + others["paraphrase"].to_list()
        answers = faq["answer"].to_list() + others["answer"].to_list()
        out.append((questions, answers, rows.filter(pl.col("fold") == fold)))
    return out


def minilm_embedder():
    """Mean-pooled MiniLM sentence embeddings (the all-MiniLM-L6-v2 recipe); needs the minilm extra."""
    from medtx.models.bert_text import load_encoder, minilm_dir
    from medtx.text.tokenize import load_tokenizer

    tokenizer, encoder = load_tokenizer(minilm_dir()), load_encoder("minilm").eval()

    @torch.no_grad()
    def embed(texts: Sequence[str]) -> np.ndarray:
        enc = tokenizer(list(texts), padding=True, truncation=True, max_length=128, return_tensors="pt")
        hidden = encoder(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        return ((hidden * mask).sum(1) / mask.sum(1)).numpy()

    return embed


def answer_retrieval(faq: pl.DataFrame, cfg: FAQConfig) -> list[tuple[int, str]]:
    """(pair_id, predicted answer) for every held-out paraphrase, by nearest indexed question."""
    from medtx.models.text_baselines import TfidfRetriever

    embed = minilm_embedder() if cfg.embedding == "minilm" else None
    if cfg.embedding not in ("tfidf", "minilm"):
        raise ValueError(f"FAQ retrieval embedding must be tfidf or minilm, got {cfg.embedding!r}")
    out = []
    for questions, answers, test in fold_splits(faq):
        retriever = TfidfRetriever(embed=embed).fit(questions, answers)
        out += list(zip(test["pair_id"].to_list(), retriever.predict(test["paraphrase"].to_list()), strict=True))
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


def _seq2seq_items(src: WordVocab, tgt: WordVocab, questions, answers, cfg: FAQConfig) -> list[dict]:
    return [{"src": src.ids(q, cfg.max_src) or [3], "tgt": [1, *tgt.ids(a, cfg.max_answer), 2]}
            for q, a in zip(questions, answers, strict=True)]


def _collate(items: list[dict]) -> dict:
    def pad(rows):
        out = torch.zeros(len(rows), max(len(r) for r in rows), dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out

    src = pad([it["src"] for it in items])
    # "labels" marks the batch as supervised for the trainer; the loss itself is on tgt_ids.
    return {"src_ids": src, "src_mask": src != 0, "tgt_ids": pad([it["tgt"] for it in items]),
            "labels": torch.zeros(len(items))}


def answer_seq2seq(faq: pl.DataFrame, cfg: FAQConfig, seed: int, out_dir: Path, on_epoch=None) -> tuple[list[tuple[int, str]], dict]:
    """(pair_id, generated answer) for every held-out paraphrase; one model per fold via the shared trainer."""
    from medtx.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer, greedy_decode
    from medtx.training.trainer import TrainConfig, fit, resolve_device

    out, info = [], {"best_epochs": [], "n_params": None, "train_seconds": 0.0}
    for k, (questions, answers, test) in enumerate(fold_splits(faq)):
        src, tgt = WordVocab(questions), WordVocab(answers)
        items = _seq2seq_items(src, tgt, questions, answers, cfg)
        model = Seq2SeqTransformer(Seq2SeqConfig(
            src_vocab_size=len(src), tgt_vocab_size=len(tgt), d_model=cfg.d_model, n_heads=cfg.n_heads,
            n_encoder_layers=cfg.layers, n_decoder_layers=cfg.layers, d_ff=2 * cfg.d_model, dropout=cfg.dropout,
            max_decode_len=cfg.max_answer + 1, max_src=cfg.max_src, max_tgt=cfg.max_answer + 2,
        ))
        # No held-out data may steer training: select on the training loss itself (monitor="loss" over the
        # training pairs); the fold's paraphrases are only decoded at the end.
        train_cfg = TrainConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, patience=cfg.patience,
                                seed=seed, device=cfg.device, monitor="loss")
        result = fit(model, items, items, _collate, train_cfg, out_dir / f"fold{k}",
                     on_epoch=(lambda e, m, k=k: on_epoch(k, e, m)) if on_epoch else None)
        device = resolve_device(cfg.device)
        model.to(device).eval()
        src_rows = [src.ids(p, cfg.max_src) or [3] for p in test["paraphrase"].to_list()]
        batch = _collate([{"src": s, "tgt": [1, 2]} for s in src_rows])
        decoded = greedy_decode(model, batch["src_ids"].to(device), batch["src_mask"].to(device))
        out += list(zip(test["pair_id"].to_list(), [tgt.text(s) for s in decoded.sequences], strict=True))
        info["best_epochs"].append(result.best_epoch)
        info["train_seconds"] += result.train_seconds
        info["n_params"] = sum(p.numel() for p in model.parameters())
    return out, info


def score_answers(faq: pl.DataFrame, answers: list[tuple[int, str]], *, n_boot: int, seed: int):
    """Metric rows (token_f1, exact_match: mean ± sd over 80% of pairs) and the ml.predictions frame."""
    reference = dict(zip(faq["pair_id"].to_list(), faq["answer"].to_list(), strict=True))
    ids = np.array([p for p, _ in answers])
    f1 = np.array([token_f1(a, reference[p]) for p, a in answers])
    em = np.array([exact_match(a, reference[p]) for p, a in answers])
    boot = bootstrap(lambda idx: {"token_f1": float(f1[idx].mean()), "exact_match": float(em[idx].mean())},
                     ids, n_boot=n_boot, seed=seed)
    metrics = [(m, "none", boot[m][0], boot[m][1], n_boot) for m in ("token_f1", "exact_match")]
    predictions = pl.DataFrame({"sample_id": [str(p) for p in ids], "label": ["answer"] * len(ids),
                                "prob": f1, "y_true": em.astype(bool), "predicted": em.astype(bool),
                                "text": [a for _, a in answers]})
    return metrics, predictions


def run_faq_experiment(db: Path | str, model: str, seed: int = 0, overrides: dict[str, Any] | None = None,
                       *, pipeline_run_id: str | None = None, run_id: str | None = None,
                       models_dir: Path | None = None) -> str:
    """One FAQ run (k-fold over held-out paraphrases) into ml.*, through the shared run skeleton
    (medtx.training.skeleton); `ml.predictions.prob` holds each answer's token F1 and `text` the answer given.
    Returns the run id."""
    from medtx.models.registry import model_names

    if model not in model_names(MODEL_FAMILY):
        raise ValueError(f"unknown FAQ model {model!r}; choose one of {model_names(MODEL_FAMILY)}")
    known = {f.name for f in dataclasses.fields(FAQConfig)}
    unknown = sorted(set(overrides or {}) - known)
    if unknown:
        raise ValueError(f"unknown FAQ config keys {unknown}; known: {sorted(known)}")
    cfg = FAQConfig(**(overrides or {}))
    task = faq_task()
    plan = RunPlan(
        task.name, model, task.dataset, seed,
        load=lambda con: load_faq(con, task),
        describe=lambda faq: {"faq": dataclasses.asdict(cfg), "protocol": "kfold_paraphrase"},
        fingerprint=lambda con: tables_fingerprint(con, [task.sample_table]),
        train=lambda faq, folder, on_epoch: _answer_and_score(faq, model, cfg, seed, folder, on_epoch),
        code_parts=("text", "models", "training"),
        run_id=run_id, pipeline_run_id=pipeline_run_id, models_dir=models_dir,
    )
    run_id = execute_run(db, plan)
    log.info("%s %s seed %d: %s", task.name, model, seed,
             {m: round(v, 4) for m, _, v, _, _ in plan.outcome["results"].metrics["test"]})
    return run_id


def faq_task() -> Task:
    """The registry's generation task (the one this runner trains)."""
    found = tasks_of_kind("generation")
    if len(found) != 1:
        raise ValueError(f"the FAQ runner trains one generation task; the registry has {[t.name for t in found]}")
    return found[0]


def load_faq(con, task: Task) -> pl.DataFrame:
    """The question-answer pairs with their paraphrases and folds, by pair id."""
    columns_sql = ", ".join(map(quote_ident, task.sample_columns))
    faq = con.sql(f"SELECT {columns_sql} FROM {quote_table(task.sample_table)} ORDER BY pair_id").pl()
    if faq.height == 0:
        raise ValueError(f"{task.sample_table} is empty: run `medtx build-samples --task {task.name}`")
    return faq


def _answer_and_score(faq: pl.DataFrame, model: str, cfg: FAQConfig, seed: int, folder: Path,
                      on_epoch) -> records.RunResults:
    """Fit and answer every fold's held-out paraphrases, score the answers, and say what to record."""
    info: dict = {}
    if model == "retrieval":
        answers = answer_retrieval(faq, cfg)
    else:
        # ml.epochs is keyed by epoch only: record fold 0's curve (the others follow the same recipe).
        def fold_epoch(fold, epoch, metrics):
            if fold == 0:
                on_epoch(epoch, metrics)

        answers, info = answer_seq2seq(faq, cfg, seed, folder, fold_epoch)
    metrics, predictions = score_answers(faq, answers, n_boot=cfg.n_boot, seed=seed)
    collapsed, reason = is_collapsed([a for _, a in answers])  # one answer for every question
    return records.RunResults(
        metrics={"test": metrics}, predictions=predictions,
        summary={"collapsed": collapsed, "collapse_reason": reason, "n_params": info.get("n_params"),
                 "train_seconds": info.get("train_seconds"), "best_epoch": (info.get("best_epochs") or [None])[0]},
    )
