"""Tokenizers for the text models.

Hugging Face models use their own tokenizer (loaded from the checkpoint folder). Everything else — the BiLSTM
and the small BERT pre-trained here — uses a WordPiece tokenizer trained with `tokenizers` on the *training
split only* (so no validation/test vocabulary leaks into the model), wrapped as a `BertTokenizerFast` so all
text models share one interface (`__call__`, `decode`, `save_pretrained`) and it is saved with the model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from tokenizers import BertWordPieceTokenizer
from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerBase

log = logging.getLogger("medtx.text")

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def train_wordpiece(
    texts: Iterable[str], *, vocab_size: int = 8000, min_frequency: int = 2, lowercase: bool = True
) -> BertTokenizerFast:
    """A BERT-style WordPiece tokenizer learned from `texts` (pass the training split only).

    [PAD] gets id 0 so padding masks and embeddings agree with `padding_idx=0`.

    Deterministic: `tokenizers`' trainer numbers the `##x` continuing-subword tokens in hash-map order, which
    differs from process to process, and breaks ties between equally frequent merges by those numbers, so the
    same notes gave a different vocabulary, and the same seed a different model, run to run
    (huggingface/tokenizers#1794). Every `##x` of the notes' characters is therefore handed to the trainer up
    front, in sorted order, so it never numbers one itself; and the final ids are renumbered canonically
    (the special tokens, then every other token sorted). WordPiece splits words by longest match against the
    vocabulary set, so the numbering changes no tokenisation.
    """
    texts = [t for t in texts if t]
    wordpiece = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=lowercase, clean_text=True)
    normalize = wordpiece.normalizer.normalize_str
    chars = sorted({c for t in texts for c in normalize(t) if not c.isspace()})
    continuing = [f"##{c}" for c in chars]
    wordpiece.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS + continuing,
        show_progress=False,  # its bar goes straight to the terminal, past the log routing
    )
    learned = wordpiece.get_vocab()
    ordered = SPECIAL_TOKENS + sorted(t for t in learned if t not in SPECIAL_TOKENS)
    # transformers 5 takes the vocabulary itself (`vocab=`); the old `vocab_file=` is silently ignored.
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(ordered)}, do_lower_case=lowercase,
                                  strip_accents=lowercase)
    log.info("trained WordPiece tokenizer: %d tokens", len(tokenizer))
    return tokenizer


def load_tokenizer(path_or_id: str | Path) -> PreTrainedTokenizerBase:
    """A saved tokenizer folder (ours or a checkpoint's), or a Hub id when online (HF_HUB_OFFLINE unset)."""
    try:
        return AutoTokenizer.from_pretrained(str(path_or_id))
    except OSError as exc:
        raise FileNotFoundError(
            f"no tokenizer at {path_or_id!s}: give a local checkpoint folder with vocab.txt/tokenizer.json, "
            "or a Hub id with network access (HF_HUB_OFFLINE=1 forbids downloads)"
        ) from exc
