"""Fitting a text model on a task's notes: scikit-learn baselines, or a neural model through the shared trainer
(`medtx.training.trainer.fit`, epoch selected on validation), with the CPU paths for pretrained encoders
(frozen note vectors, cached lower layers, LP-FT head start). Returns the test probabilities (`TextFit`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch

from medtx.store.fingerprint import text_hash
from medtx.metrics.binary import binary_metrics
from medtx.metrics.classification import classification_metrics
from medtx.text.base import TextConfig, TextData
from medtx.training.runs import attention_frame
from medtx.training.trainer import TrainConfig, fit, predict, set_seed

log = logging.getLogger("medtx.text")


@dataclass
class TextFit:
    """What a fitted model produced on the test split."""

    probs: np.ndarray  # [N, C] (multi-class) or [N] P(positive) (binary)
    n_params: int | None = None
    best_epoch: int | None = None
    train_seconds: float = 0.0
    device: str = "cpu"
    history: list[dict[str, float]] = field(default_factory=list)
    attention: pl.DataFrame | None = None
    checkpoints: dict[str, Path] = field(default_factory=dict)  # kind -> folder


def class_weights(y: np.ndarray, n_classes: int, how: str) -> torch.Tensor | None:
    """Loss weights per class from training counts; classes absent from training get weight 1."""
    if how == "none":
        return None
    if how not in ("sqrt", "balanced"):
        raise ValueError(f"class_weighting must be none, sqrt or balanced, got {how!r}")
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    inv = np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0)
    weights = np.sqrt(inv) if how == "sqrt" else inv
    weights = weights / weights[counts > 0].mean()
    return torch.tensor(np.where(counts > 0, weights, 1.0), dtype=torch.float)


def _fit_sklearn(data: TextData, model: str, cfg: TextConfig, seed: int) -> TextFit:
    from medtx.models.text_baselines import majority_classifier, tfidf_logreg

    train, test = data.split("train"), data.split("test")
    estimator = majority_classifier() if model == "majority" else tfidf_logreg(
        C=cfg.tfidf_C, max_features=cfg.tfidf_max_features, balanced=cfg.class_weighting != "none", seed=seed
    )
    started = time.perf_counter()
    estimator.fit(train["text"].to_list(), train["y"].to_numpy())
    seconds = time.perf_counter() - started
    fitted = estimator.predict_proba(test["text"].to_list())
    # Spread the estimator's columns (training classes only) onto the full class list.
    probs = np.zeros((test.height, len(data.classes)))
    probs[:, estimator.classes_] = fitted
    return TextFit(probs=probs[:, 1] if data.binary else probs, train_seconds=seconds)


def _score_fn(binary: bool, n_classes: int):
    """Validation score for model selection: macro-F1 (argmax) or AUROC (binary)."""

    def score(y_true: np.ndarray, probs: np.ndarray) -> dict[str, float]:
        if binary:
            return {"auroc": binary_metrics(y_true, probs.reshape(-1))["auroc"]}
        pred = probs.argmax(axis=1)
        return {"macro_f1": classification_metrics(y_true.astype(int), pred, range(n_classes))["macro_f1"]}

    return score


def _tokenizer_and_model(data: TextData, model: str, cfg: TextConfig, out_dir: Path):
    """(tokenizer, nn.Module, collate factory, extra checkpoints) for a neural text model."""
    from medtx.models.bert_text import BertTextClassifier, BertTextConfig, load_encoder, minilm_dir
    from medtx.models.bilstm import BiLSTMClassifier, BiLSTMConfig
    from medtx.text.data import SequenceCollate, chunk_collate_for
    from medtx.text.tokenize import load_tokenizer, train_wordpiece

    train = data.split("train")
    n_out = 1 if data.binary else len(data.classes)
    weights = None if data.binary else class_weights(train["y"].to_numpy(), n_out, cfg.class_weighting)
    extra: dict[str, Path] = {}
    if model == "bilstm":
        tokenizer = train_wordpiece(train["text"].to_list(), vocab_size=cfg.vocab_size)
        net = BiLSTMClassifier(
            BiLSTMConfig(vocab_size=len(tokenizer), n_outputs=n_out, embed_dim=cfg.embed_dim,
                         hidden_dim=cfg.hidden_dim, dropout=cfg.dropout, binary=data.binary),
            class_weights=weights,
        )

        def make_collate(with_tokens: bool = False):
            return SequenceCollate(max_len=cfg.bilstm_max_len, binary=data.binary,
                                   tokenizer=tokenizer if with_tokens else None)

        return tokenizer, net, make_collate, extra
    if model == "bert_scratch":
        tokenizer, encoder_dir = _pretrained_scratch_encoder(data, cfg, out_dir.parent / "mlm_cache")
        encoder = load_encoder("local", encoder_dir)
        extra["pretrained"] = encoder_dir
    elif model in ("minilm", "bert"):
        path = minilm_dir() if model == "minilm" else cfg.bert_path
        if path is None:
            raise ValueError("model 'bert' needs bert_path: a local checkpoint folder (e.g. Bio_ClinicalBERT) "
                             "or a Hub id when online (--set bert_path=...)")
        tokenizer = load_tokenizer(path)
        encoder = load_encoder("local", path)
    else:
        from medtx.models.registry import model_names

        raise ValueError(f"unknown text model {model!r}; choose one of {model_names('text')}")
    net = BertTextClassifier(
        encoder,
        BertTextConfig(n_outputs=n_out, pooling=cfg.pooling, dropout=cfg.dropout, binary=data.binary,
                       chunk_vector=cfg.chunk_vector, finetune_layers=cfg.finetune_layers,
                       # mean-pooled states of a pretrained encoder are far from unit scale (as the probe's)
                       head_norm=cfg.chunk_vector == "mean"),
        class_weights=weights,
    )

    def make_collate(with_tokens: bool = False):
        return chunk_collate_for(tokenizer, max_len=cfg.max_len, stride=cfg.stride, max_chunks=cfg.max_chunks,
                                 binary=data.binary, with_tokens=with_tokens)

    return tokenizer, net, make_collate, extra


def _pretrained_scratch_encoder(data: TextData, cfg: TextConfig, cache: Path):
    """WordPiece + MLM pre-training on the training notes, cached by (training texts, config): fine-tuning
    seeds share one pre-trained encoder, as they would share a downloaded checkpoint."""
    from medtx.models.bert_text import scratch_config
    from medtx.text.mlm import MLMConfig, pretrain_mlm
    from medtx.text.tokenize import load_tokenizer, train_wordpiece

    train_texts = data.split("train")["text"].to_list()
    key = text_hash(text_hash(*train_texts), cfg.vocab_size, cfg.hidden, cfg.layers, cfg.heads, cfg.max_len,
                    cfg.mlm_epochs, cfg.mlm_lr, cfg.mlm_batch_size, cfg.mlm_seed, cfg.mlm_max_windows)
    encoder_dir = cache / key / "encoder"
    if (encoder_dir / "config.json").exists():
        log.info("reusing MLM-pre-trained encoder %s", encoder_dir)
        return load_tokenizer(encoder_dir), encoder_dir
    tokenizer = train_wordpiece(train_texts, vocab_size=cfg.vocab_size)
    bert_config = scratch_config(len(tokenizer), hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads,
                                 max_len=cfg.max_len)
    train_cfg = TrainConfig(epochs=cfg.mlm_epochs, batch_size=cfg.mlm_batch_size, lr=cfg.mlm_lr, patience=cfg.mlm_epochs,
                            monitor="loss", seed=cfg.mlm_seed, device=cfg.device, num_threads=cfg.num_threads)
    encoder_dir, _ = pretrain_mlm(bert_config, tokenizer, train_texts, data.split("val")["text"].to_list(),
                                  train_cfg, cache / key,
                                  MLMConfig(max_len=cfg.max_len, max_windows_per_note=cfg.mlm_max_windows))
    return tokenizer, encoder_dir


def _encode(tokenizer, frame: pl.DataFrame) -> list[dict]:
    from medtx.text.data import encode_items

    return encode_items(tokenizer, frame["sample_id"].to_list(), frame["text"].to_list(), frame["y"].to_list())


@torch.no_grad()
def frozen_note_vectors(encoder, items: list[dict], collate, batch_size: int = 16) -> np.ndarray:
    """[N, hidden] note vectors of a frozen encoder: masked mean of token states per chunk (the
    sentence-transformers recipe MiniLM was trained with), then the mean over the note's chunks."""
    encoder.eval()
    out = []
    for start in range(0, len(items), batch_size):
        batch = collate(items[start : start + batch_size])
        hidden = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        chunks = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
        owner, n = batch["chunk_note"], len(batch["sample_id"])
        sums = torch.zeros(n, chunks.shape[1], dtype=chunks.dtype).index_add(0, owner, chunks)
        out.append((sums / torch.bincount(owner, minlength=n)[:, None]).numpy())
        if (start // batch_size) % 50 == 0:
            log.info("frozen encoder: %d/%d notes encoded", start + len(batch["sample_id"]), len(items))
    return np.concatenate(out) if out else np.empty((0, 0), dtype=np.float32)


def _frozen_items(net, items: dict[str, list[dict]], make_collate, model: str, cfg: TextConfig, cache: Path):
    """Per split, items {sample_id, x (note vector), label}; vectors cached on disk by (encoder, texts,
    chunking), so the seeds of one benchmark encode the notes once."""
    key = text_hash(model, str(cfg.bert_path), cfg.max_len, cfg.stride, cfg.max_chunks,
                    *(f"{it['sample_id']}:{len(it['ids'])}:{sum(it['ids'])}" for s in items.values() for it in s))
    path = cache / f"{key}.npz"
    if path.exists():
        log.info("reusing frozen note vectors %s", path)
        saved = dict(np.load(path))
    else:
        torch.set_num_threads(cfg.num_threads or torch.get_num_threads())
        saved = {s: frozen_note_vectors(net.encoder, rows, make_collate()) for s, rows in items.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, **saved)
    return {s: [{"sample_id": it["sample_id"], "x": x, "label": it["label"]} for it, x in zip(rows, saved[s], strict=True)]
            for s, rows in items.items()}


def _ids_fingerprint(items: dict[str, list[dict]]) -> str:
    """Hash of every split's (sample id, token ids): a cache entry belongs to exactly these tokenised notes."""
    return text_hash(*(f"{s}/{it['sample_id']}:{','.join(map(str, it['ids']))}" for s, rows in items.items() for it in rows))


def _split_items(rows: list[dict], tensors: dict[str, torch.Tensor], split: str) -> list[dict]:
    """Cached items {sample_id, label, hidden, mask} of one split; chunks of a note are contiguous rows."""
    counts = torch.bincount(tensors[f"{split}.owner"], minlength=len(rows)).tolist()
    ends = np.cumsum(counts).tolist()
    hidden, mask = tensors[f"{split}.hidden"], tensors[f"{split}.mask"]
    return [{"sample_id": it["sample_id"], "label": it["label"], "hidden": hidden[end - n : end], "mask": mask[end - n : end]}
            for it, n, end in zip(rows, counts, ends, strict=True)]


@torch.no_grad()
def _lower_state_tensors(net, rows: list[dict], collate, split: str, max_len: int, dtype: torch.dtype,
                         batch_size: int = 16) -> dict[str, torch.Tensor]:
    """One split's frozen-layer states, every chunk padded to max_len: {split.hidden, split.mask, split.owner}."""
    from medtx.models.bert_text import lower_states

    hidden, mask, owner = [], [], []
    for start in range(0, len(rows), batch_size):
        batch = collate(rows[start : start + batch_size])
        states = lower_states(net.encoder, batch["input_ids"], batch["attention_mask"], net.n_frozen)
        pad = max_len - states.shape[1]
        hidden.append(torch.nn.functional.pad(states, (0, 0, 0, pad)).to(dtype))
        mask.append(torch.nn.functional.pad(batch["attention_mask"], (0, pad)).to(torch.int8))
        owner.append(batch["chunk_note"] + start)
        if (start // batch_size) % 25 == 0:
            log.info("lower-layer cache %s: %d/%d notes", split, start + len(batch["sample_id"]), len(rows))
    return {f"{split}.hidden": torch.cat(hidden), f"{split}.mask": torch.cat(mask), f"{split}.owner": torch.cat(owner)}


def _cached_lower_items(net, items: dict[str, list[dict]], make_collate, model: str, cfg: TextConfig,
                        cache: Path) -> dict[str, list[dict]]:
    """Per split, items carrying the frozen layers' output instead of token ids, computed once and cached on
    disk by (model, frozen depth, chunking, dtype, tokenised notes): the seeds of a benchmark share one pass."""
    from safetensors.torch import load_file, save_file

    if cfg.cache_dtype not in ("float16", "float32"):
        raise ValueError(f"cache_dtype must be float16 or float32, got {cfg.cache_dtype!r}")
    key = text_hash("lower_states", model, str(cfg.bert_path), net.n_frozen, cfg.max_len, cfg.stride,
                    cfg.max_chunks, cfg.cache_dtype, _ids_fingerprint(items))
    path = cache / f"{key}.safetensors"
    if path.exists():
        log.info("reusing cached lower-layer states %s", path)
        tensors = load_file(path)
    else:
        started = time.perf_counter()
        torch.set_num_threads(cfg.num_threads or torch.get_num_threads())
        tensors = {}
        for split, rows in items.items():
            tensors.update(_lower_state_tensors(net, rows, make_collate(), split, cfg.max_len, getattr(torch, cfg.cache_dtype)))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(path)  # atomic: a killed run never leaves a half-written cache entry behind
        log.info("cached lower-layer states of %d notes in %.0f s: %s",
                 sum(len(r) for r in items.values()), time.perf_counter() - started, path)
    return {split: _split_items(rows, tensors, split) for split, rows in items.items()}


def _init_head_from_probe(net, fit_items: dict[str, list[dict]], collate, cfg: TextConfig, seed: int,
                          binary: bool, out_dir: Path, batch_size: int = 32) -> None:
    """LP-FT: train a linear probe (NoteVectorClassifier) on the network's initial note vectors, selected on
    validation, and copy its LayerNorm + linear weights into the network's head."""
    from medtx.models.bert_text import NoteVectorClassifier
    from medtx.text.data import VectorCollate

    if not isinstance(net.norm, torch.nn.LayerNorm):
        raise ValueError("probe_init_epochs needs chunk_vector='mean' (a head with a LayerNorm, like the probe's)")
    net.eval()
    vectors = {}
    for split in ("train", "val"):
        rows = fit_items[split]
        parts = [net.note_vectors(collate(rows[i : i + batch_size])) for i in range(0, len(rows), batch_size)]
        vectors[split] = [{"sample_id": it["sample_id"], "x": x, "label": it["label"]}
                          for it, x in zip(rows, torch.cat(parts), strict=True)]
    probe = NoteVectorClassifier(net.head.in_features, net.head.out_features, dropout=net.dropout.p, binary=binary,
                                 class_weights=net.class_weights)
    probe_cfg = TrainConfig(epochs=cfg.probe_init_epochs, batch_size=32, lr=1e-3, patience=10, seed=seed,
                            device=cfg.device, num_threads=cfg.num_threads, monitor="auroc" if binary else "macro_f1")
    result = fit(probe, vectors["train"], vectors["val"], VectorCollate(binary=binary), probe_cfg, out_dir,
                 score=_score_fn(binary, net.head.out_features))
    log.info("probe head for LP-FT: best validation %s %.4f at epoch %d", probe_cfg.monitor, result.best_value,
             result.best_epoch)
    net.norm.load_state_dict(probe.norm.state_dict())
    net.head.load_state_dict(probe.head.state_dict())


def _fit_neural(data: TextData, model: str, cfg: TextConfig, seed: int, out_dir: Path, on_epoch=None) -> TextFit:
    from medtx.models.bert_text import NoteVectorClassifier
    from medtx.text.data import VectorCollate

    set_seed(seed)  # initial weights (head, BiLSTM) from the run's seed alone, not from what this process drew before
    tokenizer, net, make_collate, extra = _tokenizer_and_model(data, model, cfg, out_dir)
    items = {s: _encode(tokenizer, data.split(s)) for s in ("train", "val", "test")}
    train_cfg = TrainConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, patience=cfg.patience,
                            weight_decay=cfg.weight_decay, seed=seed, device=cfg.device, num_threads=cfg.num_threads,
                            monitor="auroc" if data.binary else "macro_f1")
    trained, fit_items, collate = net, items, make_collate()
    if cfg.finetune_layers is not None and not hasattr(net, "encoder"):
        raise ValueError(f"finetune_layers applies to the BERT models, not {model!r}")
    if cfg.finetune_layers is not None and cfg.freeze_encoder:
        raise ValueError("freeze_encoder (linear probe) and finetune_layers (partial fine-tuning) exclude each other")
    if getattr(net, "n_frozen", 0) > 0:
        from medtx.text.data import CachedStateCollate

        fit_items = _cached_lower_items(net, items, make_collate, model, cfg, out_dir.parent / "feature_cache")
        collate = CachedStateCollate(binary=data.binary)
        log.info("fine-tuning the top %d of %d layers: %d of %d parameters trainable", cfg.finetune_layers,
                 net.n_frozen + cfg.finetune_layers, sum(p.numel() for p in net.parameters() if p.requires_grad),
                 sum(p.numel() for p in net.parameters()))
    if cfg.probe_init_epochs:
        _init_head_from_probe(net, fit_items, collate, cfg, seed, data.binary, out_dir / "probe")
    if cfg.freeze_encoder:
        if not hasattr(net, "encoder"):
            raise ValueError(f"freeze_encoder applies to the BERT models, not {model!r}")
        fit_items = _frozen_items(net, items, make_collate, model, cfg, out_dir.parent / "feature_cache")
        trained = NoteVectorClassifier(net.encoder.config.hidden_size, net.config.n_outputs, dropout=cfg.dropout,
                                       binary=data.binary, class_weights=net.class_weights)
        collate = VectorCollate(binary=data.binary)
    result = fit(trained, fit_items["train"], fit_items["val"], collate, train_cfg, out_dir,
                 score=_score_fn(data.binary, len(data.classes)), on_epoch=on_epoch)
    tokenizer.save_pretrained(result.best_dir)  # the checkpoint folder holds its tokenizer
    softmax = None if data.binary else (lambda m, b: m(b).logits.softmax(dim=-1))
    test = predict(trained, fit_items["test"], collate, result.device, predict_proba=softmax,
                   batch_size=2 * cfg.batch_size)
    attention = None
    showcase = sorted(items["test"], key=lambda it: it["sample_id"])[: cfg.n_showcase]
    if showcase:
        encoder = getattr(net, "encoder", None)
        if encoder is not None:  # SDPA returns no weights: switch to eager for the showcase pass only
            encoder.set_attn_implementation("eager")
        shown = predict(net, showcase, make_collate(with_tokens=True), result.device, output_attentions=True,
                        batch_size=cfg.n_showcase, with_probs=False)
        attention = attention_frame(shown.sample_ids, shown.attentions, cfg.attention_max_tokens, keep="first")
    return TextFit(
        probs=test.probs.reshape(-1) if data.binary else test.probs,
        n_params=sum(p.numel() for p in net.parameters()),
        best_epoch=result.best_epoch, train_seconds=result.train_seconds, device=result.device,
        history=result.history, attention=attention,
        checkpoints={"best": result.best_dir, "last": result.last_dir, **extra},
    )


def fit_text_model(data: TextData, model: str, cfg: TextConfig, seed: int, out_dir: Path, on_epoch=None) -> TextFit:
    """Train `model` on the training split (selecting on validation) and return its test probabilities."""
    for split in ("train", "val", "test"):
        if data.split(split).height == 0:
            raise ValueError(f"text task has no {split} notes; check samples.* splits")
    from medtx.models.registry import model_names

    if model in model_names("text_baseline"):
        return _fit_sklearn(data, model, cfg, seed)
    if model not in model_names("text"):
        raise ValueError(f"unknown text model {model!r}; choose one of {model_names('text')}")
    return _fit_neural(data, model, cfg, seed, out_dir, on_epoch)
