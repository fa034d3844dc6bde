"""Who is in the data: a run's Table 1 by split and its cohort flow (attrition), read-only over a warehouse or a
published snapshot (the snapshot is a full copy: raw.*, samples.* and ref.* are there), computed when the card is
built. Pure functions over a DuckDB connection; the model card (medtx.evaluation.card) renders them.

Table 1 (`table1`): per split (train, val, test) and over all of them, the task's samples joined with their stored
split (samples.splits; a task trained on another's samples reads that task's split and its own `sample_filter`):
patients, samples, age at the sample's admission (median [Q1, Q3]; MIMIC-III shifts ages over 89 to about 300, so
ages are capped at 90 as its documentation advises), and sex, age band, ethnicity, insurance and admission type
grouped exactly as the subgroups are (medtx.evaluation.groups), then the outcome: events and prevalence of a binary
task, labels per sample of a multi-label one. Counts are samples (admissions); a patient with several samples counts
once per sample, the `patients` row counts each patient once. Counts are shown however small: the floors of
medtx.evaluation.floors withhold *figures* (rates with intervals, verdicts), never counts, as the subgroup table does.

Attrition (`attrition`): from the dataset's admissions (an ACES task: its label rows) to the task's samples, one step
per exclusion the task declares in its own file (`Lineage.exclusions`, medtx.tasks.base.CohortExclusion), in the
order it applies them, each with its count and rule, then the samples per split. A declaration says how its count is
read: the `excluded_<reason>` its builder stored in samples.task_summary (every `admission_outcome` and ACES task),
its SQL counted here over the dataset's admissions (readmission), or the difference of two stored summary figures
(drug_rec, next_visit). A task trained on another's samples (readmission_notes) gets that task's flow, then its own
`sample_filter`. A stored `excluded_<reason>` no declaration names still gets its step.
A flow whose last step does not reach the stored sample count says so in a step of its own (never hidden).
Text corpora (specialty, faq) have no admission cohort: their Table 1 is the samples per split, their flow empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl

from medtx.evaluation.groups import ATTRIBUTES, GROUP_ORDER, YEAR_SECONDS, group_frame
from medtx.store.db import quote_table, sql_literal
from medtx.tasks import Task, get_task
from medtx.tasks.base import CohortExclusion

SPLITS = ("train", "val", "test")
COLUMNS = (*SPLITS, "all")
AGE_CAP = 90  # MIMIC-III: ages over 89 are shifted to about 300 (de-identification); counted as 90
ATTRIBUTE_NAMES = {"sex": "sex", "age_band": "age band", "ethnicity": "ethnicity", "insurance": "insurance",
                   "admission_type": "admission type"}


@dataclass(frozen=True)
class Step:
    """One step of the cohort flow: what it keeps or leaves out, how many, by which rule."""

    step: str
    remaining: int
    excluded: int | None = None  # None: a starting or closing count, not an exclusion
    reason: str | None = None  # the stored reason key (`excluded_<reason>`)
    rule: str | None = None  # the rule's SQL or words
    patients: int | None = None

    def as_dict(self) -> dict:
        return {"step": self.step, "reason": self.reason, "rule": self.rule, "excluded": self.excluded,
                "remaining": self.remaining, "patients": self.patients}


def _exists(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    schema, name = table.split(".")
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
                            [schema, name]).fetchall()[0][0])


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    schema, name = table.split(".")
    return {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = ? "
                                      "AND table_name = ?", [schema, name]).fetchall()}


def admission_cohort(task: Task) -> bool:
    """The task's samples are admissions of patients (an EHR sample table with subject_id and hadm_id)."""
    return "hadm_id" in task.samples.columns and "subject_id" in task.samples.columns


def _outcome_sql(task: Task, multilabel: bool) -> str:
    from medtx.store.db import quote_ident

    column = quote_ident(task.samples.label_column)
    return f"len(s.{column})" if multilabel else f"CAST(s.{column} AS INTEGER)"


# One row per admission and per patient, as the sample builders read them (raw keeps duplicate rows: the first by
# row_id wins, medtx.samples.common.create_visits' rule), so a duplicated raw row never counts twice or at random.
DEMOGRAPHICS_SQL = """
    WITH adm AS (
        SELECT * FROM raw.admissions WHERE dataset = $dataset AND hadm_id IN (SELECT unnest($hadm))
        QUALIFY row_number() OVER (PARTITION BY hadm_id ORDER BY row_id NULLS LAST, admittime) = 1
    ), pat AS (
        SELECT * FROM raw.patients WHERE dataset = $dataset
        QUALIFY row_number() OVER (PARTITION BY subject_id ORDER BY row_id NULLS LAST, dob) = 1
    )
    SELECT a.hadm_id, p.gender, (epoch(a.admittime) - epoch(p.dob)) / $year AS age,
           a.ethnicity, a.insurance, a.admission_type
    FROM adm a LEFT JOIN pat p ON p.subject_id = a.subject_id"""


def sample_frame(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> pl.DataFrame:
    """One row per sample of the task on the dataset with a stored split: subject_id, hadm_id, split, y (1/0 for a
    binary task, the number of labels for a multi-label one), age (years at the admission, NaN unknown) and the
    group of each attribute (medtx.evaluation.groups)."""
    table = task.samples.table
    where = ["s.dataset = $dataset"]
    if task.samples.shared:
        where.append("s.task = $task")
    if task.samples.filter:
        where.append(f"({task.samples.filter})")  # SQL written in the task's file
    where_sql = " AND ".join(where)  # fixed fragments and the task file's own filter
    frame = con.sql(
        f"SELECT s.subject_id, s.hadm_id, sp.split, {_outcome_sql(task, task.kind == 'multilabel')} AS y "
        f"FROM {quote_table(table)} s JOIN samples.splits sp ON sp.dataset = s.dataset AND sp.task = $split_task "
        f"AND sp.subject_id = s.subject_id WHERE {where_sql}",
        params={"dataset": dataset, "split_task": task.samples_task,
                **({"task": task.samples_task} if task.samples.shared else {})}).pl()
    hadm = [int(h) for h in frame["hadm_id"].unique().to_list()]
    demo = con.sql(DEMOGRAPHICS_SQL, params={"year": YEAR_SECONDS, "dataset": dataset, "hadm": hadm}).pl() \
        if hadm else pl.DataFrame()
    groups = group_frame(demo).with_columns(age=demo["age"].cast(pl.Float64)) if demo.height else pl.DataFrame(
        {"hadm_id": pl.Series([], dtype=pl.Int64), "age": pl.Series([], dtype=pl.Float64),
         **{a: pl.Series([], dtype=pl.String) for a in ATTRIBUTES}})
    out = frame.with_columns(pl.col("hadm_id").cast(pl.Int64)).join(groups, on="hadm_id", how="left")
    return out.with_columns(pl.col("age").fill_null(float("nan")),
                            *(pl.col(a).fill_null("unknown") for a in ATTRIBUTES))


def _age(values: np.ndarray) -> dict:
    known = values[np.isfinite(values) & (values >= 0)]
    if not len(known):
        return {"median": None, "q1": None, "q3": None, "known": 0}
    capped = np.minimum(known, AGE_CAP)
    q1, median, q3 = np.percentile(capped, [25, 50, 75])
    return {"median": float(median), "q1": float(q1), "q3": float(q3), "known": int(len(known))}


def _column(part: pl.DataFrame, multilabel: bool) -> dict:
    n = part.height
    y = part["y"].to_numpy().astype(np.float64) if n else np.zeros(0)
    column = {"patients": int(part["subject_id"].n_unique()) if n else 0, "samples": n,
              "age": _age(part["age"].to_numpy() if n else np.zeros(0))}
    for attribute in ATTRIBUTES:
        counts = dict(part[attribute].value_counts().iter_rows()) if n else {}
        order = [g for g in GROUP_ORDER[attribute] if g in counts] + sorted(set(counts) - set(GROUP_ORDER[attribute]))
        column[attribute] = {g: int(counts[g]) for g in order}
    if multilabel:
        column["labels_per_sample"] = float(y.mean()) if n else None
    else:
        column["events"] = int(y.sum())
        column["prevalence"] = float(y.mean()) if n else None
    return column


def table1(con: duckdb.DuckDBPyConnection, task: Task, dataset: str | None) -> dict | None:
    """The Table 1 of a task on a dataset (module docstring), or None when the warehouse holds none of its
    samples. `columns` maps train/val/test/all to a column's figures; `unit` says what a count counts."""
    if dataset is None or not _exists(con, task.samples.table) or not _exists(con, "samples.splits"):
        return None
    if not admission_cohort(task):
        return _corpus_table(con, task, dataset)
    frame = sample_frame(con, task, dataset)
    if frame.height == 0:
        return None
    multilabel = task.kind == "multilabel"
    columns = {s: _column(frame.filter(pl.col("split") == s), multilabel) for s in SPLITS}
    columns["all"] = _column(frame, multilabel)
    return {"unit": "samples (admissions)", "outcome": task.samples.label_name if task.kind == "binary" else task.samples.label_column,
            "kind": task.kind, "columns": columns}


def _corpus_table(con: duckdb.DuckDBPyConnection, task: Task, dataset: str) -> dict | None:
    """A text corpus: its samples per split (no patients, no demographics)."""
    if "split" not in _columns(con, task.samples.table):
        return None
    counts = dict(con.execute(f"SELECT split, count(*) FROM {quote_table(task.samples.table)} GROUP BY 1").fetchall())
    if not counts:
        return None
    columns = {s: {"samples": int(counts.get(s, 0))} for s in SPLITS}
    columns["all"] = {"samples": int(sum(counts.values()))}
    return {"unit": "texts", "outcome": task.samples.label_column, "kind": task.kind, "columns": columns}


# ----------------------------------------------------------------------------------------------- attrition


def _summary(con: duckdb.DuckDBPyConnection, dataset: str, task: str) -> dict[str, float]:
    if not _exists(con, "samples.task_summary"):
        return {}
    return {m: v for m, v in con.execute("SELECT metric, value FROM samples.task_summary WHERE dataset = ? AND "
                                         "task = ?", [dataset, task]).fetchall()}


# raw keeps duplicates: one row per hadm_id, as the sample builders read it (medtx.samples.common.create_visits)
ADMISSIONS_SQL = """
    SELECT subject_id, hadm_id, admittime, dischtime, deathtime, hospital_expire_flag,
           upper(trim(admission_type)) AS admission_type
    FROM raw.admissions WHERE dataset = $dataset AND hadm_id IS NOT NULL AND subject_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY hadm_id ORDER BY row_id NULLS LAST, admittime) = 1"""


def _exclusions(task: Task) -> tuple[CohortExclusion, ...]:
    """The declared exclusions of the task whose builder fills this task's samples (medtx.tasks.base.Lineage)."""
    builder = task if task.samples_task == task.name else get_task(task.samples_task)
    return builder.lineage.exclusions


def _admission_counts(con: duckdb.DuckDBPyConnection, rules: list[CohortExclusion], dataset: str) -> dict[str, int]:
    """{reason: admissions} of the rules counted over the dataset's admissions, the first rule that holds wins."""
    if not rules:
        return {}
    cases_sql = " ".join(f"WHEN {r.rule} THEN {sql_literal(r.reason)}" for r in rules)  # SQL of the task's file
    return {k: int(n) for k, n in con.execute(f"SELECT CASE {cases_sql} END, count(*) FROM ({ADMISSIONS_SQL}) "
                                              "GROUP BY 1", {"dataset": dataset}).fetchall() if k is not None}


def _task_steps(con: duckdb.DuckDBPyConnection, task: Task, dataset: str, summary: dict[str, float]
                ) -> list[tuple[str, str, str | None, int]]:
    """(reason, words, rule, excluded) per exclusion the task declares, in order; then any `excluded_<reason>` the
    builder stored that the declaration does not name (never hidden)."""
    declared = _exclusions(task)
    stored = {k.removeprefix("excluded_"): int(v) for k, v in summary.items() if k.startswith("excluded_")}
    counted = _admission_counts(con, [e for e in declared if e.counted == "admissions"], dataset)
    steps = []
    for e in declared:
        if e.counted == "stored":
            n = stored.get(e.reason, 0)
        elif e.counted == "admissions":
            n = counted.get(e.reason, 0)
        else:
            before, after = e.figures or ("", "")
            n = int(summary.get(before, 0)) - int(summary.get(after, 0))
        steps.append((e.reason, "excluded: " + e.words, e.rule, n))
    named = {e.reason for e in declared}
    steps += [(k, "excluded: " + k.replace("_", " "), None, stored[k]) for k in sorted(stored) if k not in named]
    return steps


def _count(con: duckdb.DuckDBPyConnection, task: Task, dataset: str, filtered: bool) -> tuple[int, int]:
    """(samples, patients) of the task's sample table on the dataset (with the task's own filter or not)."""
    where = ["dataset = $dataset"] + (["task = $task"] if task.samples.shared else [])
    if filtered and task.samples.filter:
        where.append(f"({task.samples.filter})")
    where_sql = " AND ".join(where)  # fixed fragments and the task file's own filter
    n, p = con.execute(f"SELECT count(*), count(DISTINCT subject_id) FROM {quote_table(task.samples.table)} "
                       f"WHERE {where_sql}",
                       {"dataset": dataset, **({"task": task.samples_task} if task.samples.shared else {})}
                       ).fetchall()[0]
    return int(n), int(p)


def attrition(con: duckdb.DuckDBPyConnection, task: Task, dataset: str | None) -> list[Step]:
    """The task's cohort flow on the dataset (module docstring); [] for a text corpus or a warehouse without it."""
    if dataset is None or not admission_cohort(task) or not _exists(con, task.samples.table):
        return []
    summary = _summary(con, dataset, task.samples_task)
    if not summary:
        return []
    if "aces_rows" in summary:  # an ACES task starts from its label rows, not from the admissions
        steps = [Step("ACES label rows (prediction times) of the dataset", int(summary["aces_rows"]))]
    else:
        steps = [Step("admissions in the dataset", int(summary.get("cohort_visits", 0)),
                      patients=int(summary.get("cohort_patients", 0)))]
    remaining = steps[0].remaining
    for reason, words, rule, n in _task_steps(con, task, dataset, summary):
        remaining -= n
        steps.append(Step(words, remaining, excluded=n, reason=reason, rule=rule))
    built, built_patients = _count(con, task, dataset, filtered=False)
    if task.samples.filter:  # a task trained on another's samples: their flow, then its own filter
        if remaining != built:
            steps.append(Step("difference to the stored samples (unexplained)", built, excluded=remaining - built,
                              reason="unexplained"))
        remaining = built
        kept, _ = _count(con, task, dataset, filtered=True)
        steps.append(Step(f"excluded: not kept by this task's filter ({task.samples.filter})", kept,
                          excluded=remaining - kept, reason="sample_filter", rule=task.samples.filter))
        remaining = kept
        built, built_patients = _count(con, task, dataset, filtered=True)
    if remaining != built:
        steps.append(Step("difference to the stored samples (unexplained)", built, excluded=remaining - built,
                          reason="unexplained"))
    steps.append(Step("samples of the task", built, patients=built_patients))
    split = dict(con.execute(
        f"SELECT sp.split, count(*) FROM {quote_table(task.samples.table)} s JOIN samples.splits sp "
        "ON sp.dataset = s.dataset AND sp.task = $split_task AND sp.subject_id = s.subject_id "
        f"WHERE s.dataset = $dataset{' AND s.task = $split_task' if task.samples.shared else ''}"
        f"{f' AND ({task.samples.filter})' if task.samples.filter else ''} GROUP BY 1",
        {"dataset": dataset, "split_task": task.samples_task}).fetchall())
    unsplit = built - sum(split.values())
    if unsplit:
        steps.append(Step("excluded: the patient has no stored split", built - unsplit, excluded=unsplit,
                          reason="no_split"))
    steps += [Step(f"{s} samples", int(split.get(s, 0))) for s in SPLITS]
    return steps


# ----------------------------------------------------------------------------------------------- rendering


def _n_pct(n: int, total: int) -> str:
    return f"{n:,} ({100 * n / total:.1f}%)" if total else f"{n:,}"


def table1_rows(t1: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of Table 1 as the card shows it: one column per split, then all."""
    cols = t1["columns"]
    head = ["", "train", "validation", "test", "all"]
    if t1["unit"] == "texts":
        return head, [["texts", *(f"{cols[c]['samples']:,}" for c in COLUMNS)]]
    rows = [["patients", *(f"{cols[c]['patients']:,}" for c in COLUMNS)],
            ["samples (admissions)", *(f"{cols[c]['samples']:,}" for c in COLUMNS)]]

    def age(a: dict) -> str:
        return "–" if a["median"] is None else f"{a['median']:.0f} [{a['q1']:.0f}–{a['q3']:.0f}]"

    rows.append(["age at admission, median [Q1–Q3] (years)", *(age(cols[c]["age"]) for c in COLUMNS)])
    for attribute in ATTRIBUTES:
        groups = list(cols["all"][attribute])
        for g in groups:
            rows.append([f"{ATTRIBUTE_NAMES[attribute]}: {g}",
                         *(_n_pct(cols[c][attribute].get(g, 0), cols[c]["samples"]) for c in COLUMNS)])
    if t1["kind"] == "multilabel":
        rows.append([f"labels ({t1['outcome']}) per sample, mean",
                     *("–" if cols[c]["labels_per_sample"] is None else f"{cols[c]['labels_per_sample']:.1f}"
                       for c in COLUMNS)])
    else:
        rows.append([f"events ({t1['outcome']}): n (prevalence)",
                     *(_n_pct(cols[c]["events"], cols[c]["samples"]) for c in COLUMNS)])
    return head, rows


def attrition_rows(steps: list[Step]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the cohort flow as the card shows it."""
    return (["step", "excluded", "remaining", "patients", "rule"],
            [[s.step, "–" if s.excluded is None else f"{s.excluded:,}", f"{s.remaining:,}",
              "–" if s.patients is None else f"{s.patients:,}", s.rule or ""] for s in steps])


def sections(con: duckdb.DuckDBPyConnection, task: Task | None, dataset: str | None, data: dict) -> list[dict]:
    """The card's `attrition` and `population` sections (as Section keyword arguments), filling the JSON twin's
    `attrition` and `table1`."""
    t1 = table1(con, task, dataset) if task is not None else None
    steps = attrition(con, task, dataset) if task is not None else []
    data["table1"], data["attrition"] = t1, [s.as_dict() for s in steps]
    flow = {"id": "attrition", "title": "Cohort flow (attrition)", "paragraphs": [], "tables": []}
    if steps:
        flow["paragraphs"].append(
            "From the dataset's admissions to the task's samples: each exclusion of the task in the order it applies "
            "them (an admission takes the first rule that holds), with its count and rule, then the samples per "
            "split (medtx/evaluation/population.py).")
        flow["tables"].append(attrition_rows(steps))
    else:
        flow["paragraphs"].append("No cohort flow: " + ("the task is no longer registered." if task is None else
                                  "a text corpus has no admission cohort." if not admission_cohort(task) else
                                  "this warehouse holds no sample summary for the task and dataset."))
    table = {"id": "population", "title": "Who is in the data (Table 1)", "paragraphs": [], "tables": []}
    if t1 is None:
        table["paragraphs"].append("No Table 1: this warehouse holds no samples of the task with a stored split.")
    else:
        table["paragraphs"].append(
            "The task's samples by split (every model of the task on this dataset sees the same split). Counts are "
            "samples (admissions), n (% of the column); a patient with several admissions counts once per admission, "
            "the patients row once. Groups as in Subgroups (medtx/evaluation/groups.py); ages over 89 (shifted to "
            f"about 300 by MIMIC-III) counted as {AGE_CAP}. Counts are shown however small: the floors withhold "
            "figures, not counts." if t1["unit"] != "texts" else
            "A text corpus: texts per split (no patients, no demographics).")
        table["tables"].append(table1_rows(t1))
    return [flow, table]
