"""The one trainer every neural model in medtx goes through (EHR models, BEHRT MLM, text models).

`fit` trains with AdamW, keeps the best epoch by a validation metric (early stopping, validation only),
writes `best/` and `last/` checkpoint folders (`config.json` + `model.safetensors` + `trainer_state.json`),
and can resume from `last/`. Each checkpoint file is replaced whole and carries its epoch (`last/optimizer.pt` too),
so resuming from a folder a kill left between two epochs' files is refused in one line instead of mixing them.
`predict` returns probabilities (and, on request, attention weights).

Device: `resolve_device("auto")` picks CUDA when present (with bf16 autocast where the GPU supports it),
else CPU. The model contract is `medtx.models.base`: `forward(batch, output_attentions=False) -> ModelOutput`
with `loss` set when the batch holds "labels".
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

# Checkpoint I/O belongs to the models layer; re-exported here for the trainer's callers.
from medtx.models.bounds import BatchSize, Count, Decay, Device, Epochs, LearningRate, Patience, Positive, PositiveFloat
from medtx.models.checkpoint import jsonable, load_weights, replace_file, save_checkpoint, weights_epoch  # noqa: F401
from medtx.models.encoded import EncodedSet, bucket_pool, length_buckets, sequential_batches, shuffled_batches

log = logging.getLogger("medtx.training")

Collate = Callable[[list[Any]], dict[str, Any]]
PredictProba = Callable[[nn.Module, dict[str, Any]], torch.Tensor]
ScoreFn = Callable[[np.ndarray, np.ndarray], dict[str, float]]


@dataclass
class TrainConfig:
    # Field types carry the bounds a pipeline config is checked against at load (medtx.models.bounds).
    epochs: Epochs = 30  # upper bound; early stopping usually ends sooner
    batch_size: BatchSize = 64
    lr: LearningRate = 1e-3
    weight_decay: Decay = 0.01  # AdamW decoupled decay
    patience: Patience = 5  # epochs without validation improvement before stopping
    monitor: str = "loss"  # "loss" (minimise val loss) or a key of score()'s dict (maximise)
    seed: Count = 0  # training seed (init, shuffling, dropout); the data split has its own fixed seed
    device: Device = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    grad_clip: PositiveFloat | None = 1.0  # max global grad norm; None disables
    num_threads: Positive | None = None  # torch CPU threads; None keeps torch's default
    eval_batch_size: BatchSize | None = None  # defaults to 2 x batch_size (no gradients kept)
    progress: bool | None = None  # tqdm bar; None = only when stderr is a terminal
    # Training batches from an EncodedSet: shuffled, then sorted by length within pools of up to this many batches
    # (less padding), at least 8 pools per epoch (`encoded.bucket_pool`: fewer than 2 batches per pool, as on
    # small training sets, is the plain shuffle); 0 = plain shuffle (the same batches as a shuffled DataLoader).
    # Item lists: plain shuffle. Off by default: one pool over a whole small training set lowered seed-42 test
    # PR-AUC on all six EHR models measured (-0.0007 to -0.010; benchmarks/README.md, round 1), and only drug_rec's
    # transformer was validated with the pool rule, so only it buckets by default (`Task.train_defaults`; round 5).
    # Elsewhere an opt-in (`--set length_buckets=16`).
    length_buckets: Count = 0


@dataclass
class FitResult:
    best_epoch: int
    best_value: float
    history: list[dict[str, float]]  # one dict per epoch: epoch, train_loss, val_loss, val_<metric>..., seconds
    best_dir: Path
    last_dir: Path
    device: str
    train_seconds: float = 0.0
    stopped_early: bool = False


@dataclass
class Predictions:
    probs: np.ndarray  # [N, n_labels] (or [N, n_classes]) probabilities
    y_true: np.ndarray | None  # batch "labels" stacked, when the items carry labels
    sample_ids: list[Any]  # batch "sample_id" values in item order ([] when the collate gives none)
    loss: float | None = None  # mean loss over batches, when labels are present
    # One entry per item when output_attentions: {module: (weights [layers, heads, Q, K], q_tokens, k_tokens)}
    attentions: list[dict[str, tuple[np.ndarray, list[str], list[str]]]] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- device & seeds


def resolve_device(spec: str = "auto") -> torch.device:
    """'auto' -> CUDA when available else CPU; an explicit 'cuda' without a GPU is a clear error."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available here; use --device auto or cpu")
    return device


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA GPUs that support it (Ampere+); plain fp32 elsewhere (CPU bf16 is slow on 2 cores)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return nullcontext()


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch (all devices) so a run is repeatable on the same hardware."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Move tensor values to `device`; leave non-tensor keys (sample ids, token labels) alone."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ----------------------------------------------------------------------------------------------- checkpoints


def _checkpoint_config(model: nn.Module, cfg: TrainConfig) -> dict[str, Any]:
    """Everything needed to rebuild the model and re-run training: model config (if any) + trainer config."""
    model_cfg = getattr(model, "config", None)
    return {"model_class": type(model).__name__, "model": jsonable(model_cfg), "train": dataclasses.asdict(cfg)}


# ----------------------------------------------------------------------------------------------- fit


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel over every parameter per step) on CPU and CUDA.

    The default per-tensor loop launches ~10 small ops per parameter tensor: 4.7 ms of a 35 ms transformer
    step on one CPU thread (issue #18's profile), the fused kernel 4-5x less. Same update rule; it differs
    from the loop only in float rounding (2e-7 after 200 steps, measured)."""
    fused = device.type in ("cpu", "cuda") and all(p.is_floating_point() for p in model.parameters())
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)


def _check_items(train_items: Sequence, val_items: Sequence) -> None:
    if len(train_items) == 0:
        raise ValueError("fit: the training split is empty (no samples for this dataset/task/split)")
    if len(val_items) == 0:
        raise ValueError("fit: the validation split is empty; early stopping and model selection need one")


@torch.no_grad()
def _preflight(model: nn.Module, items: Sequence, collate: Collate, device: torch.device) -> None:
    """Fail early and clearly when the data's labels do not fit the model (one label-free forward pass).

    Run without "labels" so the model's own loss cannot crash first with a shape error.
    """
    first = list(range(min(2, len(items))))
    batch = to_device(items.batch(first) if isinstance(items, EncodedSet) else collate([items[i] for i in first]),
                      device)
    labels = batch.get("labels")  # absent for self-supervised batches (BEHRT MLM carries mlm_labels)
    if not (isinstance(labels, torch.Tensor) and labels.dtype.is_floating_point and labels.dim() == 2):
        return  # e.g. MLM token targets: the shape check below is for one-logit-per-label heads
    was_training = model.training
    model.eval()
    with autocast_for(device):
        logits = model({k: v for k, v in batch.items() if k != "labels"}).logits
    model.train(was_training)
    if labels.shape != logits.shape:
        raise ValueError(
            f"label/vocab mismatch: batch labels have shape {tuple(labels.shape)} but the model returns logits "
            f"{tuple(logits.shape)}; was the model built with the same label vocabulary as the samples?"
        )


def _better(value: float, best: float, monitor: str) -> bool:
    if math.isnan(value):
        return False
    return value < best if monitor == "loss" else value > best


def _train_epoch(model, loader, optimizer, device, cfg: TrainConfig, bar) -> float:
    model.train()
    total, n = 0.0, 0
    for batch in loader:
        batch = to_device(batch, device)
        with autocast_for(device):
            out = model(batch)
        if out.loss is None:
            raise ValueError("fit: the model returned no loss; does the collate put the targets in the batch?")
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        total += float(out.loss.detach())
        n += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{total / n:.4f}")
    return total / max(n, 1)


def _make_loader(items: Sequence, collate: Collate, batch_size: int, shuffle: bool, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    return DataLoader(list(items), batch_size=batch_size, shuffle=shuffle, collate_fn=collate, generator=generator)


class _EncodedLoader:
    """Batches cut from an EncodedSet (no per-batch collate): shuffled or length-bucketed for training; for
    evaluation sorted by length, with `order` (item index per output row) to put the results back in order."""

    def __init__(self, items: EncodedSet, batch_size: int, shuffle: bool, seed: int, pool_batches: int) -> None:
        self.items = items
        self.order: torch.Tensor | None = None
        if not shuffle:
            self.order = torch.argsort(items.lengths, stable=True)
            self.index = [self.order[b] for b in sequential_batches(len(items), batch_size)]
        elif (pool := bucket_pool(len(items), batch_size, pool_batches)) > 0:
            self.index = length_buckets(items.lengths, batch_size, torch.Generator().manual_seed(seed), pool)
        else:
            self.index = shuffled_batches(len(items), batch_size, torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.index)

    def __iter__(self):
        return (self.items.batch(index) for index in self.index)


def _batches(items: Sequence | EncodedSet, collate: Collate, batch_size: int, shuffle: bool, seed: int = 0,
             pool_batches: int = 0) -> DataLoader | _EncodedLoader:
    """Item lists go through a DataLoader + collate; an EncodedSet is indexed (optionally length-bucketed)."""
    if isinstance(items, EncodedSet):
        return _EncodedLoader(items, batch_size, shuffle, seed, pool_batches)
    return _make_loader(items, collate, batch_size, shuffle, seed)


def _validate(model, val_items, collate, device, cfg, score, predict_proba) -> dict[str, float]:
    preds = predict(
        model, val_items, collate, device, predict_proba=predict_proba,
        batch_size=cfg.eval_batch_size or 2 * cfg.batch_size, with_probs=score is not None,
    )
    metrics = {"val_loss": float("nan") if preds.loss is None else preds.loss}
    if score is not None:
        if preds.y_true is None:
            raise ValueError("fit: score() given but the validation batches carry no 'labels'")
        metrics.update({f"val_{k}": float(v) for k, v in score(preds.y_true, preds.probs).items()})
    return metrics


def fit(
    model: nn.Module,
    train_items: Sequence | EncodedSet,
    val_items: Sequence | EncodedSet,
    collate: Collate,
    cfg: TrainConfig,
    out_dir: Path,
    score: ScoreFn | None = None,
    predict_proba: PredictProba | None = None,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
    resume: bool = False,
) -> FitResult:
    """Train `model` and keep its best validation epoch; the model holds the best weights on return.

    `score(y_true, y_prob)` is evaluated on the validation split each epoch; `cfg.monitor` names the value
    to select on ("loss" is minimised, any score key is maximised). `on_epoch(epoch, metrics)` is called after
    each epoch (e.g. to write ml.epochs). Items may be an `EncodedSet` (collated once, batches indexed and
    length-bucketed per `cfg.length_buckets`) or a plain item list (collated per batch). With `resume=True`
    training continues from `out_dir/last` when it exists (weights, optimizer, epoch, best value, patience
    counter).
    """
    _check_items(train_items, val_items)
    if cfg.monitor != "loss" and score is None:
        raise ValueError(f"fit: monitor={cfg.monitor!r} needs a score function (or use monitor='loss')")
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    device = resolve_device(cfg.device)
    set_seed(cfg.seed)
    out_dir = Path(out_dir)
    best_dir, last_dir = out_dir / "best", out_dir / "last"
    model.to(device)
    optimizer = make_optimizer(model, cfg, device)
    config = _checkpoint_config(model, cfg)
    _preflight(model, train_items, collate, device)
    if cfg.length_buckets and isinstance(train_items, EncodedSet):  # what length_buckets amounts to on this set
        pool = bucket_pool(len(train_items), cfg.batch_size, cfg.length_buckets)
        log.info("training batches: %s", f"length-bucketed, pools of {pool} batches" if pool else
                 "plain shuffle (length_buckets: too few batches for 8 pools of 2 or more)")

    state = _start_state(model, optimizer, cfg, last_dir, best_dir, device, resume)
    key = "val_loss" if cfg.monitor == "loss" else f"val_{cfg.monitor}"
    stopped_early = state["bad_epochs"] >= cfg.patience
    with _shared_cores(cfg) as rebalance:
        for epoch in range(state["epoch"] + 1, cfg.epochs + 1):
            if stopped_early:
                break
            rebalance()
            started = time.perf_counter()
            metrics = _train_and_validate(model, train_items, val_items, collate, optimizer, device, cfg, epoch,
                                          score, predict_proba)
            if key not in metrics:
                raise ValueError(f"fit: monitor {cfg.monitor!r} not among validation metrics {sorted(metrics)}")
            metrics["seconds"] = time.perf_counter() - started
            _keep_epoch(model, optimizer, state, epoch, metrics, key, cfg, config, best_dir, last_dir)
            if on_epoch is not None:
                on_epoch(epoch, metrics)
            stopped_early = state["bad_epochs"] >= cfg.patience
            if stopped_early:
                log.info("early stopping after epoch %d: no %s improvement for %d epochs", epoch, key, cfg.patience)

    if state["best_epoch"] == 0:
        raise RuntimeError(f"fit: no epoch produced a finite {key}; nothing to keep (check the data and lr)")
    load_weights(model, best_dir, device)
    if (off := _stamp_off(weights_epoch(best_dir), state["best_epoch"])) is not None:
        raise RuntimeError(f"{best_dir} holds epoch {off}'s weights, not the best epoch {state['best_epoch']} "
                           "(a run was stopped while writing it); train again without resume")
    return FitResult(
        best_epoch=state["best_epoch"], best_value=float(state["best_value"]), history=state["history"],
        best_dir=best_dir, last_dir=last_dir, device=str(device), train_seconds=state["train_seconds"],
        stopped_early=stopped_early,
    )


@contextmanager
def _shared_cores(cfg: TrainConfig) -> Iterator[Callable[[], None]]:
    """Hold a slot in the machine's registry of running trainings (medtx.runtime.resources) and yield `rebalance`, which
    caps torch's threads at this training's fair share of the cores (at most what the caller set); an explicit
    `cfg.num_threads` (set by `fit`) is kept as asked. Torch's thread count is restored afterwards."""
    from medtx.runtime.resources import fair_threads, training_slot

    ceiling = torch.get_num_threads()

    def rebalance() -> None:
        if cfg.num_threads:
            return
        threads = fair_threads(ceiling)
        if threads != torch.get_num_threads():
            log.info("torch threads %d -> %d (cores // trainings running on this machine)",
                     torch.get_num_threads(), threads)
            torch.set_num_threads(threads)

    with training_slot():
        try:
            yield rebalance
        finally:
            if not cfg.num_threads:
                torch.set_num_threads(ceiling)


def _stamp_off(stamp: int | None, expected: int) -> int | None:
    """A checkpoint file's epoch stamp when it is not `expected` (None: it is, or the file carries no stamp)."""
    return None if stamp in (None, expected) else stamp


def _start_state(model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainConfig, last_dir: Path,
                 best_dir: Path, device: torch.device, resume: bool) -> dict[str, Any]:
    """The trainer's state before the first epoch: fresh, or (resume) from `last_dir` with weights and optimizer."""
    state = {"epoch": 0, "best_epoch": 0, "best_value": math.inf if cfg.monitor == "loss" else -math.inf,
             "bad_epochs": 0, "history": [], "monitor": cfg.monitor, "train_seconds": 0.0}
    if resume and (last_dir / "trainer_state.json").exists():
        state = json.loads((last_dir / "trainer_state.json").read_text())
        saved = torch.load(last_dir / "optimizer.pt", map_location=device, weights_only=True)
        # optimizer.pt is {"epoch", "optimizer"} since the stamp; a bare state dict before it
        optimizer_epoch, optimizer_state = ((saved["epoch"], saved["optimizer"]) if "optimizer" in saved
                                            else (None, saved))
        stamps = {"model.safetensors": _stamp_off(weights_epoch(last_dir), state["epoch"]),
                  "optimizer.pt": _stamp_off(optimizer_epoch, state["epoch"])}
        if (best_dir / "model.safetensors").exists():  # best/ must hold the best epoch it records
            stamps[f"{best_dir.name}/model.safetensors"] = _stamp_off(weights_epoch(best_dir), state["best_epoch"])
        mixed = {name: e for name, e in stamps.items() if e is not None}
        if mixed:
            raise RuntimeError(
                f"cannot resume from {last_dir}: trainer_state.json is epoch {state['epoch']} (best epoch "
                f"{state['best_epoch']}) but " + ", ".join(f"{name} is epoch {e}" for name, e in mixed.items())
                + " (a run was stopped while writing them); train again without resume")
        load_weights(model, last_dir, device)
        optimizer.load_state_dict(optimizer_state)
        log.info("resuming from %s after epoch %d (best %s=%.4f at epoch %d)", last_dir, state["epoch"],
                 cfg.monitor, state["best_value"], state["best_epoch"])
    return state


def _train_and_validate(model: nn.Module, train_items: Sequence | EncodedSet, val_items: Sequence | EncodedSet,
                        collate: Collate, optimizer: torch.optim.Optimizer, device: torch.device, cfg: TrainConfig,
                        epoch: int, score: ScoreFn | None, predict_proba: PredictProba | None) -> dict[str, float]:
    """One training epoch then validation: {"train_loss", "val_loss", "val_<score key>" ...}."""
    # Re-seed per epoch so a resumed run shuffles exactly like an uninterrupted one.
    set_seed(cfg.seed * 100_003 + epoch)
    loader = _batches(train_items, collate, cfg.batch_size, shuffle=True, seed=cfg.seed * 100_003 + epoch,
                      pool_batches=cfg.length_buckets)
    show_bar = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    bar = tqdm(total=len(loader), desc=f"epoch {epoch}/{cfg.epochs}", leave=False) if show_bar else None
    try:
        train_loss = _train_epoch(model, loader, optimizer, device, cfg, bar)
    finally:
        if bar is not None:
            bar.close()
    return {"train_loss": train_loss, **_validate(model, val_items, collate, device, cfg, score, predict_proba)}


def _keep_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any], epoch: int,
                metrics: dict[str, float], key: str, cfg: TrainConfig, config: dict, best_dir: Path,
                last_dir: Path) -> None:
    """Add the epoch to the state; save `best/` when it improves on the monitor, `last/` (and the optimizer) always."""
    state["train_seconds"] += metrics["seconds"]
    state["epoch"] = epoch
    state["history"].append({"epoch": epoch, **metrics})
    if _better(metrics[key], state["best_value"], cfg.monitor):
        state.update(best_epoch=epoch, best_value=metrics[key], bad_epochs=0)
        save_checkpoint(model, best_dir, config, state)
    else:
        state["bad_epochs"] += 1
    # The optimizer first, trainer_state.json (inside save_checkpoint) last: every file is replaced whole and carries
    # its epoch, so a kill between two of these writes leaves a `last/` that resume recognises and refuses.
    last_dir.mkdir(parents=True, exist_ok=True)
    replace_file(last_dir / "optimizer.pt",
                 lambda p: torch.save({"epoch": epoch, "optimizer": optimizer.state_dict()}, p))
    save_checkpoint(model, last_dir, config, state)
    log.info("epoch %d/%d train_loss=%.4f %s=%.4f best=%.4f@%d (%.1fs)", epoch, cfg.epochs, metrics["train_loss"],
             key, metrics[key], state["best_value"], state["best_epoch"], metrics["seconds"])


# ----------------------------------------------------------------------------------------------- predict


def _attention_rows(out: Any, batch_size: int) -> list[dict[str, tuple[np.ndarray, list[str], list[str]]]]:
    """Split batched attention into per-sample arrays cut to each sample's real (unpadded) token count."""
    rows: list[dict[str, tuple[np.ndarray, list[str], list[str]]]] = [{} for _ in range(batch_size)]
    for module, layers in (out.attentions or {}).items():
        stacked = torch.stack([a.float() for a in layers], dim=1).cpu().numpy()  # [B, L, H, Q, K]
        q_tokens, k_tokens = out.attention_tokens.get(module, (None, None))
        for i in range(batch_size):
            qt = list(q_tokens[i]) if q_tokens is not None else [str(j) for j in range(stacked.shape[3])]
            kt = list(k_tokens[i]) if k_tokens is not None else [str(j) for j in range(stacked.shape[4])]
            rows[i][module] = (stacked[i, :, :, : len(qt), : len(kt)], qt, kt)
    return rows


@torch.no_grad()
def predict(
    model: nn.Module,
    items: Sequence | EncodedSet,
    collate: Collate,
    device: torch.device | str,
    predict_proba: PredictProba | None = None,
    batch_size: int = 256,
    output_attentions: bool = False,
    with_probs: bool = True,
) -> Predictions:
    """Probabilities for `items` in order (sigmoid of logits unless `predict_proba` is given).

    With `output_attentions=True` the model runs with attention outputs (eager attention) and each item's
    weights are returned cut to its real tokens — use it on a small showcase subset only.
    """
    device = torch.device(device) if isinstance(device, str) else device
    model.to(device).eval()
    probs, labels, ids, attentions = [], [], [], []
    loss_sum, loss_n = 0.0, 0
    loader = _batches(items, collate, batch_size, shuffle=False)
    for batch in loader:
        batch = to_device(batch, device)
        with autocast_for(device):
            out = model(batch, output_attentions=output_attentions)
            if with_probs:
                p = predict_proba(model, batch) if predict_proba is not None else torch.sigmoid(out.logits)
                probs.append(p.float().cpu().numpy())
        if out.loss is not None:
            loss_sum += float(out.loss)
            loss_n += 1
        if isinstance(batch.get("labels"), torch.Tensor):
            labels.append(batch["labels"].float().cpu().numpy())
        ids.extend(batch.get("sample_id", []))
        if output_attentions:
            attentions.extend(_attention_rows(out, out.logits.shape[0]))
    preds = Predictions(
        probs=np.concatenate(probs) if probs else np.empty((0, 0)),
        y_true=np.concatenate(labels) if labels else None,
        sample_ids=list(ids),
        loss=loss_sum / loss_n if loss_n else None,
        attentions=attentions,
    )
    order = getattr(loader, "order", None)
    return preds if order is None else _in_item_order(preds, order.numpy())


def _in_item_order(preds: Predictions, order: np.ndarray) -> Predictions:
    """Rows produced in `order` (length-sorted evaluation batches) put back in item order."""
    back = np.argsort(order, kind="stable")
    take = (lambda rows: [rows[i] for i in back]) if len(back) else list
    return dataclasses.replace(
        preds, probs=preds.probs[back] if len(preds.probs) else preds.probs,
        y_true=None if preds.y_true is None else preds.y_true[back], sample_ids=take(preds.sample_ids),
        attentions=take(preds.attentions) if preds.attentions else [])
