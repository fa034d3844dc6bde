"""`Vocab`: token <-> index of one stored vocabulary (`samples.vocab`, built by medtx.samples.vocab). Pure Python
and imported by the models as by the builders, so a worker that trains from a package (medtx.worker) loads it
without the warehouse (medtx.samples.vocab itself needs DuckDB).

idx 0 = `<pad>`, 1 = `<unk>`, then the task's specials, then tokens by descending training count.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD, UNK = "<pad>", "<unk>"
PAD_IDX, UNK_IDX = 0, 1


class Vocab:
    """Token <-> index for one (dataset, task, feature)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        if list(tokens[:2]) != [PAD, UNK]:
            raise ValueError(f"a vocabulary starts with {PAD!r}, {UNK!r}; got {list(tokens[:2])}")
        self.tokens: list[str] = list(tokens)
        self.index: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: str) -> bool:
        return token in self.index

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Indices of `tokens`; unknown tokens -> 1 (`<unk>`)."""
        return [self.index.get(t, UNK_IDX) for t in tokens]

    def decode(self, ids: Sequence[int]) -> list[str]:
        return [self.tokens[i] for i in ids]
