"""Turning `samples.*` rows into model items and padded batches for the neural EHR models.

Three codecs, each with `encode(frame) -> list[dict]` (one item per sample row) and
`collate(items) -> dict` (tensors + non-tensor keys the trainer leaves alone):

- `HistoryCodec` (transformer, transformer_rope, rnn/gru/lstm): each feature's visit history flattened
  into one code sequence, with each code's visit index, the visit count and a padding mask.
- `BehrtCodec` (behrt): one `[CLS] v1 [SEP] v2 [SEP] ...` sequence of all features' codes with age,
  segment and visit-position ids (read directly from `samples.next_visit` for that task).
- `Seq2SeqCodec` (seq2seq, drug_rec): the current visit's ICD codes as source, its ATC-3 set as a target
  sequence `<bos> a b c <eos>` in label-vocabulary order.

Every batch carries `labels` [B, n_labels] (multi-hot; [B, 1] for binary tasks), `sample_id` (hadm_id as
text), `subject_id`, and `tokens` (readable code labels per sample, for storing attention weights).
Codes absent from the training vocabulary map to `<unk>`; labels absent from the label vocabulary cannot be
predicted and are dropped from the multi-hot target (counted in `LabelSpace.dropped`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from medtx.models import frames
from medtx.tasks import Task

log = logging.getLogger("medtx.models")

PAD, UNK = "<pad>", "<unk>"  # samples.vocab idx 0 and 1
CLS, SEP, MASK, BOS, EOS = "[CLS]", "[SEP]", "[MASK]", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, CLS, SEP, MASK, BOS, EOS)


# ----------------------------------------------------------------------------------------------- vocabularies


def vocab_tokens(vocab: Any) -> list[str]:
    """The tokens of a vocabulary in index order (idx 0 = <pad>, 1 = <unk>).

    Accepts `medtx.samples.vocab.Vocab`, or a plain token list (tests, ad-hoc use).
    """
    if isinstance(vocab, (list, tuple)):
        return list(vocab)
    for attr in ("tokens", "itos", "idx_to_token"):
        tokens = getattr(vocab, attr, None)
        if tokens is not None:
            return list(tokens)
    raise TypeError(f"cannot read the tokens of vocabulary {type(vocab).__name__}")


class CodeIndex:
    """Token -> id for one or several features' vocabularies, plus the special tokens a model needs.

    Ids 0 and 1 are <pad> and <unk> as in samples.vocab. With one feature the vocabulary's own indices are
    kept; with several, each feature's codes get their own ids (an ICD-9 diagnosis "3893" and a procedure
    "3893" are different tokens). `extra` specials ([CLS], [SEP], [MASK], ...) are appended after the codes.
    """

    def __init__(self, vocabs: dict[str, Any], features: Sequence[str], extra: Sequence[str] = ()) -> None:
        self.features = tuple(features)
        self.labels: list[str] = [PAD, UNK]  # display label per id
        self._ids: dict[tuple[str, str], int] = {}
        self._special: dict[str, int] = {PAD: 0, UNK: 1}
        for feature in self.features:
            if feature not in vocabs:
                raise ValueError(f"no vocabulary for feature {feature!r} (have {sorted(vocabs)})")
            for token in vocab_tokens(vocabs[feature]):
                if token in SPECIALS:  # [CLS]/[SEP] may be in the `codes` vocabulary of next_visit
                    continue
                self._ids[(feature, token)] = len(self.labels)
                self.labels.append(self.label(feature, token))
        self.n_codes = len(self.labels)  # ids [2, n_codes) are real codes (for MLM random replacement)
        for token in extra:
            self._special[token] = len(self.labels)
            self.labels.append(token)

    def __len__(self) -> int:
        return len(self.labels)

    def code(self, feature: str, token: str) -> int:
        return self._ids.get((feature, token), 1)

    def label(self, feature: str, token: str) -> str:
        """A code's readable label: prefixed by its feature when several share the index (diagnoses unprefixed)."""
        return token if len(self.features) == 1 or feature in ("conditions", "visits") else f"{feature}:{token}"

    def special(self, token: str) -> int:
        return self._special[token]


@dataclass
class LabelSpace:
    """The model's output labels: the label vocabulary without <pad>/<unk> (or one label when binary)."""

    names: list[str]
    binary: bool = False
    dropped: int = field(default=0, compare=False)  # label occurrences outside the vocabulary (not predictable)

    @classmethod
    def from_vocab(cls, label_vocab: Any, binary: bool, name: str = "positive") -> LabelSpace:
        """`name`: the one label of a binary task (its medtx.tasks `label_name`)."""
        if binary:
            return cls([name], binary=True)
        names = [t for t in vocab_tokens(label_vocab) if t not in SPECIALS]
        if not names:
            raise ValueError("the label vocabulary is empty: no labels in the training split?")
        return cls(names)

    def __post_init__(self) -> None:
        self.index = {name: i for i, name in enumerate(self.names)}

    def __len__(self) -> int:
        return len(self.names)

    def ids(self, labels: Iterable[str]) -> list[int]:
        """Known label ids, deduplicated, in label-vocabulary order."""
        known = {self.index[x] for x in labels if x in self.index}
        self.dropped += len(set(labels)) - len(known)
        return sorted(known)

    def target(self, value: Any) -> list[int] | float:
        """A row's label column -> label ids (multi-label) or 0/1 (binary)."""
        return float(bool(value)) if self.binary else self.ids(value or [])

    def multi_hot(self, targets: Sequence[list[int] | float]) -> Tensor:
        if self.binary:
            return torch.tensor(targets, dtype=torch.float32).unsqueeze(1)
        out = torch.zeros(len(targets), len(self.names))
        for row, ids in enumerate(targets):
            out[row, ids] = 1.0
        return out


def _rows(frame: frames.Frame, spec: Task, extra: Sequence[str] = ()) -> Iterable[dict]:
    """Row dicts with the columns a codec needs; a missing column is a clear error naming it."""
    needed = ["subject_id", "hadm_id", *spec.samples.features, spec.samples.label_column, *extra]
    have = frames.columns(frame)
    missing = [c for c in needed if c not in have]
    if missing:
        raise ValueError(f"samples.{spec.table} frame lacks column(s) {missing} (has {have})")
    return frames.rows(frame, needed)


def _base_item(row: dict, labels: LabelSpace, spec: Task) -> dict:
    return {"sample_id": str(row["hadm_id"]), "subject_id": int(row["subject_id"]),
            "hadm_id": int(row["hadm_id"]), "target": labels.target(row[spec.samples.label_column])}


def _pad(rows: Sequence[Sequence[int]], value: int = 0) -> Tensor:
    """Right-pad integer lists to one [B, max_len] long tensor (max_len >= 1)."""
    real = _mask([len(r) for r in rows])
    out = torch.full(real.shape, value, dtype=torch.long)
    # every value in one flat tensor, scattered to the real positions: a tensor from padded nested lists took 1.5x
    # longer (and a tensor per row 3-4x); EncodedSet collates each split once, so this runs over whole splits
    out[real] = torch.tensor(list(chain.from_iterable(rows)), dtype=torch.long)
    return out


def _mask(lengths: Sequence[int]) -> Tensor:
    """[B, width] bool, True at the first `lengths[b]` positions of row b; width: the longest, at least 1."""
    return torch.arange(max(1, max(lengths, default=0))) < torch.tensor(lengths, dtype=torch.long)[:, None]


def _widths(mask: Tensor) -> Tensor:
    """Per-row width `_pad` gives a row alone, from its padded mask [B, L] (True = real): its length, at least 1."""
    return mask.sum(1).clamp(min=1)


def _label_widths(labels: Tensor) -> dict[str, Tensor]:
    """The multi-hot `labels` [B, n_labels] are as wide alone as in any batch."""
    return {"labels": torch.full((labels.shape[0],), labels.shape[1], dtype=torch.long)}


def _base_batch(items: Sequence[dict], labels: LabelSpace) -> dict[str, Any]:
    return {"labels": labels.multi_hot([it["target"] for it in items]),
            "sample_id": [it["sample_id"] for it in items],
            "subject_id": [it["subject_id"] for it in items]}


# ----------------------------------------------------------------------------------------------- history codec


def flatten_history(visits: Sequence[Sequence[str] | None], max_visits: int, max_codes: int
                    ) -> tuple[list[str], list[int], int]:
    """Visit lists -> (codes, chronological visit index per code, number of visits kept).

    Keeps the last `max_visits` visits, then the last `max_codes` codes (the current visit matters most).
    An empty visit still counts as a visit (the blanked current drug history is 'a visit with no drugs').
    """
    kept = [list(v or []) for v in visits][-max_visits:] or [[]]
    codes = [c for v in kept for c in v]
    visit = [i for i, v in enumerate(kept) for _ in v]
    return codes[-max_codes:], visit[-max_codes:], len(kept)


JOINT = "codes"  # the batch key prefix of HistoryCodec's joint sequence (every feature's codes in one sequence)


def joint_history(flat: dict[str, tuple[list[str], list[int], int]], index: CodeIndex) -> dict[str, Any]:
    """Every feature's flattened history (`flatten_history` output per feature) as one sequence.

    Ordered visit by visit from the oldest, and within a visit feature by feature (in `index.features` order),
    each feature's codes in their own order, so the current visit's codes come last (the end an attention
    export keeps). A code's visit counts back from each feature's own last visit, so every feature's current
    visit lines up at the sequence's last visit whatever the feature's history length. Ids come from `index`,
    one id space for all features; tokens read `v<visit>:<code>`, the code as `CodeIndex.label` names it
    (`procedures:3893`; diagnoses unprefixed; an unknown code keeps its own text).
    """
    n = max(kept for _, _, kept in flat.values())
    entries = []  # (visit, feature order, position) -> id, visit, token
    for order, feature in enumerate(index.features):
        codes, visit, kept = flat[feature]
        for position, (code, v) in enumerate(zip(codes, visit, strict=True)):
            v = n - kept + v  # align the feature's last visit with the sequence's
            entries.append(((v, order, position), index.code(feature, code), v,
                            f"v{v + 1}:{index.label(feature, code)}"))
    entries.sort(key=lambda e: e[0])
    return {"ids": [e[1] for e in entries], "visit": [e[2] for e in entries], "nvisits": n,
            "tokens": [e[3] for e in entries]}


@dataclass
class HistoryCodec:
    """Per-feature flattened code histories for the Transformer, Transformer+RoPE and RNN models; with `joint`,
    also every feature's codes as one sequence under the key prefix `codes` (`joint_history`)."""

    task: Task
    index: dict[str, CodeIndex]  # feature -> its own code ids (one embedding table per feature)
    labels: LabelSpace
    max_visits: int = 20
    max_codes: int = 128  # per feature (the joint sequence holds up to this many codes of each feature)
    joint: CodeIndex | None = None  # all features' codes in one id space: the joint sequence's ids

    @property
    def sequences(self) -> tuple[str, ...]:
        """The key prefixes a batch carries: each feature's, then `codes` with a joint sequence."""
        return (*self.task.samples.features, *((JOINT,) if self.joint is not None else ()))

    def encode(self, frame: frames.Frame) -> list[dict]:
        items = []
        for row in _rows(frame, self.task):
            item = _base_item(row, self.labels, self.task)
            flat = {}
            for f in self.task.samples.features:
                codes, visit, n = flat[f] = flatten_history(row[f] or [], self.max_visits, self.max_codes)
                item[f] = {"ids": [self.index[f].code(f, c) for c in codes], "visit": visit, "nvisits": n,
                           "tokens": [f"v{v + 1}:{c}" for v, c in zip(visit, codes, strict=True)]}
            if self.joint is not None:
                item[JOINT] = joint_history(flat, self.joint)
            items.append(item)
        return items

    def collate(self, items: Sequence[dict]) -> dict[str, Any]:
        batch = _base_batch(items, self.labels)
        batch["tokens"] = {}
        for f in self.sequences:
            ids = _pad([it[f]["ids"] for it in items])
            batch[f"{f}_ids"] = ids
            batch[f"{f}_mask"] = _mask([len(it[f]["ids"]) for it in items])
            batch[f"{f}_visit"] = _pad([it[f]["visit"] for it in items])
            batch[f"{f}_nvisits"] = torch.tensor([it[f]["nvisits"] for it in items], dtype=torch.long)
            batch["tokens"][f] = [it[f]["tokens"] for it in items]
        return batch

    def row_widths(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Each row's width in `collate([item])` of that row, read off a collated batch (EncodedSet)."""
        widths = _label_widths(batch["labels"])
        for f in self.sequences:
            w = _widths(batch[f"{f}_mask"])
            widths |= {f"{f}_ids": w, f"{f}_mask": w, f"{f}_visit": w}
        return widths


def history_codec(task: Task, vocabs: dict[str, Any], labels: LabelSpace, max_visits: int, max_codes: int,
                  joint: bool = False) -> HistoryCodec:
    """`joint`: the batches also carry every feature's codes as one sequence (`joint_history`, key prefix `codes`)."""
    index = {f: CodeIndex(vocabs, [f]) for f in task.samples.features}
    return HistoryCodec(task, index, labels, max_visits, max_codes,
                        CodeIndex(vocabs, task.samples.features) if joint else None)


# ----------------------------------------------------------------------------------------------- BEHRT codec

AGE_UNKNOWN = 0  # age id 0 = padding / not recorded (drug_rec and readmission rows carry no age)


def behrt_sequence(visits: Sequence[Sequence[tuple[str, str]]], ages: Sequence[int] | None, max_len: int
                   ) -> tuple[list[tuple[str, str] | str], list[int], list[int], list[int]]:
    """[CLS] v1 [SEP] v2 [SEP] ... with age (+1; 0 = unknown), segment (0/1 alternating) and visit position.

    `visits` holds (feature, code) pairs per visit. When the sequence is longer than `max_len`, the oldest
    whole visits are dropped first (then the current visit's codes are cut) so [CLS] stays first.
    """
    blocks = []
    for v, codes in enumerate(visits):
        age = (ages[v] + 1) if ages is not None and v < len(ages) and ages[v] is not None else AGE_UNKNOWN
        block = [*codes, SEP]
        blocks.append((block, [age] * len(block), [v % 2] * len(block), [v] * len(block)))
    while len(blocks) > 1 and 1 + sum(len(b[0]) for b in blocks) > max_len:
        blocks.pop(0)
    tokens: list = [CLS]
    first_age = blocks[0][1][0] if blocks else AGE_UNKNOWN
    age_ids, segments, positions = [first_age], [0], [blocks[0][3][0] if blocks else 0]
    for block, a, s, p in blocks:
        tokens += block
        age_ids += a
        segments += s
        positions += p
    return tokens[:max_len], age_ids[:max_len], segments[:max_len], positions[:max_len]


def split_flat_codes(codes: Sequence[str]) -> list[list[str]]:
    """samples.next_visit.codes `[CLS] a b [SEP] c [SEP]` -> [[a, b], [c]]."""
    visits, current = [], []
    for c in codes:
        if c == CLS:
            continue
        if c == SEP:
            visits.append(current)
            current = []
        else:
            current.append(c)
    if current:
        visits.append(current)
    return visits


@dataclass
class BehrtCodec:
    """One BEHRT sequence per sample: input/age/segment/position ids, token labels, multi-hot target."""

    task: Task
    index: CodeIndex  # all features' codes + [CLS], [SEP], [MASK]
    labels: LabelSpace
    max_len: int = 128
    visit_ages: str | None = None  # the task's column of per-visit ages (BehrtConfig.visit_ages; None: no ages)

    def _visits(self, row: dict) -> tuple[list[list[tuple[str, str]]], list[int] | None]:
        if (ages := self.visit_ages) is not None:  # one visits column, with per-visit ages
            column = self.task.samples.features[0]
            return [[(column, c) for c in v] for v in (row[column] or [])], row.get(ages)
        n = max(len(row[f] or []) for f in self.task.samples.features)
        visits = [[(f, c) for f in self.task.samples.features
                   for c in ((row[f] or [])[v] if v < len(row[f] or []) else []) or []] for v in range(n)]
        return visits, None

    def encode(self, frame: frames.Frame) -> list[dict]:
        extra = tuple(c for c in (self.visit_ages,) if c is not None)
        items = []
        for row in _rows(frame, self.task, extra):
            item = _base_item(row, self.labels, self.task)
            visits, ages = self._visits(row)
            tokens, age_ids, segments, positions = behrt_sequence(visits, ages, self.max_len)
            ids = [self.index.special(t) if isinstance(t, str) else self.index.code(*t) for t in tokens]
            item["input_ids"] = ids
            item["age_ids"], item["segment_ids"], item["position_ids"] = age_ids, segments, positions
            # readable labels: the vocabulary's label, or the raw code when it is unknown (<unk>)
            item["tokens"] = [t[1] if i == 1 else self.index.labels[i] for t, i in zip(tokens, ids, strict=True)]
            items.append(item)
        return items

    def collate(self, items: Sequence[dict]) -> dict[str, Any]:
        batch = _base_batch(items, self.labels)
        for key in ("input_ids", "age_ids", "segment_ids", "position_ids"):
            batch[key] = _pad([it[key] for it in items])
        batch["attention_mask"] = _mask([len(it["input_ids"]) for it in items])
        batch["tokens"] = [it["tokens"] for it in items]
        if "mlm_input_ids" in items[0]:  # fixed validation masks for MLM pre-training (training.pretrain)
            batch["mlm_input_ids"] = _pad([it["mlm_input_ids"] for it in items])
            batch["mlm_labels"] = _pad([it["mlm_labels"] for it in items], value=-100)
        return batch

    def row_widths(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Each row's width in `collate([item])` of that row, read off a collated batch (EncodedSet): every
        sequence key is as long as the row's input ids (the MLM masks too)."""
        w = _widths(batch["attention_mask"])
        keys = ("input_ids", "age_ids", "segment_ids", "position_ids", "attention_mask", "mlm_input_ids", "mlm_labels")
        return _label_widths(batch["labels"]) | {k: w for k in keys if k in batch}


def behrt_codec(task: Task, vocabs: dict[str, Any], labels: LabelSpace, max_len: int,
                visit_ages: str | None = None) -> BehrtCodec:
    return BehrtCodec(task, CodeIndex(vocabs, task.samples.features, extra=(CLS, SEP, MASK)), labels, max_len, visit_ages)


# ----------------------------------------------------------------------------------------------- seq2seq codec

SEQ2SEQ_SOURCE = ("conditions", "procedures")  # the visit's ICD-9 diagnoses then ICD-9 procedures
N_TARGET_SPECIALS = 3  # target ids: 0 <pad>, 1 <bos>, 2 <eos>, then label i -> 3 + i


@dataclass
class Seq2SeqCodec:
    """A multi-label visit task as translation (drug_rec: current visit's ICD codes -> `<bos>` + its ATC-3 codes
    + `<eos>`)."""

    task: Task
    index: CodeIndex  # source ids: conditions + procedures codes + [SEP]
    labels: LabelSpace
    max_src: int = 96
    max_tgt: int = 48

    def encode(self, frame: frames.Frame) -> list[dict]:
        items = []
        for row in _rows(frame, self.task):
            item = _base_item(row, self.labels, self.task)
            src: list = []
            for f in SEQ2SEQ_SOURCE:
                current = (row[f] or [[]])[-1] or []
                src += [(f, c) for c in current] + [SEP]
            src = src[: self.max_src]
            item["src_ids"] = [self.index.special(t) if isinstance(t, str) else self.index.code(*t) for t in src]
            item["src_tokens"] = [t if isinstance(t, str) else t[1] for t in src]
            body = [N_TARGET_SPECIALS + i for i in item["target"]][: self.max_tgt - 2]
            item["tgt_ids"] = [1, *body, 2]
            items.append(item)
        return items

    def collate(self, items: Sequence[dict]) -> dict[str, Any]:
        batch = _base_batch(items, self.labels)
        batch["src_ids"] = _pad([it["src_ids"] for it in items])
        batch["src_mask"] = _mask([len(it["src_ids"]) for it in items])
        batch["tgt_ids"] = _pad([it["tgt_ids"] for it in items])
        batch["src_tokens"] = [it["src_tokens"] for it in items]
        batch["tgt_tokens"] = [[target_token(t, self.labels.names) for t in it["tgt_ids"]] for it in items]
        return batch

    def row_widths(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Each row's width in `collate([item])` of that row, read off a collated batch (EncodedSet); a target
        holds no padding id (<bos> ... <eos>)."""
        w = _widths(batch["src_mask"])
        return _label_widths(batch["labels"]) | {"src_ids": w, "src_mask": w,
                                                 "tgt_ids": _widths(batch["tgt_ids"] != 0)}


def target_token(tgt_id: int, label_names: Sequence[str]) -> str:
    """A seq2seq target id -> its label (or <pad>/<bos>/<eos>)."""
    return (PAD, BOS, EOS)[tgt_id] if tgt_id < N_TARGET_SPECIALS else label_names[tgt_id - N_TARGET_SPECIALS]


def seq2seq_codec(task: Task, vocabs: dict[str, Any], labels: LabelSpace, max_src: int, max_tgt: int
                  ) -> Seq2SeqCodec:
    return Seq2SeqCodec(task, CodeIndex(vocabs, SEQ2SEQ_SOURCE, extra=(SEP,)), labels, max_src, max_tgt)
