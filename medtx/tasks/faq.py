"""Task `faq`: answer generation / retrieval for the Mental Health FAQ, cross-validated over question-answer
pairs (builder in medtx/samples/faq.py; it reads the bundled CSV files, no warehouse table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from medtx.tasks.base import BuildContext, Task

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb


def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
    from medtx.samples.faq import build_faq

    return build_faq(con, ctx.data_dir, seed=ctx.seed, k_folds=ctx.k_folds)


TASK = Task(
    name="faq",
    kind="generation",
    family="text",
    sample_table="samples.faq",
    sample_columns=("pair_id", "question", "answer", "paraphrase", "fold"),
    features=("question",),
    label_column="answer",
    split_unit="pair",
    metrics=("token_f1", "exact_match"),
    monitor="loss",
    compared=(("token_f1", "none"), ("exact_match", "none")),
    build=build,
    writes=("samples.faq", "samples.task_summary"),
    files=("mental_health_faq",),
    dataset="mental_health_faq",
    models=("retrieval", "seq2seq"),
    order=60,
    description="answer to a mental-health question (generation; retrieval baseline)",
)
