"""Task `specialty`: MTSamples transcription -> medical specialty, split by groups of identical text
(builder in medtx/samples/specialty.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import SAMPLE_EXTRAS, BuildContext, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    from medtx.samples.specialty import build_specialty

    return build_specialty(con, seed=ctx.seed, fractions=ctx.fractions, min_count=ctx.min_count)


TASK = Task(
    name="specialty",
    kind="multiclass",
    family="text",
    sample_table="samples.specialty",
    sample_columns=("note_id", "text", "label", "group_id", "split", "conflicting"),
    features=("text",),
    label_column="label",
    label_feature="label",
    split_unit="text_group",
    metrics=("accuracy", "macro_f1"),
    monitor="macro_f1",
    compared=(("macro_f1", "none"), ("accuracy", "none")),
    build=build,
    reads=("raw.mtsamples", "raw.meds_splits"),  # splits: medtx.samples.splits honours imported MEDS splits
    writes=("samples.specialty", *SAMPLE_EXTRAS),
    dataset="mtsamples",
    order=50,
    description="medical specialty of a transcription (multi-class)",
)
