"""Fitting a text model on a task's notes: scikit-learn baselines, or a neural model through the shared trainer
(`medtx.training.trainer.fit`, epoch selected on validation), with the CPU paths for pretrained encoders
(frozen note vectors, cached lower layers, LP-FT head start). Returns the test probabilities (`TextFit`).

Which model is built is the model's own business: its file registers a `build` (medtx.models.registry) that
gets a `ModelContext` (the notes, the run's settings and `_Tools`, the text layer's tokenizer, collate and MLM
pieces) and returns a scikit-learn classifier (text baselines) or a `TextModelBundle` (neural text models).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from medtx.metrics.binary import binary_metrics
from medtx.metrics.classification import classification_metrics
from medtx.models import frames
from medtx.models.registry import ModelSpec, ModelContext, TextTools
from medtx.store.hashing import text_hash
from medtx.training.text_config import TextConfig, TextData
from medtx.training.results import attention_frame
from medtx.training.trainer import TrainConfig, fit, predict, set_seed

log = logging.getLogger("medtx.text")


@dataclass
class TextFit:
    """What a fitted model produced on the test split (and, for a binary task, on validation)."""

    probs: np.ndarray  # [N, C] (multi-class) or [N] P(positive) (binary)
    # [N_val] P(positive) of a binary task's validation notes: what recalibration and operating-point thresholds
    # are fitted on (medtx.evaluation.trust); None for multi-class tasks
    val_probs: np.ndarray | None = None
    n_params: int | None = None
    best_epoch: int | None = None
    train_seconds: float = 0.0
    device: str = "cpu"
    history: list[dict[str, float]] = field(default_factory=list)
    attention: pa.Table | None = None
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


def _fit_sklearn(data: TextData, spec: ModelSpec, cfg: TextConfig, seed: int) -> TextFit:
    train = data.split("train")
    estimator = spec.build(_context(data, cfg, seed, None, None))
    started = time.perf_counter()
    estimator.fit(frames.values(train, "text"), frames.numbers(train, "y"))
    seconds = time.perf_counter() - started

    def proba(split: str) -> np.ndarray:
        rows = data.split(split)
        # Spread the estimator's columns (training classes only) onto the full class list.
        probs = np.zeros((rows.num_rows, len(data.classes)))
        probs[:, estimator.classes_] = estimator.predict_proba(frames.values(rows, "text"))
        return probs[:, 1] if data.binary else probs

    return TextFit(probs=proba("test"), val_probs=proba("val") if data.binary else None, train_seconds=seconds)


def _score_fn(binary: bool, n_classes: int):
    """Validation score for model selection: macro-F1 (argmax) or AUROC (binary)."""

    def score(y_true: np.ndarray, probs: np.ndarray) -> dict[str, float]:
        if binary:
            return {"auroc": binary_metrics(y_true, probs.reshape(-1))["auroc"]}
        pred = probs.argmax(axis=1)
        return {"macro_f1": classification_metrics(y_true.astype(int), pred, range(n_classes))["macro_f1"]}

    return score


def _context(data: TextData, cfg: TextConfig, seed: int, cache: Path | None, tools: TextTools | None) -> ModelContext:
    """What a text model's build gets (medtx.models.registry.ModelContext)."""
    train = data.split("train")
    n_out = 1 if data.binary else len(data.classes)
    weights = None if data.binary else class_weights(frames.numbers(train, "y"), n_out, cfg.class_weighting)
    return ModelContext(settings=cfg, train_texts=frames.values(train, "text"),
                        val_texts=frames.values(data.split("val"), "text"), n_outputs=n_out, binary=data.binary,
                        class_weights=weights, seed=seed, cache=cache, tools=tools)


@dataclass(frozen=True)
class _Tools:
    """The text layer's pieces handed to a model's build (medtx.models.registry.TextTools)."""

    cfg: TextConfig
    binary: bool

    @property
    def tokenizer_key(self) -> tuple:
        return (self.cfg.vocab_size,)

    def train_tokenizer(self, texts: list[str]):
        from medtx.text.tokenize import train_wordpiece

        return train_wordpiece(texts, vocab_size=self.cfg.vocab_size)

    def load_tokenizer(self, path):
        from medtx.text.tokenize import load_tokenizer

        return load_tokenizer(path)

    def sequence_collate(self, tokenizer, *, max_len: int, with_tokens: bool):
        from medtx.text.data import SequenceCollate

        return SequenceCollate(max_len=max_len, binary=self.binary, tokenizer=tokenizer if with_tokens else None)

    def chunk_collate(self, tokenizer, *, max_len: int, stride: int, max_chunks: int | None, with_tokens: bool):
        from medtx.text.data import chunk_collate_for

        return chunk_collate_for(tokenizer, max_len=max_len, stride=stride, max_chunks=max_chunks,
                                 binary=self.binary, with_tokens=with_tokens)

    def pretrain_mlm(self, bert_config, tokenizer, train_texts: list[str], val_texts: list[str], folder: Path, *,
                     epochs: int, batch_size: int, lr: float, seed: int, max_len: int, max_windows: int | None) -> Path:
        """MLM pre-training on the training notes (selected on the validation notes' loss): the encoder folder."""
        from medtx.text.mlm import MLMConfig
        from medtx.training.pretrain import pretrain_text_mlm

        train_cfg = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, patience=epochs, monitor="loss",
                                seed=seed, device=self.cfg.device, num_threads=self.cfg.num_threads)
        encoder_dir, _ = pretrain_text_mlm(bert_config, tokenizer, train_texts, val_texts, train_cfg,
                                      folder, MLMConfig(max_len=max_len, max_windows_per_note=max_windows))
        return encoder_dir


def _encode(tokenizer, frame: pa.Table) -> list[dict]:
    from medtx.text.data import encode_items

    return encode_items(tokenizer, frames.values(frame, "sample_id"), frames.values(frame, "text"),
                        frames.values(frame, "y"))


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


def _fit_neural(data: TextData, spec: ModelSpec, cfg: TextConfig, seed: int, out_dir: Path, on_epoch=None,
                cache: Path | None = None) -> TextFit:
    from medtx.models.bert_text import NoteVectorClassifier
    from medtx.text.data import VectorCollate

    model = spec.name
    cache = cache or out_dir.parent  # caches that seeds share (MLM encoders, note vectors): beside the run's folder
    set_seed(seed)  # initial weights (head, BiLSTM) from the run's seed alone, not from what this process drew before
    bundle = spec.build(_context(data, cfg, seed, cache, _Tools(cfg, data.binary)))
    tokenizer, net, make_collate, extra = bundle.tokenizer, bundle.model, bundle.make_collate, bundle.checkpoints
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

        fit_items = _cached_lower_items(net, items, make_collate, model, cfg, cache / "feature_cache")
        collate = CachedStateCollate(binary=data.binary)
        log.info("fine-tuning the top %d of %d layers: %d of %d parameters trainable", cfg.finetune_layers,
                 net.n_frozen + cfg.finetune_layers, sum(p.numel() for p in net.parameters() if p.requires_grad),
                 sum(p.numel() for p in net.parameters()))
    if cfg.probe_init_epochs:
        _init_head_from_probe(net, fit_items, collate, cfg, seed, data.binary, out_dir / "probe")
    if cfg.freeze_encoder:
        if not hasattr(net, "encoder"):
            raise ValueError(f"freeze_encoder applies to the BERT models, not {model!r}")
        fit_items = _frozen_items(net, items, make_collate, model, cfg, cache / "feature_cache")
        trained = NoteVectorClassifier(net.encoder.config.hidden_size, net.config.n_outputs, dropout=cfg.dropout,
                                       binary=data.binary, class_weights=net.class_weights)
        collate = VectorCollate(binary=data.binary)
    result = fit(trained, fit_items["train"], fit_items["val"], collate, train_cfg, out_dir,
                 score=_score_fn(data.binary, len(data.classes)), on_epoch=on_epoch)
    tokenizer.save_pretrained(result.best_dir)  # the checkpoint folder holds its tokenizer
    softmax = None if data.binary else (lambda m, b: m(b).logits.softmax(dim=-1))
    test = predict(trained, fit_items["test"], collate, result.device, predict_proba=softmax,
                   batch_size=2 * cfg.batch_size)
    val = predict(trained, fit_items["val"], collate, result.device, batch_size=2 * cfg.batch_size) \
        if data.binary else None  # the binary task's validation predictions (recalibration, operating points)
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
        val_probs=val.probs.reshape(-1) if val is not None else None,
        n_params=sum(p.numel() for p in net.parameters()),
        best_epoch=result.best_epoch, train_seconds=result.train_seconds, device=result.device,
        history=result.history, attention=attention,
        checkpoints={"best": result.best_dir, "last": result.last_dir, **extra},
    )


def fit_text_model(data: TextData, model: str, cfg: TextConfig, seed: int, out_dir: Path, on_epoch=None,
                   cache: Path | None = None) -> TextFit:
    """Train `model` on the training split (selecting on validation) and return its test probabilities (and a
    binary task's validation probabilities). `cache`:
    the folder of caches that seeds share (default: the run folder's parent)."""
    for split in ("train", "val", "test"):
        if data.split(split).num_rows == 0:
            raise ValueError(f"text task has no {split} notes; check samples.* splits")
    from medtx.models.registry import model_names, specs

    spec = next((s for s in (*specs("text_baseline"), *specs("text")) if s.name == model), None)
    if spec is None:
        known = model_names("text_baseline") + model_names("text")
        raise ValueError(f"unknown text model {model!r}; choose one of {known}")
    if spec.family == "text_baseline":  # a scikit-learn classifier: fitted once, no trainer
        return _fit_sklearn(data, spec, cfg, seed)
    return _fit_neural(data, spec, cfg, seed, out_dir, on_epoch, cache)
