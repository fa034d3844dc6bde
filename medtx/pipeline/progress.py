"""Progress of a running pipeline: its plan (ml.pipeline_plan), which steps are done / running / queued /
failed, and an ETA from the step durations of earlier runs.

The pipeline writes the plan at its start and marks each step when it starts; finished steps are in
ml.pipeline_steps. Everything that reads progress (the console display, the dashboard's overview over a
published snapshot) uses the pure functions below, so both count and estimate the same way.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import duckdb

from medtx.store.db import open_warehouse, transaction

DONE, RUNNING, QUEUED, FAILED = "done", "running", "queued", "failed"


@dataclass(frozen=True)
class PlannedStep:
    name: str
    kind: str
    expected_seconds: float | None  # the duration of this step in the latest earlier run (None: never ran)


@dataclass(frozen=True)
class StepProgress:
    name: str
    kind: str
    status: str  # DONE, RUNNING, QUEUED or FAILED
    expected_seconds: float | None = None
    started_at: datetime | None = None
    seconds: float | None = None  # how long it took, once finished


def previous_durations(con: duckdb.DuckDBPyConnection, names: list[str]) -> dict[str, float]:
    """Seconds each named step took the latest time it finished (completed, cached or failed)."""
    if not names:
        return {}
    rows = con.execute(
        "SELECT step, seconds FROM ml.pipeline_steps WHERE step IN (SELECT unnest(?)) AND seconds IS NOT NULL "
        "AND state <> 'skipped' QUALIFY row_number() OVER (PARTITION BY step ORDER BY finished_at DESC) = 1",
        [names],
    ).fetchall()
    return dict(rows)


def write_plan(db: Path | str, pipeline_run_id: str, steps: list[tuple[str, str]]) -> list[PlannedStep]:
    """Record the (name, kind) steps this run will walk, in order, with their expected durations."""
    with open_warehouse(db) as con, transaction(con):
        expected = previous_durations(con, [name for name, _ in steps])
        con.execute("DELETE FROM ml.pipeline_plan WHERE pipeline_run_id = ?", [pipeline_run_id])
        planned = [PlannedStep(name, kind, expected.get(name)) for name, kind in steps]
        if planned:
            con.executemany(
                "INSERT INTO ml.pipeline_plan (pipeline_run_id, step, kind, position, expected_seconds) "
                "VALUES (?, ?, ?, ?, ?)",
                [[pipeline_run_id, p.name, p.kind, i, p.expected_seconds] for i, p in enumerate(planned)],
            )
    return planned


def mark_started(db: Path | str, pipeline_run_id: str, step: str) -> None:
    with open_warehouse(db) as con:
        con.execute("UPDATE ml.pipeline_plan SET started_at = ? WHERE pipeline_run_id = ? AND step = ?",
                    [datetime.now(), pipeline_run_id, step])


def step_status(state: str | None, started_at: datetime | None) -> str:
    """ml.pipeline_steps state (None: not finished) + plan start time -> DONE / FAILED / RUNNING / QUEUED."""
    if state in ("completed", "cached"):
        return DONE
    if state in ("failed", "skipped"):
        return FAILED
    return RUNNING if started_at is not None else QUEUED


def remaining_seconds(steps: list[StepProgress], now: datetime) -> float | None:
    """Expected seconds until every unfinished step is done: queued steps take their expected time, running
    ones what is left of it; a step that never ran counts as the median known step. None when nothing is known."""
    known = [s.expected_seconds for s in steps if s.expected_seconds is not None]
    if not known:
        return None
    typical = statistics.median(known)
    left = 0.0
    for s in steps:
        expected = s.expected_seconds if s.expected_seconds is not None else typical
        if s.status == QUEUED:
            left += expected
        elif s.status == RUNNING:
            spent = (now - s.started_at).total_seconds() if s.started_at else 0.0
            left += max(expected - spent, 0.0)
    return left


def counts(steps: list[StepProgress]) -> dict[str, int]:
    """{done, running, queued, failed} -> number of steps, every key present."""
    out = dict.fromkeys((DONE, RUNNING, QUEUED, FAILED), 0)
    for s in steps:
        out[s.status] += 1
    return out


def format_seconds(seconds: float | None) -> str:
    """`75.2` -> `1m 15s`; None -> `?`."""
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
