"""The leakage gate: before any training, is a task's sample set free of the three leaks medtx can check?

Run per (task, dataset) after the task's samples are built (medtx.tasks.build.build_samples) and recorded in
`samples.leakage_gate` (+ `samples.leakage_shortcuts`); training refuses a task whose record says `blocked`
(`require_pass`). The checks read the warehouse, not the builder's word:

(a) split overlap: every sample row's patient is read from raw.admissions by its hadm_id (not from the row's
    subject_id); a patient whose rows sit in more than one split of the task fails the gate. Rows whose hadm_id
    raw.admissions does not know fail too (their patient cannot be checked).
(b) late codes: the sample's prediction time is recomputed from raw.admissions and the task's clock
    (`Task.prediction_time`), and every code of every event-sourced feature column (`Task.feature_sources`) must be
    explained by an event of that patient, with that source and code, known at or before it (medtx.samples.clock's
    event times). A code known only later, or a stored `prediction_time` that disagrees with the recomputed one,
    fails the gate. (The check is by patient, source and code: a code the patient also had earlier passes, so it
    proves "nothing the patient could not have known then", the leak that matters.)
(c) shortcut audit, on the validation split: for a binary task, any single token of any feature column whose
    presence alone reaches AUROC >= SHORTCUT_AUROC (either direction: max(AUROC, 1 - AUROC)); for a multi-label
    task, any feature column whose last visit equals the label set in >= SHORTCUT_EXACT_SHARE of validation
    samples (an audit needs >= AUDIT_MIN_CLASS validation samples of each class; otherwise the record says it
    was not run). Flagged features are named; they make the task `suspect` (not blocked) until a person acknowledges
    them in the pipeline config (`leakage: {acknowledge: {<task>: ["<feature>:<token>", ...]}}`, `<feature>:*`
    for a multi-label column; docs/TASKS.md).

A failed (a) or (b) is `blocked` with one line naming the task, dataset and first offending row.
Tasks the gate does not cover (text corpora split by text group or by pair) get no record.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from medtx.store.db import quote_ident, quote_table
from medtx.tasks.base import Task
from medtx.tasks.verdict import LeakageError, check_gate_rows, gated

__all__ = ["GateResult", "LeakageError", "Shortcut", "check_gate_rows", "gate_all", "gated", "require_pass",
           "run_gate"]

if TYPE_CHECKING:  # annotations only: the training worker checks the gate's record without DuckDB
    import duckdb
from medtx.samples.clock import STAYS_SQL, create_event_view

log = logging.getLogger("medtx.leakage")

SHORTCUT_AUROC = 0.95
SHORTCUT_EXACT_SHARE = 0.95
# Below this many validation positives (or negatives), one code present in the few positives reaches AUROC 1 by
# chance: the audit is not run and the record says so (the MIMIC-III demo's validation split has 1-5 positives).
AUDIT_MIN_CLASS = 10
GATE_TABLE = "samples.leakage_gate"
SHORTCUTS_TABLE = "samples.leakage_shortcuts"
EVENTS = "_gate_events"
ROWS = "_gate_rows"


@dataclass(frozen=True)
class Shortcut:
    feature: str
    token: str  # the code, or '*' for a whole multi-label column
    metric: str  # 'val_auroc' | 'val_exact_share'
    value: float
    acknowledged: bool = False

    @property
    def name(self) -> str:
        return f"{self.feature}:{self.token}"


@dataclass(frozen=True)
class GateResult:
    task: str
    dataset: str
    status: str  # 'pass' | 'suspect' | 'blocked'
    samples: int
    split_overlap: int
    late_codes: int | None  # None: not checked (no clock)
    shortcuts: tuple[Shortcut, ...] = field(default_factory=tuple)
    message: str = ""

    @property
    def blocked(self) -> bool:
        return self.status == "blocked"


def _rows_sql(task: Task, owner: Task) -> str:
    """The task's sample rows of `$dataset` (the owner task's table, filtered on `task` when shared)."""
    own_sql = " AND task = $owner" if owner.shared_table else ""
    return f"SELECT * FROM {quote_table(owner.sample_table)} WHERE dataset = $dataset{own_sql}"


def split_overlap(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> tuple[int, str | None]:
    """(a) patients (read from raw.admissions) whose sample rows sit in more than one split, and the first one."""
    params = {"dataset": dataset, "split_task": task.samples_task}
    rows = con.execute(f"""
        WITH stays AS ({STAYS_SQL}),
        r AS (
            SELECT r.hadm_id, r.subject_id AS row_subject, st.subject_id AS patient, sp.split
            FROM {ROWS} r
            LEFT JOIN stays st USING (hadm_id)
            LEFT JOIN samples.splits sp ON sp.dataset = $dataset AND sp.task = $split_task
                                       AND sp.subject_id = r.subject_id
        )
        SELECT coalesce(patient, -1) AS patient, list(DISTINCT split ORDER BY split) AS splits,
               min(hadm_id) FILTER (WHERE patient IS NULL) AS unknown_hadm,
               list(hadm_id ORDER BY hadm_id) AS hadm_ids
        FROM r GROUP BY ALL
        HAVING patient = -1 OR count(DISTINCT split) > 1 OR count(*) FILTER (WHERE split IS NULL) > 0
        ORDER BY patient""", params).fetchall()
    if not rows:
        return 0, None
    patient, splits, unknown, hadm_ids = rows[0]
    if patient == -1:
        first = f"sample hadm_id {unknown} is no admission of raw.admissions, so its patient cannot be checked"
    elif any(s is None for s in splits) or len(splits) < 2:
        first = f"patient {patient} (raw.admissions) has sample rows without a split (hadm_ids {hadm_ids[:5]})"
    else:
        first = (f"patient {patient} (raw.admissions) has samples in splits {', '.join(s for s in splits if s)} "
                 f"(hadm_ids {hadm_ids[:5]})")
    return len(rows), first


def late_codes(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> tuple[int | None, str | None]:
    """(b) feature codes no event explains at or before the recomputed prediction time (+ disagreeing stored
    prediction times); None when the task has no clock."""
    if task.prediction_time is None:
        return None, None
    clock_sql = task.prediction_time  # a SQL expression written in the task's file (code, not data)
    truth_sql = f"""
        SELECT hadm_id, subject_id AS patient, CAST(({clock_sql}) AS TIMESTAMP) AS pt
        FROM ({STAYS_SQL})"""
    params = {"dataset": dataset}
    columns = set(con.sql(f"SELECT * FROM {ROWS} LIMIT 0").columns)
    stored_sql = "r.prediction_time" if "prediction_time" in columns else "NULL"
    bad_clock = con.execute(f"""
        SELECT r.hadm_id, {stored_sql} AS stored, t.pt FROM {ROWS} r LEFT JOIN ({truth_sql}) t USING (hadm_id)
        WHERE t.pt IS NULL OR {stored_sql} IS DISTINCT FROM t.pt ORDER BY r.hadm_id""", params).fetchall()
    n, first = len(bad_clock), None
    if bad_clock:
        hadm, got, want = bad_clock[0]
        first = (f"sample hadm_id {hadm} stores prediction_time {got}, the clock ({task.prediction_time}) over "
                 f"raw.admissions gives {want}")
    for feature, source in task.feature_sources:
        if source == "static" or feature not in columns:
            continue
        late = con.execute(f"""
            WITH t AS ({truth_sql}),
            codes AS (
                SELECT DISTINCT r.hadm_id, t.patient, t.pt, unnest(flatten(r.{quote_ident(feature)})) AS code
                FROM {ROWS} r JOIN t USING (hadm_id)
            )
            SELECT c.hadm_id, c.patient, c.pt, c.code FROM codes c
            WHERE NOT EXISTS (SELECT 1 FROM {EVENTS} e WHERE e.subject_id = c.patient AND e.source = $source
                              AND e.code = c.code AND e.time <= c.pt)
            ORDER BY c.hadm_id, c.code""", {**params, "source": source}).fetchall()
        n += len(late)
        if late and first is None:
            hadm, patient, pt, code = late[0]
            known = con.execute(f"SELECT min(time) FROM {EVENTS} WHERE subject_id = ? AND source = ? AND code = ?",
                                [patient, source, code]).fetchall()[0][0]
            first = (f"sample hadm_id {hadm} (patient {patient}) holds {feature} code {code!r} ({source}), known "
                     f"{'only at ' + str(known) if known else 'by no event of the patient'}, after its prediction "
                     f"time {pt}")
    return n, first


def audit_shortcuts(con: duckdb.DuckDBPyConnection, task: Task, dataset: str,
                    acknowledge: Collection[str] = ()) -> tuple[tuple[Shortcut, ...], str | None]:
    """(c) single features that alone nearly give the label away on validation; (flagged, why-not-checked)."""
    params = {"dataset": dataset, "split_task": task.samples_task}
    val_sql = f"""SELECT r.* FROM {ROWS} r JOIN samples.splits sp ON sp.dataset = $dataset AND sp.task = $split_task
              AND sp.subject_id = r.subject_id WHERE sp.split = 'val'"""
    ack = set(acknowledge)
    found: list[Shortcut] = []
    features = [f for f in task.features if f in set(con.sql(f"SELECT * FROM {ROWS} LIMIT 0").columns)]
    if task.kind == "binary":
        label_sql = quote_ident(task.label_column)
        pos, neg = con.execute(f"SELECT count(*) FILTER (WHERE {label_sql}), count(*) FILTER (WHERE NOT {label_sql}) "
                               f"FROM ({val_sql})", params).fetchall()[0]
        if min(pos, neg) < AUDIT_MIN_CLASS:
            return (), (f"shortcut audit not run: the validation split holds {pos} positive and {neg} negative "
                        f"samples, fewer than {AUDIT_MIN_CLASS} of a class")
        for feature in features:
            if task.family != "ehr":
                continue  # text columns: no token audit
            rows = con.execute(f"""
                WITH tok AS (SELECT DISTINCT hadm_id, {label_sql} AS y, unnest(flatten({quote_ident(feature)})) AS token FROM ({val_sql}))
                SELECT token, 0.5 * (1 + count(*) FILTER (WHERE y) / {int(pos)} - count(*) FILTER (WHERE NOT y) / {int(neg)})
                       AS auroc
                FROM tok GROUP BY token ORDER BY token""", params).fetchall()
            for token, auroc in rows:
                value = max(auroc, 1.0 - auroc)
                if value >= SHORTCUT_AUROC:
                    found.append(Shortcut(feature, token, "val_auroc", value, f"{feature}:{token}" in ack))
    elif task.kind == "multilabel":
        label_sql = quote_ident(task.label_column)
        for feature in features:
            share = con.execute(f"""
                SELECT avg(CASE WHEN list_sort(list_distinct({quote_ident(feature)}[-1])) = list_sort(list_distinct({label_sql}))
                           THEN 1.0 ELSE 0.0 END)
                FROM ({val_sql}) WHERE len({label_sql}) > 0""", params).fetchall()[0][0]
            if share is not None and share >= SHORTCUT_EXACT_SHARE:
                found.append(Shortcut(feature, "*", "val_exact_share", share, f"{feature}:*" in ack))
    return tuple(found), None


def run_gate(con: duckdb.DuckDBPyConnection, task: Task, dataset: str, owner: Task | None = None,
             acknowledge: Collection[str] = ()) -> GateResult | None:
    """Check (a), (b), (c) for one task and dataset, replace its record, and return it (None: not gated).

    `owner`: the task whose builder filled the sample table (defaults to `task.samples_task` looked up by the
    caller; pass it to avoid a registry lookup). `acknowledge`: the config's acknowledged shortcuts for this
    task (`feature:token`)."""
    if not gated(task):
        return None
    if owner is None:
        from medtx.tasks import get_task
        owner = get_task(task.samples_task)
    params = {"dataset": dataset, **({"owner": owner.name} if owner.shared_table else {})}
    con.execute(f"CREATE OR REPLACE TEMP TABLE {ROWS} AS {_rows_sql(task, owner)}", params)
    try:
        create_event_view(con, dataset, EVENTS)
        n = con.sql(f"SELECT count(*) FROM {ROWS}").fetchall()[0][0]
        overlap, first_a = split_overlap(con, task, dataset)
        late, first_b = late_codes(con, task, dataset)
        shortcuts, audit_note = audit_shortcuts(con, task, dataset, acknowledge)
    finally:
        con.execute(f"DROP TABLE IF EXISTS {ROWS}")
        con.execute(f"DROP TABLE IF EXISTS {EVENTS}")
    open_shortcuts = [s for s in shortcuts if not s.acknowledged]
    where = f"{task.name}/{dataset}"
    if overlap or late:
        status = "blocked"
        parts = []
        if overlap:
            parts.append(f"(a) {overlap} patient(s) in more than one split; first: {first_a}")
        if late:
            parts.append(f"(b) {late} feature code(s) or clock(s) after the prediction time; first: {first_b}")
        message = f"leakage gate BLOCKED {where}: " + "; ".join(parts)
    elif open_shortcuts:
        status = "suspect"
        names = ", ".join(f"{s.name} ({s.metric} {s.value:.3f})" for s in open_shortcuts[:5])
        more = f" and {len(open_shortcuts) - 5} more" if len(open_shortcuts) > 5 else ""
        message = (f"leakage gate SUSPECT {where}: (c) a single feature alone gives the label away: {names}{more}; "
                   f"acknowledge in the config (leakage.acknowledge.{task.name}) once a person has checked it")
    else:
        status = "pass"
        message = (f"leakage gate pass {where}: no split overlap, "
                   + ("no code after the prediction time" if late is not None else "no clock to check (b)")
                   + (f", {len(shortcuts)} shortcut(s) acknowledged" if shortcuts else ", no shortcut")
                   + (f" ({audit_note})" if audit_note else ""))
    result = GateResult(task.name, dataset, status, n, overlap, late, shortcuts, message)
    _record(con, result)
    (log.warning if status != "pass" else log.info)("%s", message)
    return result


def _record(con: duckdb.DuckDBPyConnection, result: GateResult) -> None:
    from medtx.store.db import transaction

    key = {"dataset": result.dataset, "task": result.task}
    with transaction(con):
        con.execute(f"DELETE FROM {GATE_TABLE} WHERE dataset = $dataset AND task = $task", key)
        con.execute(f"DELETE FROM {SHORTCUTS_TABLE} WHERE dataset = $dataset AND task = $task", key)
        con.execute(f"""INSERT INTO {GATE_TABLE} (dataset, task, status, samples, split_overlap, late_codes, shortcuts,
                        acknowledged, message, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP)""",
                    [result.dataset, result.task, result.status, result.samples, result.split_overlap,
                     result.late_codes, len(result.shortcuts), sum(s.acknowledged for s in result.shortcuts),
                     result.message])
        if result.shortcuts:
            con.executemany(f"INSERT INTO {SHORTCUTS_TABLE} VALUES (?, ?, ?, ?, ?, ?, ?)",
                            [[result.dataset, result.task, s.feature, s.token, s.metric, s.value, s.acknowledged]
                             for s in result.shortcuts])


def acknowledged_for(config: Mapping | None, task: str) -> tuple[str, ...]:
    """The `leakage.acknowledge.<task>` entries of a pipeline config (a mapping), as `feature:token` strings."""
    entries = ((config or {}).get("leakage") or {}).get("acknowledge") or {}
    return tuple(str(e) for e in (entries.get(task) or ()))


def require_pass(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> str:
    """Refuse to train a task whose gate record is `blocked` or missing (LeakageError, one line); returns the
    recorded status ('pass' or 'suspect'). Tasks the gate does not cover return 'ungated'."""
    import duckdb

    try:
        rows = con.execute(f"SELECT dataset, task, status, message FROM {GATE_TABLE} WHERE dataset = ? AND task = ?",
                           [dataset, task.name]).fetchall()
    except duckdb.CatalogException:
        rows = []
    return check_gate_rows([dict(zip(("dataset", "task", "status", "message"), r, strict=True)) for r in rows],
                           task, dataset)


def gate_all(con: duckdb.DuckDBPyConnection, tasks: Sequence[Task], dataset: str,
             acknowledge: Mapping[str, Collection[str]] | None = None) -> dict[str, GateResult]:
    """Run the gate for every gated task of `tasks` on one dataset (a task trained on another's samples too)."""
    from medtx.tasks import all_tasks

    names = {t.name for t in tasks}
    out = {}
    for task in all_tasks():
        if gated(task) and (task.name in names or task.samples_task in names):
            result = run_gate(con, task, dataset, acknowledge=(acknowledge or {}).get(task.name, ()))
            if result is not None:
                out[task.name] = result
    return out
