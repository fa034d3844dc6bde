"""What a model or trainer config field accepts, declared on the config dataclass itself.

A config dataclass annotates its settings with these types (`d_model: Width = 32`). At run time they are plain
ints and floats; a pipeline config is checked against them at load (medtx.pipeline.checks validates the
overrides through pydantic's `TypeAdapter(ConfigClass)`, which reads the bounds), so `d_model: 0`, `lr: .inf`
or `d_model: 100000000` (a 128 GB embedding) is one line naming the key and the allowed range, before
anything runs. Constraints between fields live in the dataclass's `__post_init__` and raise `FieldProblem`,
which names the field; they also hold when a model is built directly.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictFloat, StrictInt

MAX_WIDTH = 8192  # embedding / hidden sizes (BERT-large: 1024)
MAX_FF = 4 * MAX_WIDTH
MAX_HEADS = 256
MAX_LAYERS = 64
MAX_LENGTH = 100_000  # tokens, codes or visits kept per sequence

Width = Annotated[StrictInt, Field(ge=1, le=MAX_WIDTH)]
FFWidth = Annotated[StrictInt, Field(ge=1, le=MAX_FF)]
Heads = Annotated[StrictInt, Field(ge=1, le=MAX_HEADS)]
Layers = Annotated[StrictInt, Field(ge=1, le=MAX_LAYERS)]
Length = Annotated[StrictInt, Field(ge=1, le=MAX_LENGTH)]
Epochs = Annotated[StrictInt, Field(ge=1, le=100_000)]
BatchSize = Annotated[StrictInt, Field(ge=1, le=1_000_000)]
Patience = Annotated[StrictInt, Field(ge=0, le=100_000)]
Count = Annotated[StrictInt, Field(ge=0)]  # an integer >= 0 (0 = off, where the field says so)
Positive = Annotated[StrictInt, Field(ge=1)]
DropoutRate = Annotated[StrictFloat, Field(ge=0, lt=1)]
LearningRate = Annotated[StrictFloat, Field(gt=0, le=10, allow_inf_nan=False)]
Decay = Annotated[StrictFloat, Field(ge=0, le=10, allow_inf_nan=False)]
PositiveFloat = Annotated[StrictFloat, Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[StrictFloat, Field(ge=0, le=1)]
Device = Annotated[str, Field(pattern=r"^(cpu|auto|cuda|cuda:\d+|mps)$")]


class FieldProblem(ValueError):
    """A config field whose value does not fit another field's (`n_heads` must divide `d_model`)."""

    def __init__(self, fields: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.fields = fields  # the fields that disagree (a config check names whichever one the user set)
        self.message = message


def check_heads(d_model: int, n_heads: int, width: str = "d_model", heads: str = "n_heads") -> None:
    """Attention splits `width` into `heads` equal parts: `heads` must divide it."""
    if isinstance(d_model, int) and isinstance(n_heads, int) and n_heads >= 1 and d_model % n_heads:
        divisors = [h for h in range(1, min(d_model, MAX_HEADS) + 1) if d_model % h == 0]
        raise FieldProblem((heads, width), f"{heads} = {n_heads} does not divide {width} = {d_model}; allowed "
                                           f"{heads}: {', '.join(map(str, divisors))}")
