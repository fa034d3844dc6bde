"""Issue 42, "who is in the data" and "what drives the score": every Table 1 count and every attrition count of the
card agrees with an INDEPENDENT query written here (plain Python over raw rows, with its own grouping rules, never
medtx's code), on the bundled demo and on a synthetic cohort with planted edge cases (a NEWBORN stay, a stay with no
expire flag, one with no discharge time, a death by 48 h after a longer stay, a duplicated raw admission row whose
copy says another insurance). Then: a flow that no longer reaches the stored samples says so; the card renders the
same sections from the published snapshot; logreg's stored coefficients are the model's and read in plain words; the
study fields of the config reach the card ("not stated" when absent); the coverage table names only real sections.
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from medtx.evaluation import population as pop
from medtx.store.db import connect
from medtx.tasks import get_task
from tests.conftest import DATA, REPO_ROOT
from tests.fixtures_samples import demo_db, insert_rows  # noqa: F401  (a fixture)

DEMO, SYNTH = "mimic3_demo", "synth_pop"
EHR_TASKS = ("mortality", "readmission", "drug_rec", "next_visit")


@pytest.fixture(scope="module")
def synth_db(tmp_path_factory) -> Path:
    """A synthetic cohort with planted edge cases, every EHR task built."""
    from medtx.codes import map_codes
    from medtx.ingest import ingest_mimic3
    from medtx.synth import generate_mimic3
    from medtx.tasks.build import build_samples

    root = tmp_path_factory.mktemp("population")
    generate_mimic3(root / "synth", 300, seed=11)
    db = root / "w.duckdb"
    ingest_mimic3(db, root / "synth", SYNTH, root / "cache")
    con = connect(db)
    try:
        first = _rows(con, "SELECT * FROM raw.admissions WHERE dataset = ? ORDER BY row_id LIMIT 1", [SYNTH])[0]
        subject, t = first["subject_id"], datetime(2150, 1, 1, 8)
        base = {"dataset": SYNTH, "subject_id": subject, "admittime": t, "dischtime": t + timedelta(days=5),
                "hospital_expire_flag": 0, "admission_type": "EMERGENCY", "insurance": "Medicare",
                "ethnicity": "WHITE"}
        insert_rows(con, "admissions", [
            {**base, "row_id": 990001, "hadm_id": 990001, "admission_type": " newborn "},
            {**base, "row_id": 990002, "hadm_id": 990002, "admittime": t + timedelta(days=30),
             "dischtime": t + timedelta(days=35), "hospital_expire_flag": None},
            {**base, "row_id": 990003, "hadm_id": 990003, "admittime": t + timedelta(days=60), "dischtime": None},
            {**base, "row_id": 990004, "hadm_id": 990004, "admittime": t + timedelta(days=90),
             "dischtime": t + timedelta(days=93), "deathtime": t + timedelta(days=90, hours=30),
             "hospital_expire_flag": 1},
        ])
        # a duplicate raw row of an existing stay (a later row_id): the builders read the first; so must Table 1
        con.execute("INSERT INTO raw.admissions SELECT * REPLACE (990005 AS row_id, 'Self Pay' AS insurance) "
                    "FROM raw.admissions WHERE dataset = ? AND row_id = ?", [SYNTH, first["row_id"]])
        map_codes(con, DATA, [SYNTH])
        build_samples(con, DATA, list(EHR_TASKS), [SYNTH])
    finally:
        con.close()
    return db


# ----------------------------------------------------------------------------------------------- independent
# Plain Python over rows fetched here: no medtx function, no dataframe library, the grouping rules written out again.


def _rows(con, sql: str, params: list) -> list[dict]:
    cur = con.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _first_per(rows: list[dict], key: str, order: tuple[str, ...]) -> dict:
    """{key: the row that sorts first by `order` (NULLs last)}: raw keeps duplicate rows."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: tuple((r[o] is None, r[o] if r[o] is not None else 0) for o in order)):
        out.setdefault(r[key], r)
    return out


def _admissions(con, dataset: str) -> dict[int, dict]:
    rows = _rows(con, "SELECT * FROM raw.admissions WHERE dataset = ? AND hadm_id IS NOT NULL AND subject_id IS NOT "
                      "NULL", [dataset])
    return _first_per(rows, "hadm_id", ("row_id", "admittime"))


def _text(value) -> str:
    return "" if value is None else str(value).strip().upper()


def _ethnicity(value) -> str:
    text = _text(value)
    if not text:
        return "unknown"
    for prefixes, group in ((("UNKNOWN", "UNABLE TO OBTAIN", "PATIENT DECLINED"), "unknown"), (("WHITE",), "white"),
                            (("BLACK",), "black"), (("HISPANIC", "SOUTH AMERICAN"), "hispanic"), (("ASIAN",), "asian")):
        if text.startswith(prefixes):
            return group
    return "other"


def _mapped(value, table: dict[str, str]) -> str:
    return table.get(_text(value), "other") if _text(value) else "unknown"


INSURANCE = {"MEDICARE": "medicare", "MEDICAID": "medicaid", "PRIVATE": "private", "GOVERNMENT": "government",
             "SELF PAY": "self_pay"}
ADMISSION = {"EMERGENCY": "emergency", "URGENT": "urgent", "ELECTIVE": "elective", "NEWBORN": "newborn"}


def _band(age: float | None) -> str:
    if age is None or age < 0:
        return "unknown"
    return "<50" if age < 50 else "50-64" if age < 65 else "65-79" if age < 80 else ">=80"


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def independent_table1(con, task_name: str, dataset: str) -> dict:
    """Table 1 by hand: the task's sample rows with their split, demographics from raw, groups by this file's rules."""
    task = get_task(task_name)
    where = "s.dataset = ?" + (" AND s.task = ?" if task.samples.shared else "")
    samples = _rows(con, f"SELECT s.subject_id, s.hadm_id, s.{task.samples.label_column} AS y, sp.split FROM "
                         f"{task.samples.table} s JOIN samples.splits sp ON sp.dataset = s.dataset AND "
                         f"sp.subject_id = s.subject_id AND sp.task = ? WHERE {where}",
                    [task.samples_task, dataset, *([task_name] if task.samples.shared else [])])
    patients = _first_per(_rows(con, "SELECT * FROM raw.patients WHERE dataset = ?", [dataset]), "subject_id",
                          ("row_id", "dob"))
    adm = _admissions(con, dataset)
    for s in samples:
        a, p = adm.get(s["hadm_id"], {}), patients.get(s["subject_id"], {})
        known = a.get("admittime") is not None and p.get("dob") is not None
        s["age"] = (a["admittime"] - p["dob"]).total_seconds() / (365.25 * 86400) if known else None
        s["sex"] = {"F": "female", "M": "male"}.get(_text(p.get("gender")), "unknown")
        s["age_band"] = _band(s["age"])
        s["ethnicity"] = _ethnicity(a.get("ethnicity"))
        s["insurance"] = _mapped(a.get("insurance"), INSURANCE)
        s["admission_type"] = _mapped(a.get("admission_type"), ADMISSION)
        s["y"] = len(s["y"]) if task.kind == "multilabel" else int(s["y"])
    out = {}
    for column in ("train", "val", "test", "all"):
        part = [s for s in samples if column in ("all", s["split"])]
        ages = [min(s["age"], 90.0) for s in part if s["age"] is not None and s["age"] >= 0]
        out[column] = {"patients": len({s["subject_id"] for s in part}), "samples": len(part),
                       "age_median": float(np.median(ages)) if ages else None, "y": sum(s["y"] for s in part),
                       **{a: _count(s[a] for s in part) for a in
                          ("sex", "age_band", "ethnicity", "insurance", "admission_type")}}
    return out


def independent_flow(con, task_name: str, dataset: str) -> dict[str, int]:
    """{reason or step: count} by hand from raw (and the mapped drugs, with the clock's late-drug rule)."""
    adm = list(_admissions(con, dataset).values())
    out = {"start": len(adm), "start_patients": len({a["subject_id"] for a in adm})}
    if task_name == "mortality":
        rules = (("without_flag", lambda a, t: a["hospital_expire_flag"] is None),
                 ("without_times", lambda a, t: a["admittime"] is None or a["dischtime"] is None),
                 ("under_48h", lambda a, t: a["dischtime"] <= t),
                 ("died_by_48h", lambda a, t: a["deathtime"] is not None and a["deathtime"] <= t))
        out.update({reason: 0 for reason, _ in rules})
        for a in adm:
            t = a["admittime"] + timedelta(hours=48) if a["admittime"] is not None else None
            hit = next((reason for reason, rule in rules if rule(a, t)), None)
            if hit:
                out[hit] += 1
    elif task_name == "readmission":
        dead = [a for a in adm if a["hospital_expire_flag"] == 1 or a["deathtime"] is not None]
        out["in_hospital_death"] = len(dead)
        newborn = [a for a in adm if a not in dead and _text(a["admission_type"]) == "NEWBORN"]
        out["newborn"] = len(newborn)
        out["no_discharge_time"] = sum(a["dischtime"] is None for a in adm if a not in dead and a not in newborn)
    else:
        def coded(table: str) -> set[int]:
            return {r["hadm_id"] for r in _rows(con, f"SELECT hadm_id, icd9_code FROM raw.{table} WHERE dataset = ?",
                                                [dataset]) if r["hadm_id"] is not None and _text(r["icd9_code"])}

        dx = coded("diagnoses_icd")
        if task_name == "next_visit":
            kept = [a for a in adm if a["hadm_id"] in dx]
            out["no_diagnoses"] = len(adm) - len(kept)
            out["last_visit"] = len({a["subject_id"] for a in kept})  # each patient's last visit has no next one
        else:
            px, disch = coded("procedures_icd"), {a["hadm_id"]: a["dischtime"] for a in adm}
            drugs = {r["hadm_id"] for r in _rows(con, "SELECT hadm_id, startdate FROM core.prescriptions_atc3 WHERE "
                                                      "dataset = ?", [dataset])
                     if r["hadm_id"] in disch and not (  # dated after discharge: the start day begins after it
                         r["startdate"] is not None and disch[r["hadm_id"]] is not None
                         and datetime.combine(r["startdate"].date(), datetime.min.time()) > disch[r["hadm_id"]])}
            complete = [a for a in adm if a["hadm_id"] in dx and a["hadm_id"] in px and a["hadm_id"] in drugs]
            out["incomplete_visit"] = len(adm) - len(complete)
            per_patient = _count(a["subject_id"] for a in complete)
            out["fewer_than_2_visits"] = sum(per_patient[a["subject_id"]] < 2 for a in complete)
    task = get_task(task_name)
    n = con.execute(f"SELECT count(*), count(DISTINCT subject_id) FROM {task.samples.table} WHERE dataset = ?"
                    + (" AND task = ?" if task.samples.shared else ""),
                    [dataset, *([task_name] if task.samples.shared else [])]).fetchall()[0]
    out["samples"], out["samples_patients"] = n
    return out


def _check(db: Path, dataset: str) -> None:
    con = connect(db, read_only=True)
    try:
        for name in EHR_TASKS:
            task = get_task(name)
            t1, want = pop.table1(con, task, dataset), independent_table1(con, name, dataset)
            for column, figures in want.items():
                got = t1["columns"][column]
                where = f"{name} {dataset} {column}"
                assert (got["patients"], got["samples"]) == (figures["patients"], figures["samples"]), where
                for attribute in ("sex", "age_band", "ethnicity", "insurance", "admission_type"):
                    assert got[attribute] == figures[attribute], (where, attribute)
                events = got["events"] if task.kind == "binary" else got["labels_per_sample"] * got["samples"]
                assert events == pytest.approx(figures["y"]), where
                assert got["age"]["median"] == pytest.approx(figures["age_median"]), where
            steps = pop.attrition(con, task, dataset)
            flow = independent_flow(con, name, dataset)
            assert (steps[0].remaining, steps[0].patients) == (flow["start"], flow["start_patients"]), name
            excluded = {s.reason: s.excluded for s in steps if s.excluded is not None}
            assert excluded == {k: v for k, v in flow.items() if not k.startswith(("start", "samples"))}, name
            final = next(s for s in steps if s.step == "samples of the task")
            assert (final.remaining, final.patients) == (flow["samples"], flow["samples_patients"]), name
            # the flow adds up: start - every exclusion = the samples; the splits add up to them
            assert steps[0].remaining - sum(excluded.values()) == final.remaining, name
            assert sum(s.remaining for s in steps[-3:]) == final.remaining == t1["columns"]["all"]["samples"], name
    finally:
        con.close()


def test_table1_and_attrition_agree_with_independent_queries_on_the_demo(demo_db: Path):  # noqa: F811
    _check(demo_db, DEMO)


def test_table1_and_attrition_agree_with_independent_queries_on_a_synthetic_cohort(synth_db: Path):
    _check(synth_db, SYNTH)
    con = connect(synth_db, read_only=True)
    try:  # the planted cases were counted where they belong, and the duplicated row's insurance never counts
        steps = {s.reason: s.excluded for s in pop.attrition(con, get_task("mortality"), SYNTH)}
        assert steps["without_flag"] >= 1 and steps["without_times"] >= 1 and steps["died_by_48h"] >= 1
        assert {s.reason: s.excluded for s in pop.attrition(con, get_task("readmission"), SYNTH)}["newborn"] >= 1
        assert con.execute("SELECT count(*) - count(DISTINCT hadm_id) FROM raw.admissions WHERE dataset = ?",
                           [SYNTH]).fetchall()[0][0] == 1  # the duplicate is there, and counted once above
    finally:
        con.close()


def test_a_flow_that_misses_the_stored_samples_says_so(demo_db: Path, tmp_path: Path):  # noqa: F811
    db = tmp_path / "tampered.duckdb"
    shutil.copy(demo_db, db)
    con = connect(db)
    try:
        con.execute("DELETE FROM samples.admission_outcome WHERE hadm_id = (SELECT min(hadm_id) FROM "
                    "samples.admission_outcome WHERE dataset = ? AND task = 'mortality')", [DEMO])
        steps = pop.attrition(con, get_task("mortality"), DEMO)
        odd = [s for s in steps if s.reason == "unexplained"]
        assert len(odd) == 1 and odd[0].excluded == 1, steps
        assert pop.table1(con, get_task("mortality"), "no_such_dataset") is None
    finally:
        con.close()


# ----------------------------------------------------------------------------------------------- the card


@pytest.fixture(scope="module")
def card_runs(synth_db: Path, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A logreg on mortality inside a pipeline run whose config states two study fields, and a most_frequent
    outside one; then the published snapshot."""
    import duckdb

    from medtx.pipeline.runs import start_pipeline_run
    from medtx.pipeline.steps import train_in_process

    db = tmp_path_factory.mktemp("cards") / "w.duckdb"
    shutil.copy(synth_db, db)
    start_pipeline_run(db, "pipe-1", {"study": {"funding": "Grant X-42 (no role in the analysis)",
                                                "ethics_approval": None}})
    models = db.parent / "models"
    runs = {model: train_in_process(db, get_task("mortality"), model, 0, {"n_boot": 50}, dataset=SYNTH,
                                    device="cpu", models_dir=models) for model in ("logreg", "most_frequent")}
    with duckdb.connect(str(db)) as con:  # the logreg run belongs to the pipeline run (as the pipeline records it)
        con.execute("UPDATE ml.runs SET pipeline_run_id = 'pipe-1' WHERE run_id = ?", [runs["logreg"]])
    return db, runs


def test_the_card_shows_flow_table1_drivers_and_study_from_the_snapshot_too(card_runs, tmp_path: Path):
    from medtx.evaluation.card import SECTIONS, build_card
    from medtx.evaluation.study import FIELDS, NOT_STATED
    from medtx.publish.snapshot import open_snapshot, publish_snapshot

    db, runs = card_runs
    con = connect(db, read_only=True)
    try:
        live = build_card(con, runs["logreg"])
        plain = build_card(con, runs["most_frequent"])
        model_coef = con.execute("SELECT config FROM ml.runs WHERE run_id = ?", [runs["logreg"]]).fetchall()[0][0]
    finally:
        con.close()
    snap = publish_snapshot(db, tmp_path / "snapshot.duckdb").path
    con = open_snapshot(snap)
    try:
        served = build_card(con, runs["logreg"])
        dictionary = dict(con.execute("SELECT icd9_code, long_title FROM ref.icd9_diagnoses").fetchall())
    finally:
        con.close()
    assert tuple(s.id for s in live.sections) == SECTIONS
    for key in ("table1", "attrition", "drivers", "study"):
        assert served.data[key] == live.data[key], key
    assert live.data["table1"]["columns"]["test"]["samples"] == next(
        s["remaining"] for s in live.data["attrition"] if s["step"] == "test samples")
    page = live.html()
    assert "id='attrition'" in page and "id='population'" in page and "excluded: under 48h" in page
    # study: the stated field shows, the others read "not stated"; a run outside a pipeline states nothing
    assert live.data["study"]["funding"].startswith("Grant X-42") and live.data["study"]["ethics_approval"] is None
    assert set(live.data["study"]) == set(FIELDS) and NOT_STATED in page
    assert all(v is None for v in plain.data["study"].values())
    # drivers: logreg's coefficients in plain words, each the fitted model's own (stored at fit time)
    d = live.data["drivers"]
    assert d["kind"] == "coefficient" and 0 < len(d["rows"]) <= 30
    stored = {r[0]: r[2] for r in json.loads(model_coef)["drivers"]["rows"]}
    assert {r["feature"]: r["value"] for r in d["rows"]} == stored
    values = [r["value"] for r in d["rows"]]
    positive = [v for v in values if v > 0]
    assert positive == sorted(positive, reverse=True) and all(v != 0 for v in values)
    for r in d["rows"]:
        if r["source"] == "diagnosis" and r["code"] in dictionary:
            assert dictionary[r["code"]] in r["words"]
        assert r["words"].startswith("this visit: ") == r["feature"].startswith("now:")
    assert plain.data["drivers"]["kind"] is None and "no fitted parameters" in plain.data["drivers"]["note"]


def test_logreg_drivers_are_the_largest_coefficients_of_the_fitted_model():
    from sklearn.linear_model import LogisticRegression

    from medtx.models.logreg import top_coefficients
    from medtx.models.ehr_data import LabelSpace

    rng = np.random.default_rng(0)
    x = rng.integers(0, 2, size=(400, 40)).astype(float)
    y = (x[:, 3] - x[:, 7] + rng.normal(0, 0.3, 400) > 0).astype(int)
    model = LogisticRegression(C=1.0, solver="liblinear").fit(x, y)
    names = np.array([f"conditions:{i}" for i in range(40)])
    rows = top_coefficients(model, names, LabelSpace(["y"], binary=True), k=3)["rows"]
    coef = model.coef_.ravel()
    assert [r[0] for r in rows[:3]] == list(names[np.argsort(-coef)[:3]])
    assert [r[0] for r in rows[3:]] == list(names[np.argsort(coef)[:3]])
    assert rows[0][0] == "conditions:3" and rows[3][0] == "conditions:7"


# ----------------------------------------------------------------------------------------------- coverage


def test_the_coverage_table_names_only_card_sections_that_exist():
    from medtx.evaluation.card import SECTIONS
    from medtx.evaluation.study import FIELDS

    text = (REPO_ROOT / "docs" / "CARD_COVERAGE.md").read_text()
    assert "CARD_COVERAGE.md" in (REPO_ROOT / "docs" / "MODEL_CARD.md").read_text()
    named = set(re.findall(r"`#([a-z-]+)`", text))
    assert named and named <= set(SECTIONS), sorted(named - set(SECTIONS))
    fields = set(re.findall(r"`study\.([a-z_]+)`", text))
    assert fields and fields <= set(FIELDS), sorted(fields - set(FIELDS))
    rows = {standard: len(re.findall(rf"^\| {prefix}\d", text, flags=re.M))
            for standard, prefix in (("tripod", "T"), ("cards", "M"), ("plp", "P"))}
    assert rows == {"tripod": 27, "cards": 9, "plp": 17}, rows


def test_study_fields_of_the_config_are_the_cards_and_refuse_bad_types(tmp_path: Path):
    from medtx.evaluation.study import FIELDS
    from medtx.pipeline.config import ConfigError, StudyConfig, load_config

    assert set(StudyConfig.model_fields) == set(FIELDS)
    path = tmp_path / "c.yaml"
    path.write_text("datasets: [{source: 'synth:10'}]\ntasks: {drug_rec: {models: [{model: logreg}]}}\n"
                    "study: {funding: 12, ethic_approval: yes}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert sorted(err.value.lines) == sorted([
        f"{path}: study.funding = 12: must be text or null",
        f"{path}: study.ethic_approval: unknown key; allowed: " + ", ".join(FIELDS)])
    path.write_text("datasets: [{source: 'synth:10'}]\ntasks: {drug_rec: {models: [{model: logreg}]}}\n"
                    "study: {funding: 'none', registration: }\n")
    assert load_config(path).study.funding == "none"


def test_every_cohort_exclusion_is_declared_in_its_task_file_and_checked_where_declared():
    """The flow reads each task's own declaration (population.py names no task); a declaration that cannot be
    counted is refused where it is written."""
    from medtx.tasks import all_tasks
    from medtx.tasks.base import CohortExclusion

    source = (REPO_ROOT / "medtx" / "evaluation" / "population.py").read_text()
    for task in all_tasks():
        assert f'"{task.name}"' not in source, task.name
    assert [e.reason for e in get_task("readmission").lineage.exclusions] == [
        "in_hospital_death", "newborn", "no_discharge_time"]
    assert pop._exclusions(get_task("readmission_notes")) == get_task("readmission").lineage.exclusions
    assert [e.reason for e in get_task("mortality").lineage.exclusions] == [
        "without_flag", "without_times", "under_48h", "died_by_48h"]
    with pytest.raises(ValueError, match="'fewer': `figures` goes with counted='figures' only"):
        CohortExclusion("fewer", "fewer visits", counted="figures")
    with pytest.raises(ValueError, match="'newborn': counted='admissions' needs its SQL"):
        CohortExclusion("newborn", "NEWBORN admission", counted="admissions")
