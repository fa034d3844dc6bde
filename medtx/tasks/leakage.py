"""The leakage gate: before any training, is a task's sample set free of the leaks medtx can check?

Run per (task, dataset) after the task's samples are built (medtx.tasks.build.build_samples) and recorded in
`samples.leakage_gate` (+ `samples.leakage_shortcuts`); training refuses a task whose record says `blocked`, or
whose samples are not those the record judged (`require_pass`, medtx.tasks.verdict). The checks read the
warehouse, not the builder's word:

(a) split overlap: every sample row's patient is read from raw.admissions by its hadm_id (not from the row's
    subject_id); a patient whose rows sit in more than one split of the task fails the gate. Rows whose hadm_id
    raw.admissions does not know fail too (their patient cannot be checked). So does a patient whose task split
    is not the dataset's one patient split (`samples.patient_splits`; `split_off`): a split drawn per admission,
    per task or from another seed than the dataset's.
(b) late tokens: the sample's prediction time is recomputed from the warehouse and the task's clock
    (`Task.clock.prediction_time`, stored as `Task.clock.column`), and every feature column
    (`Task.samples.features`) must have a time rule (`Task.clock.feature_sources`): an event source (every code
    explained by an event of that patient, source and code known at or before it, medtx.samples.clock), `static`
    (every token recomputed from the allow-list medtx.samples.static: its prefix declared there and by the task, its value
    the column's, the column known by the prediction time), or `note` (every note text it holds charted by the
    prediction time and before the patient's next admission began). A column without a rule, a late token, or a
    stored prediction time that disagrees with the recomputed one fails the gate. (By patient and code: a code
    the patient also had earlier passes, so it proves "nothing the patient could not have known then".)
(c) shortcut audit (medtx.tasks.audit), over train + validation: for a binary EHR task, a logistic regression
    cross-validated by patient on each feature family (a column; a static prefix) and on all features, flagged
    when its AUROC's lower 95% bound reaches the cut-off (the synthetic oracle's AUROC + 0.05, else 0.90); for a
    multi-label task, a column whose last visit equals the label set in >= SHORTCUT_EXACT_SHARE of samples. A
    flagged family blocks the task until the config acknowledges it with a reason
    (`tasks.<task>.samples.acknowledge: {<family>: <reason>}`; docs/TASKS.md).
(d) clock bound: a task's outcome (`Task.clock.outcome`) is known at `Task.clock.outcome_known`; a sample
    predicting at or after it fails the gate (an in-hospital outcome predicted at discharge).

Any failure is `blocked` with one line naming the task, dataset and first offending row or token source.
Tasks the gate does not cover (text corpora split by text group or by pair) get no record.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from medtx.store.db import quote_ident, quote_table, sql_literal
from medtx.tasks.base import Task
from medtx.tasks.verdict import LeakageError, check_gate_rows, gated, samples_fingerprint

__all__ = ["GateResult", "LeakageError", "Shortcut", "check_gate_rows", "current_fingerprint", "gate_all", "gated",
           "require_pass", "run_gate"]

if TYPE_CHECKING:  # annotations only: the training worker checks the gate's record without DuckDB
    import duckdb
from medtx.samples.clock import STAYS_SQL, create_event_view, note_time_sql

log = logging.getLogger("medtx.leakage")

SHORTCUT_EXACT_SHARE = 0.95  # multi-label: the last visit's codes equal the label set this often
GATE_TABLE = "samples.leakage_gate"
SHORTCUTS_TABLE = "samples.leakage_shortcuts"
EVENTS = "_gate_events"
ROWS = "_gate_rows"
GATE_COLUMNS = ("dataset", "task", "status", "message", "fingerprint")  # what require_pass reads


@dataclass(frozen=True)
class Shortcut:
    """One audited feature family (a feature column, a static prefix `static:AGE`, or `all`) and its figure."""

    feature: str
    token: str  # '*': the whole family
    metric: str  # 'cv_auroc' (binary) | 'exact_share' (multi-label)
    value: float
    acknowledged: bool = False
    reason: str | None = None  # the config's reason, when acknowledged
    lower: float | None = None  # cv_auroc: its lower 95% bound (what the cut-off is compared with)
    flagged: bool = True

    @property
    def name(self) -> str:
        return self.feature if self.token == "*" else f"{self.feature}:{self.token}"


@dataclass(frozen=True)
class GateResult:
    task: str
    dataset: str
    status: str  # 'pass' | 'blocked'
    samples: int
    split_overlap: int
    late_codes: int | None  # None: not checked (no clock)
    shortcuts: tuple[Shortcut, ...] = field(default_factory=tuple)  # flagged families (acknowledged or not)
    message: str = ""
    clock_bound: int | None = None  # None: the task declares no outcome time
    audit: str = ""  # the shortcut audit's figures and cut-off, in words
    fingerprint: str = ""  # of the samples judged (medtx.tasks.verdict.samples_fingerprint)
    split_off: int = 0  # patients whose task split is not the dataset's patient split

    @property
    def blocked(self) -> bool:
        return self.status == "blocked"


def _rows_sql(task: Task, owner: Task) -> str:
    """The task's sample rows of `$dataset` (the owner task's table, filtered on `task` when shared)."""
    own_sql = " AND task = $owner" if owner.samples.shared else ""
    filter_sql = f" AND ({task.samples.filter})" if task.samples.filter else ""  # SQL written in the task's file
    return f"SELECT * FROM {quote_table(owner.samples.table)} WHERE dataset = $dataset{own_sql}{filter_sql}"


def current_fingerprint(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> str:
    """The fingerprint of the task's samples and split as the warehouse holds them now (what training would read)."""
    samples = con.sql(f"SELECT * FROM {quote_table(task.samples.table)} WHERE dataset = $dataset",
                      params={"dataset": dataset}).to_arrow_table()
    splits = con.sql("SELECT * FROM samples.splits WHERE dataset = $dataset AND task = $task",
                     params={"dataset": dataset, "task": task.samples_task}).to_arrow_table()
    return samples_fingerprint(samples, splits, task, dataset)


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


def split_off(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> tuple[int, str | None]:
    """(a) patients (read from raw.admissions) whose task split is not the dataset's one patient split
    (`samples.patient_splits`; a task row of `raw.meds_splits` wins, as medtx.samples.splits.write_task_splits
    writes it), and the first one: a split drawn per admission, per task or from another seed."""
    rows = con.execute(f"""
        WITH stays AS ({STAYS_SQL}),
        r AS (
            SELECT DISTINCT st.subject_id AS patient, sp.split AS stored
            FROM {ROWS} r JOIN stays st USING (hadm_id)
            LEFT JOIN samples.splits sp ON sp.dataset = $dataset AND sp.task = $split_task
                                       AND sp.subject_id = r.subject_id
        )
        SELECT r.patient, r.stored, coalesce(m.split, p.split) AS expected FROM r
        LEFT JOIN samples.patient_splits p ON p.dataset = $dataset AND p.subject_id = r.patient
        LEFT JOIN raw.meds_splits m ON m.dataset = $dataset AND m.task = $split_task AND m.subject_id = r.patient
        WHERE r.stored IS DISTINCT FROM coalesce(m.split, p.split)
        ORDER BY r.patient, r.stored""", {"dataset": dataset, "split_task": task.samples_task}).fetchall()
    if not rows:
        return 0, None
    patient, stored, expected = rows[0]
    n = len({r[0] for r in rows})
    if expected is None:
        return n, (f"patient {patient} has no row in samples.patient_splits (the dataset's patient split); "
                   f"rebuild the samples (medtx build-samples) so every task shares it")
    return n, (f"patient {patient} is {stored or 'in no split'} in task {task.samples_task} but {expected} in the "
               f"dataset's patient split (samples.patient_splits): a split drawn per admission, per task or from "
               f"another seed; rebuild the samples (medtx build-samples)")


def late_codes(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> tuple[int | None, str | None]:
    """(b) feature codes no event explains at or before the recomputed prediction time (+ disagreeing stored
    prediction times); None when the task has no clock."""
    if task.clock.prediction_time is None:
        return None, None
    clock_sql = task.clock.prediction_time  # a SQL expression written in the task's file (code, not data)
    truth_sql = f"""
        SELECT hadm_id, subject_id AS patient, CAST(({clock_sql}) AS TIMESTAMP) AS pt
        FROM ({STAYS_SQL}) AS stay"""
    params = {"dataset": dataset}
    columns = set(con.sql(f"SELECT * FROM {ROWS} LIMIT 0").columns)
    column = task.clock.column
    stored_sql = f"r.{quote_ident(column)}" if column in columns else "NULL"
    bad_clock = con.execute(f"""
        SELECT r.hadm_id, {stored_sql} AS stored, t.pt FROM {ROWS} r LEFT JOIN ({truth_sql}) t USING (hadm_id)
        WHERE t.pt IS NULL OR {stored_sql} IS DISTINCT FROM t.pt ORDER BY r.hadm_id""", params).fetchall()
    n, first = len(bad_clock), None
    if bad_clock:
        hadm, got, want = bad_clock[0]
        first = (f"sample hadm_id {hadm} stores {column} {got}, the clock of task {task.name} over the warehouse "
                 f"gives {want}")
    sources = dict(task.clock.feature_sources)
    for feature in task.samples.features:
        source = sources.get(feature)
        if source is None or feature not in columns:
            n += 1
            why = ("has no time rule (no source in Task.clock.feature_sources)" if source is None
                   else "is not in the sample table")
            first = first or f"feature column {feature!r} of task {task.name} {why}: the gate cannot time its tokens"
            continue
        if source == "static":
            late, why = _late_static(con, task, feature, truth_sql, params)
        elif source == "note":
            late, why = _late_notes(con, task, feature, truth_sql, params)
        else:
            late, why = _late_events(con, feature, source, truth_sql, params)
        n += late
        first = first or why
    return n, first


def _late_events(con: duckdb.DuckDBPyConnection, feature: str, source: str, truth_sql: str,
                 params: dict) -> tuple[int, str | None]:
    """Codes of an event-sourced column that no event of the patient, source and code explains by the clock."""
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
    if not late:
        return 0, None
    hadm, patient, pt, code = late[0]
    known = con.execute(f"SELECT min(time) FROM {EVENTS} WHERE subject_id = ? AND source = ? AND code = ?",
                        [patient, source, code]).fetchall()[0][0]
    return len(late), (f"sample hadm_id {hadm} (patient {patient}) holds {feature} code {code!r} ({source}), known "
                       f"{'only at ' + str(known) if known else 'by no event of the patient'}, after its prediction "
                       f"time {pt}")


def _late_static(con: duckdb.DuckDBPyConnection, task: Task, feature: str, truth_sql: str,
                 params: dict) -> tuple[int, str | None]:
    """Static tokens the allow-list (medtx.samples.static) does not give the sample's admission by its clock: a
    prefix without a time rule or not declared by the task, a value the column does not hold, or a column known
    only after the prediction time (a discharge-time column in a task predicting before discharge)."""
    from medtx.samples.static import BY_PREFIX, SEPARATOR, static_truth_sql

    rows = con.execute(f"""
        WITH t AS ({truth_sql}), s AS ({static_truth_sql()}),
        toks AS (SELECT DISTINCT r.hadm_id, t.pt, unnest(flatten(r.{quote_ident(feature)})) AS token
                 FROM {ROWS} r JOIN t USING (hadm_id))
        SELECT k.hadm_id, k.pt, k.token, s.known FROM toks k
        LEFT JOIN s ON s.hadm_id = k.hadm_id AND s.token = k.token
        WHERE s.token IS NULL OR s.known IS NULL OR s.known > k.pt
           OR split_part(k.token, '{SEPARATOR}', 1) NOT IN (SELECT unnest($declared::VARCHAR[]))
        ORDER BY k.hadm_id, k.token""", {**params, "declared": list(task.clock.static_tokens)}).fetchall()
    if not rows:
        return 0, None
    hadm, pt, token, known = rows[0]
    prefix = token.split(SEPARATOR, 1)[0] if SEPARATOR in token else token
    column = BY_PREFIX.get(prefix)
    where = f"task {task.name}: sample hadm_id {hadm} holds {feature} token {token!r}"
    if column is None:
        why = f"{where}: prefix {prefix!r} comes from no column with a time rule (medtx/samples/static.py)"
    elif prefix not in task.clock.static_tokens:
        why = f"{where}: prefix {prefix!r} ({column.column}) is not among the task's declared static_tokens"
    elif known is None and SEPARATOR in token:
        why = f"{where}: {column.column} of that admission does not give this token"
    else:
        why = (f"{where} from {column.column}, known {column.known} ({known}), after its prediction time {pt}")
    return len(rows), why


def _late_notes(con: duckdb.DuckDBPyConnection, task: Task, feature: str, truth_sql: str,
                params: dict) -> tuple[int, str | None]:
    """Note texts in a text column that no note of the patient known by the clock (and before the patient's next
    admission began) explains: each note of the patient whose text the sample's text contains must have a
    same-text note charted at or before the prediction time, and not after a later admission of the patient
    began."""
    rows = con.execute(f"""
        WITH t AS ({truth_sql}),
        stays AS ({STAYS_SQL}),
        notes AS (
            SELECT n.subject_id AS patient, trim(n.text) AS body, CAST({note_time_sql('n.charttime', 'n.chartdate')}
                   AS TIMESTAMP) AS time
            FROM raw.noteevents n
            WHERE n.dataset = $dataset AND coalesce(trim(n.iserror), '') <> '1' AND nullif(trim(n.text), '') IS NOT NULL
        ), samples AS (
            SELECT r.hadm_id, t.patient, t.pt, r.{quote_ident(feature)} AS text,
                   (SELECT min(s2.admittime) FROM stays s2 WHERE s2.subject_id = t.patient
                    AND s2.admittime > st.admittime) AS next_admit
            FROM {ROWS} r JOIN t USING (hadm_id) JOIN stays st USING (hadm_id)
            WHERE r.{quote_ident(feature)} IS NOT NULL
        ), used AS (
            SELECT DISTINCT s.hadm_id, s.patient, s.pt, s.next_admit, n.body
            FROM samples s JOIN notes n ON n.patient = s.patient AND contains(s.text, n.body)
        )
        SELECT u.hadm_id, u.patient, u.pt, min(n.time) AS first_time, left(u.body, 40) AS head FROM used u
        JOIN notes n ON n.patient = u.patient AND n.body = u.body
        GROUP BY u.hadm_id, u.patient, u.pt, u.next_admit, u.body
        HAVING NOT bool_or(n.time <= u.pt AND (u.next_admit IS NULL OR n.time < u.next_admit))
        ORDER BY u.hadm_id""", params).fetchall()
    if not rows:
        return 0, None
    hadm, patient, pt, time, head = rows[0]
    return len(rows), (f"task {task.name}: sample hadm_id {hadm} (patient {patient}) holds in {feature} a note "
                       f"charted {time} ({head!r}...), after its prediction time {pt} or once the next admission "
                       f"began")


def clock_bound(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> tuple[int | None, str | None]:
    """(d) samples whose prediction time is at or after their outcome is known (Task.clock.outcome_known); None: the
    task declares no bound."""
    if task.clock.prediction_time is None or task.clock.outcome_known is None:
        return None, None
    prediction_sql, known_sql = task.clock.prediction_time, task.clock.outcome_known  # SQL the task's file declares
    rows = con.execute(f"""
        SELECT hadm_id, pt, known FROM (
            SELECT hadm_id, CAST(({prediction_sql}) AS TIMESTAMP) AS pt,
                   CAST(({known_sql}) AS TIMESTAMP) AS known
            FROM ({STAYS_SQL}) AS stay
        ) WHERE hadm_id IN (SELECT hadm_id FROM {ROWS}) AND pt >= known
        ORDER BY hadm_id""", {"dataset": dataset}).fetchall()
    if not rows:
        return 0, None
    hadm, pt, known = rows[0]
    clock = task.clock
    return len(rows), (f"task {task.name} predicts at {clock.prediction_time!r}, but its outcome ({clock.outcome}) is "
                       f"known at {task.clock.outcome_known!r}: sample hadm_id {hadm} predicts at {pt}, its outcome is "
                       f"known at {known}")


def _reference(con: duckdb.DuckDBPyConnection, task: Task, dataset: str, hadm_ids: Sequence[int],
               y: np.ndarray) -> float | None:
    """The synthetic oracle's AUROC on the audited samples (raw.synth_oracle_<task>), None where there is none."""
    import duckdb

    from medtx.tasks.audit import auroc

    try:
        prob = dict(con.execute(f"SELECT hadm_id, prob FROM {quote_table(f'raw.synth_oracle_{task.samples_task}')} "
                                "WHERE dataset = ?",
                                [dataset]).fetchall())
    except duckdb.CatalogException:
        return None
    if not prob or any(h not in prob for h in hadm_ids) or y.all() or not y.any():
        return None
    area = auroc(y, np.array([prob[h] for h in hadm_ids]))
    return max(area, 1.0 - area)


def audit_shortcuts(con: duckdb.DuckDBPyConnection, task: Task, dataset: str,
                    acknowledge: Mapping[str, str] | None = None) -> tuple[tuple[Shortcut, ...], str]:
    """(c) feature families (and all features together) that give the label away beyond what is honestly
    knowable, on train + validation; returns (every family's score, flagged or not; the audit in words)."""
    params = {"dataset": dataset, "split_task": task.samples_task}
    rows_sql = f"""SELECT r.* FROM {ROWS} r JOIN samples.splits sp ON sp.dataset = $dataset AND sp.task = $split_task
              AND sp.subject_id = r.subject_id WHERE sp.split IN ('train', 'val')"""
    ack = dict(acknowledge or {})
    columns = set(con.sql(f"SELECT * FROM {ROWS} LIMIT 0").columns)
    features = [f for f in task.samples.features if f in columns]
    label_sql = quote_ident(task.samples.label_column)
    if task.kind == "multilabel":
        found = []
        for feature in features:
            share = con.execute(f"""
                SELECT avg(CASE WHEN list_sort(list_distinct({quote_ident(feature)}[-1])) = list_sort(list_distinct({label_sql}))
                           THEN 1.0 ELSE 0.0 END)
                FROM ({rows_sql}) WHERE len({label_sql}) > 0""", params).fetchall()[0][0]
            if share is not None:
                found.append(Shortcut(feature, "*", "exact_share", share, feature in ack, ack.get(feature),
                                      flagged=share >= SHORTCUT_EXACT_SHARE))
        return tuple(found), f"last-visit copy of the label set, cut-off {SHORTCUT_EXACT_SHARE:.2f} (train + val)"
    if task.kind != "binary" or task.family != "ehr":
        return (), "shortcut audit not run: no token audit for text features"
    from medtx.tasks.audit import audit, cutoff_for

    x, y, groups, hadm_ids, families = _matrix(con, features, label_sql, rows_sql, params)
    reference = _reference(con, task, dataset, hadm_ids, y)
    cutoff, how = cutoff_for(reference)
    scores, why_not = audit(x, y, groups, families, cutoff)
    if why_not:
        return (), why_not
    found = tuple(Shortcut(s.family, "*", "cv_auroc", s.auroc, s.family in ack, ack.get(s.family), s.lower,
                           s.flagged) for s in scores)
    top = max(found, key=lambda s: s.value)
    return found, (f"shortcut audit over {len(y)} train + val samples ({int(y.sum())} positive), 5-fold by patient: "
                   f"all features CV AUROC {found[-1].value:.3f} (lower bound {found[-1].lower:.3f}), highest "
                   f"{top.feature} {top.value:.3f}; cut-off {how}")


def _matrix(con: duckdb.DuckDBPyConnection, features: Sequence[str], label_sql: str, rows_sql: str,
            params: dict) -> tuple:
    """The audited samples as a binary sparse matrix of `feature:token` presence, with labels, patients, hadm_ids
    and the families (feature column; static token prefix) as column lists."""
    from scipy.sparse import csr_matrix

    from medtx.samples.static import SEPARATOR

    con.execute(f"CREATE OR REPLACE TEMP TABLE _gate_audit AS SELECT row_number() OVER (ORDER BY hadm_id) - 1 AS i, "
                f"* FROM ({rows_sql})", params)
    try:
        meta = con.sql(f"SELECT hadm_id, subject_id, {label_sql} FROM _gate_audit ORDER BY i").fetchall()
        parts_sql = " UNION ALL ".join(
            f"SELECT DISTINCT i, {sql_literal(f)} AS feature, unnest(flatten({quote_ident(f)})) AS token FROM _gate_audit"
            for f in features)
        cells = con.sql(f"SELECT i, feature, token FROM ({parts_sql}) WHERE token IS NOT NULL").fetchall()
    finally:
        con.execute("DROP TABLE IF EXISTS _gate_audit")
    index: dict[tuple[str, str], int] = {}
    families: dict[str, list[int]] = {}
    rows, cols = [], []
    for i, feature, token in cells:
        key = (feature, token)
        if key not in index:
            index[key] = len(index)
            family = (f"{feature}:{token.split(SEPARATOR, 1)[0]}" if feature == "static" and SEPARATOR in token
                      else feature)
            families.setdefault(family, []).append(index[key])
        rows.append(i)
        cols.append(index[key])
    x = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(meta), max(len(index), 1)))
    hadm_ids = [m[0] for m in meta]
    return (x, np.array([bool(m[2]) for m in meta]), np.array([m[1] for m in meta]), hadm_ids,
            dict(sorted(families.items())))


def run_gate(con: duckdb.DuckDBPyConnection, task: Task, dataset: str, owner: Task | None = None,
             acknowledge: Mapping[str, str] | None = None) -> GateResult | None:
    """Check (a), (b), (c), (d) for one task and dataset, replace its record, and return it (None: not gated).

    `owner`: the task whose builder filled the sample table (defaults to `task.samples_task` looked up by the
    caller; pass it to avoid a registry lookup). `acknowledge`: the config's acknowledged feature families for this
    task, family -> the reason a person gave (`tasks.<task>.samples.acknowledge`)."""
    if not gated(task):
        return None
    if owner is None:
        from medtx.tasks import get_task
        owner = get_task(task.samples_task)
    params = {"dataset": dataset, **({"owner": owner.name} if owner.samples.shared else {})}
    con.execute(f"CREATE OR REPLACE TEMP TABLE {ROWS} AS {_rows_sql(task, owner)}", params)
    try:
        create_event_view(con, dataset, EVENTS)
        n = con.sql(f"SELECT count(*) FROM {ROWS}").fetchall()[0][0]
        overlap, first_a = split_overlap(con, task, dataset)
        off, first_off = split_off(con, task, dataset)
        late, first_b = late_codes(con, task, dataset)
        bound, first_d = clock_bound(con, task, dataset)
        scores, audit_note = audit_shortcuts(con, task, dataset, acknowledge)
        fingerprint = current_fingerprint(con, task, dataset)
    finally:
        con.execute(f"DROP TABLE IF EXISTS {ROWS}")
        con.execute(f"DROP TABLE IF EXISTS {EVENTS}")
    flagged = tuple(s for s in scores if s.flagged)
    open_shortcuts = [s for s in flagged if not s.acknowledged]
    where = f"{task.name}/{dataset}"
    parts = []
    if overlap:
        parts.append(f"(a) {overlap} patient(s) in more than one split; first: {first_a}")
    if off:
        parts.append(f"(a) {off} patient(s) off the dataset's patient split; first: {first_off}")
    if late:
        parts.append(f"(b) {late} feature token(s) or clock(s) after the prediction time; first: {first_b}")
    if open_shortcuts:
        names = ", ".join(f"{s.name} ({s.metric} {s.value:.3f}"
                          + (f", lower bound {s.lower:.3f})" if s.lower is not None else ")") for s in open_shortcuts)
        parts.append(f"(c) the features give the label away: {names} [{audit_note}]; acknowledge with a reason in "
                     f"the config (tasks.{task.name}.samples.acknowledge: {{{open_shortcuts[0].name}: <reason>}}) "
                     f"once a person has checked it")
    if bound:
        parts.append(f"(d) {bound} sample(s) predict at or after the outcome is known; first: {first_d}")
    acked = "; ".join(f"{s.name} acknowledged: {s.reason}" for s in flagged if s.acknowledged)
    if parts:
        status = "blocked"
        message = f"leakage gate BLOCKED {where}: " + "; ".join(parts)
    else:
        status = "pass"
        message = (f"leakage gate pass {where}: no split overlap, every patient in the dataset's patient split, "
                   + ("no feature token after the prediction time" if late is not None else "no clock to check (b)")
                   + (", no prediction at or after the outcome is known" if bound is not None
                      else ", no outcome time declared (d)")
                   + f", {audit_note}" + (f"; {acked}" if acked else ""))
    result = GateResult(task.name, dataset, status, n, overlap, late, flagged, message, bound, audit_note,
                        fingerprint, off)
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
                        acknowledged, message, created_at, clock_bound, audit, fingerprint, split_off)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now()::TIMESTAMP, ?, ?, ?, ?)""",
                    [result.dataset, result.task, result.status, result.samples, result.split_overlap,
                     result.late_codes, len(result.shortcuts), sum(s.acknowledged for s in result.shortcuts),
                     result.message, result.clock_bound, result.audit, result.fingerprint, result.split_off])
        if result.shortcuts:
            con.executemany(f"INSERT INTO {SHORTCUTS_TABLE} (dataset, task, feature, token, metric, value, "
                            f"acknowledged, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            [[result.dataset, result.task, s.feature, s.token, s.metric, s.value, s.acknowledged,
                              s.reason] for s in result.shortcuts])


def require_pass(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> str:
    """Refuse to train a task whose gate record is `blocked` or missing, or was made on other samples than the
    warehouse holds now (LeakageError, one line); returns the recorded status ('pass'). Tasks the gate does not
    cover return 'ungated'."""
    import duckdb

    columns = GATE_COLUMNS
    try:
        rows = con.execute(f"SELECT {', '.join(GATE_COLUMNS)} FROM {GATE_TABLE} WHERE dataset = ? AND task = ?",
                           [dataset, task.name]).fetchall()
    except duckdb.CatalogException:
        rows = []
    records = [dict(zip(columns, r, strict=True)) for r in rows]
    check_gate_rows(records, task, dataset)  # blocked or missing: refused before the samples are read
    return check_gate_rows(records, task, dataset, current_fingerprint(con, task, dataset) if gated(task) else None)


def gate_all(con: duckdb.DuckDBPyConnection, tasks: Sequence[Task], dataset: str,
             acknowledge: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, GateResult]:
    """Run the gate for every gated task of `tasks` on one dataset (a task trained on another's samples too)."""
    from medtx.tasks import all_tasks

    names = {t.name for t in tasks}
    out = {}
    for task in all_tasks():
        if gated(task) and (task.name in names or task.samples_task in names):
            result = run_gate(con, task, dataset, acknowledge=(acknowledge or {}).get(task.name))
            if result is not None:
                out[task.name] = result
    return out
