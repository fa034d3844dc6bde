"""Pipeline bookkeeping in the warehouse: ml.pipeline_runs (one row per flow run) and ml.pipeline_steps
(one row per step of a run), plus the cache-validity check built on them.

Why the check: a Prefect cache hit only says "this task already ran with these inputs". Steps write the
warehouse, so a hit is only honest if the warehouse still holds what that run wrote. Each completed step
records the fingerprint of its output rows; before reusing a cached result the flow recomputes that
fingerprint and forces a refresh when it differs (rows deleted, re-written by hand, a wiped warehouse).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from medtx.store.db import open_warehouse, param_marks, transaction
from medtx.store.fingerprint import code_version, source_fingerprint, tables_fingerprint, text_hash
from medtx.pipeline.plan import Step
from medtx.store.run_owners import Interrupted, claim, heartbeat, holds_run, mark_interrupted

log = logging.getLogger("medtx.pipeline")

STATES = ("completed", "cached", "failed", "skipped")


@dataclass(frozen=True)
class StepOutcome:
    """What happened to one step in one pipeline run."""

    step: Step
    state: str  # one of STATES
    input_key: str | None = None
    output_scope: dict[str, Any] | None = None
    output_fingerprint: str | None = None
    error: str | None = None
    seconds: float | None = None
    result: dict[str, Any] | None = None


def start_pipeline_run(db: Path | str, pipeline_run_id: str, config: dict[str, Any]) -> list[Interrupted]:
    """Mark runs whose owner is gone as interrupted, then insert (or restart) this flow run's
    ml.pipeline_runs row as 'running', owned by this process. Returns the runs it marked interrupted."""
    with open_warehouse(db) as con, transaction(con):
        interrupted = mark_interrupted(con)
        con.execute("DELETE FROM ml.pipeline_steps WHERE pipeline_run_id = ?", [pipeline_run_id])
        con.execute("DELETE FROM ml.pipeline_runs WHERE pipeline_run_id = ?", [pipeline_run_id])
        con.execute(
            "INSERT INTO ml.pipeline_runs (pipeline_run_id, config, status, started_at) VALUES (?, ?, 'running', ?)",
            [pipeline_run_id, json.dumps(config, default=str), datetime.now()],
        )
        claim(con, "ml.pipeline_runs", pipeline_run_id)
    return interrupted


def finish_pipeline_run(db: Path | str, pipeline_run_id: str, failed: list[str]) -> str | None:
    """Mark the run completed, or failed with the names of the failed steps as its error text. Writes only
    while this process owns the running row (a failure handler must never touch a run it does not hold);
    returns the status written, or None when it did not hold the run."""
    status = "failed" if failed else "completed"
    error = f"{len(failed)} step(s) failed: {', '.join(failed)}" if failed else None
    with open_warehouse(db) as con, transaction(con):
        if not holds_run(con, "ml.pipeline_runs", pipeline_run_id):
            log.warning("pipeline run %s is not held by this process: leaving it as it is", pipeline_run_id)
            return None
        con.execute(
            "UPDATE ml.pipeline_runs SET status = ?, finished_at = ?, error = ? WHERE pipeline_run_id = ?",
            [status, datetime.now(), error, pipeline_run_id],
        )
    return status


def record_step(db: Path | str, pipeline_run_id: str, outcome: StepOutcome) -> None:
    """Write (idempotently) the ml.pipeline_steps row of one step."""
    s = outcome.step
    with open_warehouse(db) as con, transaction(con):
        heartbeat(con, "ml.pipeline_runs", pipeline_run_id)  # the flow is alive: it just finished a step
        con.execute("DELETE FROM ml.pipeline_steps WHERE pipeline_run_id = ? AND step = ?", [pipeline_run_id, s.name])
        con.execute(
            "INSERT INTO ml.pipeline_steps (pipeline_run_id, step, kind, dataset, task, model, state, input_key,"
            " output_scope, output_fingerprint, error, seconds, finished_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                pipeline_run_id, s.name, s.kind.name, s.dataset, s.task_name, s.model, outcome.state, outcome.input_key,
                json.dumps(outcome.output_scope) if outcome.output_scope is not None else None,
                outcome.output_fingerprint, outcome.error, outcome.seconds, datetime.now(),
            ],
        )


def input_fingerprints(db: Path | str, step: Step) -> dict[str, str]:
    """The explicit cache inputs of a step: upstream table rows, local source files, and code version."""
    prints = {"code": code_version(*step.code)}
    table = step.params.get("table")
    # A dataset's ingest step reads one file per table of the folder (and nothing else in it).
    prefixes = [f"{t}." for t in step.params.get("tables") or [table]] if step.kind.name == "ingest" else [""]
    if table == "oracle":
        prefixes = ["oracle_"]
    for i, path in enumerate(step.files):
        for prefix in prefixes:
            key = f"file{i}" if len(prefixes) == 1 else f"file{i}.{prefix}"
            prints[key] = source_fingerprint(path, prefix) if Path(path).exists() else "missing"
    if step.reads:
        with open_warehouse(db) as con:
            prints["reads"] = tables_fingerprint(con, step.reads, step.scope)
    return prints


def input_key(step: Step, fingerprints: dict[str, str]) -> str:
    """The step's cache key (params + fingerprints: tables read, source files, code), in ml.pipeline_steps."""
    return text_hash(step.name, json.dumps(step.params, sort_keys=True, default=str),
                     json.dumps(fingerprints, sort_keys=True))


def output_scope(step: Step, result: dict[str, Any] | None) -> dict[str, Any]:
    """What the output fingerprint covers: the run ids a train step wrote, else the step's scope."""
    if step.kind.name == "train":
        return {"run_id": list((result or {}).get("run_ids", []))}
    return dict(step.scope)


def output_fingerprint(db: Path | str, step: Step, scope: dict[str, Any]) -> str:
    with open_warehouse(db) as con:
        return tables_fingerprint(con, step.writes, scope)


def cached_scope(db: Path | str, step: Step, key: str) -> dict[str, Any] | None:
    """The output scope of the latest successful run of `step` with this input key when the output it left is
    unchanged (the step may be reused: the executor's cache), else None."""
    with open_warehouse(db) as con:
        rows = con.execute(
            "SELECT output_scope, output_fingerprint FROM ml.pipeline_steps"
            " WHERE step = ? AND input_key = ? AND state IN ('completed', 'cached')"
            " ORDER BY finished_at DESC LIMIT 1",
            [step.name, key],
        ).fetchall()
        if not rows or rows[0][1] is None:
            return None
        scope = json.loads(rows[0][0]) if rows[0][0] else {}
        current = tables_fingerprint(con, step.writes, scope)
        # a training whose run is not `completed` (one a medtx before 2026-11-29 marked failed after its step
        # completed) is trained again, never reused
        unfinished = con.execute("SELECT run_id, status FROM ml.runs WHERE run_id IN (SELECT unnest(?::VARCHAR[])) "
                                 "AND status <> 'completed' ORDER BY 1", [list(scope.get("run_id", []))]).fetchall()
    if unfinished:
        log.info("%s: its run %s is %s; training it again", step.name, *unfinished[0])
        return None
    if current != rows[0][1]:
        log.info("%s: warehouse output changed since it was cached; recomputing", step.name)
        return None
    return scope


def cache_still_valid(db: Path | str, step: Step, key: str) -> bool:
    """True when the latest successful run of `step` with this input key left output that is unchanged."""
    return cached_scope(db, step, key) is not None


def cached_result(step: Step, scope: dict[str, Any]) -> dict[str, Any]:
    """What a reused step hands on, as its function would have returned it: a training's run ids."""
    return {"run_ids": list(scope.get("run_id", []))} if step.kind.name == "train" else {"cached": True}


def step_table(db: Path | str, pipeline_run_id: str) -> list[dict[str, Any]]:
    """The steps of one run as rows (for the Prefect artifact and the CLI summary)."""
    with open_warehouse(db) as con:
        cur = con.execute(
            "SELECT step, state, round(seconds, 2) AS seconds, coalesce(left(error, 200), '') AS error"
            " FROM ml.pipeline_steps WHERE pipeline_run_id = ? ORDER BY finished_at",
            [pipeline_run_id],
        )
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _rows(con, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def metrics_rows(db: Path | str, run_ids: list[str]) -> list[dict[str, Any]]:
    """Test metrics of the given runs, one row per (run, metric): the value with its 95% interval (bootstrap with
    replacement over test patients; none where none is valid) and, named as the second convention it is, the
    SafeDrug sd (10 subsamples of 80% of the test patients, about half as wide)."""
    if not run_ids:
        return []
    with open_warehouse(db) as con:
        return _rows(
            con,
            "SELECT r.dataset, r.task, r.model, r.seed, r.status, m.metric, m.averaging,"
            " round(m.value, 4) AS value, round(m.ci_low, 4) AS ci95_low, round(m.ci_high, 4) AS ci95_high,"
            " round(m.sd, 4) AS safedrug_sd"
            f" FROM ml.runs r LEFT JOIN ml.metrics m ON m.run_id = r.run_id AND m.split = 'test'"
            f" WHERE r.run_id IN ({param_marks(len(run_ids))}) ORDER BY r.task, r.dataset, r.model, r.seed, m.metric, m.averaging",
            run_ids,
        )


def data_quality_markdown(db: Path | str) -> str:
    """Rows loaded/rejected per ingested table and NDC->ATC-3 coverage per dataset, as Markdown."""
    lines = ["# Data quality", "", "| dataset | table | status | rows loaded | rows rejected |", "|---|---|---|---:|---:|"]
    with open_warehouse(db) as con:
        ingests = con.sql(
            "SELECT dataset, table_name, status, rows_loaded, rows_rejected FROM raw.ingest_log"
            " QUALIFY row_number() OVER (PARTITION BY dataset, table_name ORDER BY finished_at DESC) = 1"
            " ORDER BY dataset, table_name"
        ).fetchall()
        lines += [f"| {d} | {t} | {s} | {n:,} | {r:,} |" for d, t, s, n, r in ingests]
        coverage = con.sql(
            "SELECT dataset, route, n_rows, round(pct_rows, 3) FROM core.mapping_coverage"
            " WHERE kind = 'route' ORDER BY dataset, route"
        ).fetchall()
    if coverage:
        lines += ["", "## NDC -> ATC-3 coverage", "", "| dataset | route | rows | share of rows |", "|---|---|---:|---:|"]
        lines += [f"| {d} | {r} | {n:,} | {p} |" for d, r, n, p in coverage]
    return "\n".join(lines)
