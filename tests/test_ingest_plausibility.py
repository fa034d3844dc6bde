"""Issue 34, case 17: implausible data is reported per rule with counts (raw.ingest_checks, the log, the CLI) and
handled by a policy: warn (keep), reject (move the rows to raw.ingest_rejects), fail (change nothing). Through the
real `medtx ingest` CLI on a real DuckDB file; bad rows built here from the bundled demo and MTSamples; every
case checks the rows of every raw table before and after."""

from __future__ import annotations

import gzip

import duckdb
import pytest

from tests.test_ingest_guards import (  # noqa: F401  (fixtures: base_db, db)
    BASE,
    MTSAMPLES,
    base_db,
    cohort,
    counts,
    db,
    demo_lines,
    run,
)


def _checks(db) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql("SELECT dataset, table_name, rule, n_rows, policy FROM raw.ingest_checks ORDER BY ALL"
                       ).fetchall()


def _rejects(db) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql("SELECT table_name, error_type, error FROM raw.ingest_rejects ORDER BY ALL").fetchall()


def _field(line: str, i: int, value: str) -> str:
    fields = line.split(",")
    fields[i] = value
    return ",".join(fields)


def _bad_admissions() -> tuple[list[str], list[str], str]:
    """ADMISSIONS with row 5's dischtime a day before its admittime and row 9's dischtime in 9999; PATIENTS with
    subject 0's row twice (other dob) and row 20's dob after all of that patient's admissions."""
    adm = demo_lines("admissions")
    header = adm[0].split(",")
    admit, disch = header.index("admittime"), header.index("dischtime")
    start = adm[5].split(",")[admit]
    adm[5] = _field(adm[5], disch, str(int(start[:4]) - 1) + start[4:])
    adm[9] = _field(adm[9], disch, "9999-01-01 00:00:00")
    pat = demo_lines("patients")
    dob = pat[0].split(",").index("dob")
    pat.append(_field(pat[1], dob, "2000-01-01 00:00:00"))  # subject of row 1 again, another dob
    pat[20] = _field(pat[20], dob, "2299-01-01 00:00:00")
    return adm, pat, adm[5].split(",")[header.index("hadm_id")]


def test_warn_keeps_the_rows_and_reports_each_rule_with_counts(db, tmp_path) -> None:
    adm, pat, _ = _bad_admissions()
    folder = cohort(tmp_path / "cohort", admissions=adm, patients=pat)
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort")
    assert code == 0, out
    found = {(table, rule): n for _, table, rule, n, policy in _checks(db)}
    assert found[("raw.patients", "duplicate_subject")] == 2
    assert found[("raw.admissions", "discharge_before_admission")] == 1
    assert found[("raw.admissions", "implausible_year")] == 1
    assert found[("raw.admissions", "birth_after_admission")] >= 1
    assert "plausibility: raw.admissions [cohort]: 1 row(s) break rule discharge_before_admission" in out
    assert counts(db) == {**BASE, "patients[cohort]": 101, "ingest_log": BASE["ingest_log"] + 6}  # all kept


def test_reject_moves_the_rows_to_the_rejects(db, tmp_path) -> None:
    adm, pat, _ = _bad_admissions()
    folder = cohort(tmp_path / "cohort", admissions=adm, patients=pat)
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort",
                    "--plausibility", "reject")
    assert code == 0, out
    found = {(table, rule): n for _, table, rule, n, policy in _checks(db)}
    moved = found[("raw.admissions", "discharge_before_admission")] + found[("raw.admissions", "implausible_year")] \
        + found[("raw.admissions", "birth_after_admission")]
    after = counts(db)
    assert after["patients[cohort]"] == 99  # 101 read, both rows of the duplicated subject moved
    assert after["admissions[cohort]"] == 129 - moved
    rejects = _rejects(db)
    assert ("patients", "PLAUSIBILITY", "duplicate_subject: the same subject_id twice with different data") in rejects
    assert after["ingest_rejects"] == len(rejects) == 2 + moved
    assert {k: v for k, v in after.items() if "[other]" in k} == {k: v for k, v in BASE.items() if "[other]" in k}


def test_fail_changes_nothing_and_names_the_rule(db, tmp_path) -> None:
    adm, _, hadm = _bad_admissions()
    folder = cohort(tmp_path / "cohort", admissions=adm)
    code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", "cohort",
                    "--plausibility", "fail")
    assert code == 2, out
    assert "raw.admissions [cohort]: 1 row(s) with dischtime before admittime (rule discharge_before_admission; " \
           f"e.g. hadm_id {hadm}: admittime" in out
    assert "nothing was changed — plausibility policy 'fail'" in out
    assert counts(db) == BASE and _checks(db) == []


def test_a_wrong_policy_is_one_line_exit_2_before_anything_is_read(db, tmp_path) -> None:
    code, out = run("mimic3", "--db", str(db), "--source", str(tmp_path), "--dataset", "cohort",
                    "--plausibility", "ignore")
    assert code == 2 and "Invalid value for '--plausibility'" in out and "'ignore' is not one of" in out, out
    assert counts(db) == BASE


@pytest.mark.parametrize("policy", ["warn", "reject", "fail"])
def test_mtsamples_id_twice_with_other_text(db, tmp_path, policy: str) -> None:
    notes = gzip.open(MTSAMPLES, "rt", newline="").read()
    start, end = notes.index("\n5,"), notes.index("\n6,")
    twin = notes[start:end].replace("\n5,2-D Echocardiogram,", "\n5,3-D Echocardiogram,", 1)  # other description
    assert twin != notes[start:end]
    broken = tmp_path / "twice.csv"
    broken.write_text(notes.rstrip("\n") + twin + "\n", newline="")
    code, out = run("mtsamples", "--db", str(db), "--source", str(broken), "--plausibility", policy)
    if policy == "fail":
        assert code == 2 and "raw.mtsamples [mtsamples]: 2 row(s) with the same note_id twice with different text" \
            in out, out
        assert counts(db) == BASE
        return
    assert code == 0, out
    assert _checks(db) == [("mtsamples", "raw.mtsamples", "duplicate_note", 2, policy)]
    expected = {"warn": 5000, "reject": 4998}[policy]
    assert counts(db) == {**BASE, "mtsamples": expected, "ingest_rejects": 2 if policy == "reject" else 0,
                          "ingest_log": BASE["ingest_log"] + 1}


def test_the_pipeline_config_sets_the_policy(db, tmp_path) -> None:
    """`ingest: {plausibility: fail}` reaches the plan's ingest step and the pipeline's step function; a value
    outside warn/reject/fail is a config error at load."""
    from medtx.ingest.plausibility import ImplausibleData
    from medtx.pipeline.kinds import ingest as ingest_kind
    from medtx.pipeline.config import ConfigError, load_config
    from medtx.pipeline.plan import build_plan
    from tests.conftest import DATA

    adm, _, _ = _bad_admissions()
    folder = cohort(tmp_path / "cohort", admissions=adm)
    config = tmp_path / "pipeline.yaml"
    for policy in ("fail", "sometimes"):
        config.write_text(f"datasets:\n  - {{source: {folder}, name: cohort}}\ningest: {{plausibility: {policy}}}\n"
                          "seeds: [42]\ntasks:\n  readmission:\n    models: [{model: logreg}]\n")
        if policy == "sometimes":
            with pytest.raises(ConfigError) as err:
                load_config(config)
            assert any("ingest.plausibility" in line and "sometimes" in line for line in err.value.lines), err.value
            continue
        step = build_plan(load_config(config), tmp_path / "synth", DATA)["ingest.cohort"]
        assert step.params["plausibility"] == "fail"
        with pytest.raises(ImplausibleData, match=r"raw\.admissions \[cohort\]: 1 row\(s\) with dischtime before "):
            ingest_kind.run(step.spec(), {"db": str(db), "cache_dir": str(tmp_path / "cache")})
        assert counts(db) == BASE
