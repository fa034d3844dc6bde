"""An ACES task is a medtx task: a task config written for ACES (the MEDS community's task language, as MEDS-DEV
writes its tasks) becomes a binary EHR task, declared in the pipeline config instead of a file of this package.

    tasks:
      my_task: {aces: path/to/task.yaml, models: [{model: logreg}]}
      readmission_30d:                     # a MEDS-DEV task whose predicates are `???`: the dataset's predicates
        aces: MEDS_DEV/tasks/readmission/general_hospital/30d.yaml
        predicates: MEDS_DEV/datasets/MIMIC-IV/predicates.yaml
        models: [{model: logreg}, {model: gru}]

Per EHR dataset the builder (`build`)
1. writes the dataset's events as MEDS (medtx.aces.run.write_events: the events `medtx export meds` writes) and
   runs ACES itself on them (medtx.aces.run.run_aces; es-aces in a venv of its own, MEDTX_ACES). ACES decides
   every sample, prediction time and label; medtx never restates its window semantics;
2. records ACES's rows as they came in `samples.aces_labels`, each with the stay it belongs to: the admission of
   the subject admitted at or before the prediction time and not yet discharged before it (the latest such),
   else the subject's latest admission before it (a prediction time after a discharge). A row of a subject with
   no admission by then has no stay and is counted (`excluded_no_stay` in samples.task_summary), never dropped
   unseen; two rows on one stay are refused (medtx samples are one per stay);
3. builds each sample's features as every EHR task does: the clock-bounded history at ACES's prediction time
   (medtx.samples.common.create_history over that stay), plus the `static` tokens known at admission (age band,
   sex, admission type: the built-in 48-hour task's); the label is ACES's `boolean_value`.
The task's clock (`Task.clock.prediction_time`) reads the prediction time back from `samples.aces_labels`, so the
leakage gate (medtx.tasks.leakage) checks every feature code against ACES's own prediction time.

Declared tasks reach every process (the training worker, the dashboard started by the pipeline) through the
environment variable MEDTX_ACES_TASKS (JSON: name -> {"config": path, "predicates": path | null}), which
`declare` sets; the registry (medtx.tasks) adds them to the built-in ones.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from medtx.tasks.base import (BINARY_SCORING, EHR_VISIT_READS, BuildContext, Clock, CohortExclusion, Samples, Task,
                              ehr_lineage)
from medtx.tasks.outcome import COLUMNS, DEFAULT_STATIC, FEATURE_SOURCES, FEATURES, TABLE, VOCAB
from medtx.tasks.history import BINARY_FIGURES, HistoryRows

if TYPE_CHECKING:  # annotations only: the task registry loads where DuckDB is absent (medtx.worker)
    import duckdb

log = logging.getLogger("medtx.samples")

ENV = "MEDTX_ACES_TASKS"
LABELS_TABLE = "samples.aces_labels"
RECORD_TABLE = "samples.aces_tasks"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")

# The stay of each ACES row (see the module docstring), from the dataset's visits (medtx.samples.common).
STAY_SQL = """
    SELECT a.subject_id, a.prediction_time, a.label,
           (SELECT v.hadm_id FROM _samples_visits v
            WHERE v.subject_id = a.subject_id AND v.admittime <= a.prediction_time
            ORDER BY coalesce(v.dischtime >= a.prediction_time, true) DESC, v.admittime DESC, v.hadm_id DESC
            LIMIT 1) AS stay_hadm_id
    FROM _aces_rows a"""

STATIC_TOKENS = DEFAULT_STATIC  # known at admission (medtx.samples.static), as the built-in 48-hour task's


def samples_sql(name: str) -> str:
    """The sample rows: history features at ACES's prediction time, the static tokens of medtx.samples.static
    (the allow-list with its time rules), ACES's label."""
    from medtx.samples.static import static_tokens_sql

    return f"""
    SELECT $dataset AS dataset, $task AS task, h.subject_id, h.hadm_id, v.admittime, h.prediction_time,
           h.conditions, h.procedures, h.drugs, st.static, a.label
    FROM _samples_history h JOIN _samples_visits v USING (hadm_id)
    JOIN samples.aces_labels a ON a.dataset = $dataset AND a.task = $task AND a.stay_hadm_id = h.hadm_id
    JOIN ({static_tokens_sql(name, STATIC_TOKENS)}) st USING (hadm_id)"""


@dataclass(frozen=True)
class AcesSpec:
    """One declared ACES task: its name, its ACES task config and, for a config whose predicates are `???`
    (MEDS-DEV's), the dataset's predicates file (absolute paths)."""

    name: str
    config: Path
    predicates: Path | None = None


def clock_sql(name: str) -> str:
    """The task's clock: the prediction time ACES gave the sample's stay (a SQL expression over the index stay's
    `hadm_id`, evaluated with `$dataset` bound; NULL for a stay ACES gave no row)."""
    from medtx.store.db import sql_literal

    return (f"(SELECT a.prediction_time FROM {LABELS_TABLE} a WHERE a.dataset = $dataset "
            f"AND a.task = {sql_literal(name)} AND a.stay_hadm_id = hadm_id)")


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ValueError(f"ACES task name {name!r}: use lower-case letters, digits and _ (starting with a letter)")
    return name


# The cohort flow starts from ACES's label rows (`aces_rows`); the builder counts the one row it leaves out.
EXCLUSIONS = (CohortExclusion("no_stay", "no stay (the prediction time falls before the subject's first admission)",
                              "no admission of the subject begins at or before the prediction time"),)


def aces_task(spec: AcesSpec) -> Task:
    """The Task record of one declared ACES task (a binary EHR task on samples.admission_outcome)."""
    check_name(spec.name)

    def build(con: duckdb.DuckDBPyConnection, ctx: BuildContext) -> int:
        return build_aces(con, ctx, spec)

    return Task(
        name=spec.name,
        kind="binary",
        family="ehr",
        description=f"ACES task {spec.config.name} (binary; labels and prediction times extracted by ACES)",
        order=60,
        clock=Clock(prediction_time=clock_sql(spec.name), words=f"ACES's prediction time ({spec.config.name})",
                    observation_window=("what the clock shows at ACES's prediction time: earlier admissions' codes "
                                        "and this stay's drugs known by then; age, sex and admission type"),
                    feature_sources=FEATURE_SOURCES, static_tokens=STATIC_TOKENS),
        # the admission-level outcomes' table (medtx.tasks.outcome), rows told apart by `task`
        samples=Samples(table=TABLE, columns=COLUMNS, features=FEATURES, label_column="label", split_unit="patient",
                        shared=True),
        lineage=ehr_lineage(TABLE, build, reads=(*EHR_VISIT_READS, "raw.prescriptions"),  # + the events ACES reads
                            writes=(LABELS_TABLE, RECORD_TABLE),
                            files=tuple(str(p) for p in (spec.config, spec.predicates) if p is not None),
                            exclusions=EXCLUSIONS),
        scoring=BINARY_SCORING,
        # BEHRT needs per-visit ages, the oracle a generator's probability: neither exists for a task from outside
        excluded_models=("behrt", "oracle"),
    )


def build_aces(con: duckdb.DuckDBPyConnection, ctx: BuildContext, spec: AcesSpec) -> int:
    """Run ACES on the dataset and rewrite this task's rows of samples.admission_outcome (+ samples.aces_labels,
    splits, vocab, summary). Needs `_samples_visits` of the dataset (medtx.tasks.build makes it)."""
    from medtx.aces.run import AcesError, labels_sql, run_aces, write_events
    from medtx.store.db import transaction

    with tempfile.TemporaryDirectory(prefix=f"medtx-aces-{spec.name}-") as work:
        events = Path(work) / "data" / "0.parquet"
        write_events(con, ctx.dataset, events)
        labels = run_aces(events, spec.config, Path(work) / "aces", spec.predicates)
        columns = {r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet($f)", {"f": str(labels)}).fetchall()}
        if "boolean_value" not in columns:
            raise AcesError(f"{spec.config}: ACES wrote no label (no boolean_value): a medtx task needs a window "
                            "with `label: <predicate>`")
        con.execute(f"CREATE OR REPLACE TEMP TABLE _aces_rows AS {labels_sql(labels)}")
    try:
        n_rows, no_key, no_label = con.sql(
            "SELECT count(*), count(*) FILTER (WHERE subject_id IS NULL OR prediction_time IS NULL), "
            "count(*) FILTER (WHERE label IS NULL) FROM _aces_rows").fetchall()[0]
        if no_key:
            raise AcesError(f"{spec.config}: {no_key} ACES row(s) without a subject or prediction time")
        if no_label:
            raise AcesError(f"{spec.config}: ACES wrote no label for {no_label} of {n_rows} rows: a medtx task needs "
                            "a window with `label: <predicate>`")
        dup = con.sql("SELECT subject_id, prediction_time, count(*) FROM _aces_rows GROUP BY 1, 2 HAVING count(*) > 1 "
                      "ORDER BY 1, 2 LIMIT 1").fetchall()
        if dup:
            raise AcesError(f"{spec.config}: ACES gave {dup[0][2]} rows for subject {dup[0][0]} at {dup[0][1]}")
        con.execute(f"CREATE OR REPLACE TEMP TABLE _aces_stays AS {STAY_SQL}")
        twice = con.sql("SELECT stay_hadm_id, any_value(subject_id), list(prediction_time ORDER BY prediction_time) "
                        "FROM _aces_stays WHERE stay_hadm_id IS NOT NULL GROUP BY 1 HAVING count(*) > 1 "
                        "ORDER BY 1 LIMIT 1").fetchall()
        if twice:
            hadm, subject, times = twice[0]
            raise AcesError(f"{spec.config}: ACES gives {len(times)} prediction times in one stay (subject {subject}, "
                            f"hadm_id {hadm}: {', '.join(map(str, times))}); medtx samples are one per stay")
        rows, no_stay = con.sql("SELECT count(*), count(*) FILTER (WHERE stay_hadm_id IS NULL) FROM _aces_stays"
                                ).fetchall()[0]
        key = {"dataset": ctx.dataset, "task": spec.name}
        with transaction(con):
            con.execute(f"DELETE FROM {RECORD_TABLE} WHERE task = $task", {"task": spec.name})
            con.execute(f"INSERT INTO {RECORD_TABLE} VALUES ($task, $config, $predicates, $config_text, "
                        "$predicates_text, now()::TIMESTAMP)",
                        {"task": spec.name, "config": str(spec.config),
                         "predicates": str(spec.predicates) if spec.predicates else None,
                         "config_text": Path(spec.config).read_text(),
                         "predicates_text": Path(spec.predicates).read_text() if spec.predicates else None})
            con.execute(f"DELETE FROM {LABELS_TABLE} WHERE dataset = $dataset AND task = $task", key)
            con.execute(f"INSERT INTO {LABELS_TABLE} SELECT $dataset, $task, subject_id, prediction_time, label, "
                        "stay_hadm_id FROM _aces_stays", key)
    finally:
        con.execute("DROP TABLE IF EXISTS _aces_rows")
        con.execute("DROP TABLE IF EXISTS _aces_stays")
    if no_stay:
        log.warning("%s [%s]: %d of %d ACES rows fall before the subject's first admission: no stay to build "
                    "features on, counted as excluded_no_stay", spec.name, ctx.dataset, no_stay, rows)
    from medtx.store.db import sql_literal

    index_sql = (f"SELECT subject_id, stay_hadm_id AS hadm_id FROM {LABELS_TABLE} WHERE dataset = $dataset "
                 f"AND task = {sql_literal(spec.name)} AND stay_hadm_id IS NOT NULL")
    # the name is checked (check_name) and quoted where it is SQL
    samples = HistoryRows(task=spec.name, table=TABLE, prediction_time=clock_sql(spec.name), index_sql=index_sql,
                          rows_sql=samples_sql(spec.name), vocab=VOCAB, figures=BINARY_FIGURES, shared=True)
    return samples.build(con, ctx, extra_figures={"aces_rows": rows, "excluded_no_stay": no_stay},
                         empty=lambda stats: (f"{spec.name}: ACES ({spec.config}) gives dataset {ctx.dataset!r} no "
                                              f"sample ({rows} rows, {no_stay} before any admission)"))


def declared() -> tuple[AcesSpec, ...]:
    """The ACES tasks declared in this process or a parent (MEDTX_ACES_TASKS), by name."""
    raw = os.environ.get(ENV)
    if not raw:
        return ()
    try:
        table = json.loads(raw)
        specs = tuple(AcesSpec(check_name(name), Path(entry["config"]),
                               Path(entry["predicates"]) if entry.get("predicates") else None)
                      for name, entry in sorted(table.items()))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"environment variable {ENV} is not a JSON mapping name -> "
                         f"{{config, predicates}}: {exc}") from None
    return specs


def declare(specs: list[AcesSpec] | tuple[AcesSpec, ...]) -> None:
    """Make these the declared ACES tasks of this process and of every process it starts (replacing any
    declared before); the task registry is reloaded. A name clashing with a built-in task or declared twice
    raises ValueError and leaves the declared tasks as they were."""

    from medtx.tasks import all_tasks

    for spec in specs:
        check_name(spec.name)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"ACES tasks {sorted({n for n in names if names.count(n) > 1})} are declared twice")
    before = os.environ.get(ENV)
    _set_env(json.dumps({s.name: {"config": str(Path(s.config).resolve()),
                                  "predicates": str(Path(s.predicates).resolve()) if s.predicates else None}
                         for s in specs}, sort_keys=True) if specs else None)
    try:
        all_tasks()  # a clash with a built-in task fails here, not at some later lookup
    except ValueError:
        _set_env(before)
        raise


def declare_recorded(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """Declare, besides the tasks already declared, every ACES task this warehouse or snapshot has built
    (samples.aces_tasks): for a process that never read the pipeline config, e.g. the dashboard. Returns the
    names added; a database without the table adds none."""
    import duckdb

    try:
        rows = con.execute(f"SELECT task, config, predicates FROM {RECORD_TABLE} ORDER BY task").fetchall()
    except duckdb.CatalogException:
        return ()
    current = {s.name: s for s in declared()}
    added = tuple(name for name, _, _ in rows if name not in current)
    if added:
        for name, config, predicates in rows:
            current.setdefault(name, AcesSpec(name, Path(config), Path(predicates) if predicates else None))
        declare(list(current.values()))
    return added


def _set_env(value: str | None) -> None:
    from medtx.tasks import reload_registry

    if value is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = value
    reload_registry()
