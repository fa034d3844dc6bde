"""The order a pipeline submits its trainings in: longest expected first.

With N trainings at once, the layer ends when the last one does. Submitted in plan order, the long text
trainings (BiLSTM and the small BERT over notes, the FAQ seq2seq) came last and ran alone at the tail while the
other slots idled (the default pipeline, 2026-11-24: 546 s of wall time for 896 s of training on 2 slots, 448 s
if packed perfectly). Longest-processing-time-first is the classic fix (Graham 1969: within 4/3 of the best
schedule): the expected duration of a step is what it took the last time it ran to completion
(ml.pipeline_steps); a step that never ran goes first (an unknown cost may be a long one), ordered by a coarse
cost class of its model family and then by its number of training split units (patients, text groups, pairs).
Pure functions: the flow reads the history and the unit counts, then calls `longest_first`.

One exception goes before all of that: the trainings of models that may be a task's reference baseline
(logreg, lightgbm, ...) are submitted first. They fit in seconds, and a run's per-group verdicts name the
reference of its (task, dataset): recorded after the neural runs, each better baseline made every run already
recorded recompute its verdicts (the default pipeline, 2026-11-29: 18 such recomputes, 30 s of 310 s wall).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Protocol

import duckdb

from medtx.tasks import Task

# Coarse cost class of a model family for a step that never ran (higher first): neural text models read
# hundreds of tokens per note, the FAQ generator trains on every fold, EHR neural models read short code
# sequences; baselines fit in seconds.
COST_CLASS: Mapping[str, int] = {"text": 3, "faq": 2, "ehr": 1}


class TrainStep(Protocol):
    name: str
    dataset: str | None
    scope: dict


def completed_durations(con: duckdb.DuckDBPyConnection, names: Sequence[str]) -> dict[str, float]:
    """Seconds each named step took the latest time it ran to completion (a cache hit or a failure says
    nothing about what the work costs)."""
    if not names:
        return {}
    rows = con.execute(
        "SELECT step, seconds FROM ml.pipeline_steps WHERE step IN (SELECT unnest(?)) AND state = 'completed' "
        "AND seconds IS NOT NULL QUALIFY row_number() OVER (PARTITION BY step ORDER BY finished_at DESC) = 1",
        [list(names)],
    ).fetchall()
    return dict(rows)


def train_units(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], int]:
    """Training split units (patients, text groups, pairs) per (dataset, samples task)."""
    rows = con.execute(
        "SELECT dataset, task, count(*) FROM samples.splits WHERE split = 'train' GROUP BY ALL").fetchall()
    return {(dataset, task): n for dataset, task, n in rows}


def longest_first(steps: Sequence[TrainStep], families: Mapping[str, str], history: Mapping[str, float],
                  units: Mapping[tuple[str, str], int], references: Set[str] = frozenset()) -> list[TrainStep]:
    """`steps` in submission order: the steps named in `references` (reference-baseline trainings) first, then
    never-run steps (by cost class of `families[step.name]`, then training units), then the others by their
    last completed duration, longest first; each group in that same order within. Ties keep plan order."""

    def key(step: TrainStep) -> tuple[bool, int, float, int]:
        first = step.name in references
        if step.name in history:
            return (first, 0, history[step.name], 0)
        n = units.get((str(step.scope.get("dataset")), str(step.scope.get("task"))), 0)
        return (first, 1, COST_CLASS.get(families.get(step.name, ""), 0), n)

    return sorted(steps, key=key, reverse=True)


def model_family(task: Task, model: str) -> str:
    """The registry family of the model a step trains for its task (e.g. `seq2seq` is "faq" on the FAQ);
    "" when the registry offers no such model for the task."""
    from medtx.models.registry import model_families, specs

    return next((f for f in model_families(task) for s in specs(f) if s.name == model and s.serves(task)), "")
