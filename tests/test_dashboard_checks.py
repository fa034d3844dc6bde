"""Issue 34, case 17 on the overview: the plausibility findings of each dataset's latest ingest (raw.ingest_checks)
reach the published snapshot (mart `dash.ingest_checks`) and the overview page, per table and rule with the row
count, the policy and what it did with the rows.

A copy of the dashboard tests' real warehouse; bad cohorts built from the bundled demo (the rows of
tests/test_ingest_plausibility.py) go in through the real `medtx ingest mimic3` CLI, once with `warn` and once
with `reject`; the real publish; the overview's real callback through the Flask test client.
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from dashboard import queries
from dashboard.app import create_app
from medtx.publish.snapshot import publish_snapshot
from tests.fixtures_dashboard import DATASET, real_warehouse
from tests.test_dashboard import _dash_post
from tests.test_ingest_guards import cohort, counts, run
from tests.test_ingest_plausibility import _bad_admissions


def _overview(snapshot: Path, dataset: str) -> str:
    client = create_app(snapshot).server.test_client()
    response = _dash_post(client, "overview-body.children", [
        {"id": "overview-dataset", "property": "value", "value": dataset},
        {"id": "snapshot-version", "property": "data", "value": "v1"}])
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    return json.dumps(response.get_json())


def _live_checks(db: Path, dataset: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT table_name, rule, n_rows, policy, example FROM raw.ingest_checks "
                           "WHERE dataset = ? ORDER BY table_name, rule", [dataset]).fetchall()


def test_plausibility_findings_reach_the_snapshot_and_the_overview(tmp_path: Path) -> None:
    live, snap = real_warehouse()
    queries.clear_cache()
    # the bundled demo has no finding: the overview says so (the card is there, with no table)
    clean = _overview(snap, DATASET)
    assert "plausibility-card" in clean and "No plausibility findings" in clean and "plausibility-table" not in clean
    assert queries.ingest_checks(snap, DATASET).height == 0

    db, copy = tmp_path / "w.duckdb", tmp_path / "w.snapshot.duckdb"
    db.write_bytes(live.read_bytes())
    adm, pat, hadm = _bad_admissions()
    before = counts(db)
    for dataset, policy in (("cohort_warn", "warn"), ("cohort_reject", "reject")):
        folder = cohort(tmp_path / dataset, admissions=adm, patients=pat)
        code, out = run("mimic3", "--db", str(db), "--source", str(folder), "--dataset", dataset,
                        "--plausibility", policy)
        assert code == 0, out
        action = "moved to raw.ingest_rejects" if policy == "reject" else "kept"
        assert (f"plausibility: raw.admissions [{dataset}]: 1 row(s) break rule discharge_before_admission "
                f"(e.g. hadm_id {hadm}: admittime") in out and action in out, out
    after = counts(db)
    assert {k: v for k, v in after.items() if "cohort_" not in k and k not in ("ingest_log", "ingest_rejects")} \
        == {k: v for k, v in before.items() if k not in ("ingest_log", "ingest_rejects")}  # other datasets as before
    assert after["patients[cohort_warn]"] == 101 and after["patients[cohort_reject]"] == 99
    publish_snapshot(db, copy)

    for dataset, policy, action in (("cohort_warn", "warn", "kept"),
                                    ("cohort_reject", "reject", "moved to raw.ingest_rejects")):
        live_rows = _live_checks(db, dataset)
        rules = {(t, r): n for t, r, n, _, _ in live_rows}
        assert rules[("raw.admissions", "discharge_before_admission")] == 1
        assert rules[("raw.admissions", "implausible_year")] == 1
        assert rules[("raw.patients", "duplicate_subject")] == 2
        assert {p for _, _, _, p, _ in live_rows} == {policy}
        # the snapshot carries exactly the live rows (mart), with what each rule says and the action
        shown = queries.ingest_checks(copy, dataset)
        assert [(r["table_name"], r["rule"], r["n_rows"], r["policy"], r["example"])
                for r in shown.iter_rows(named=True)] == live_rows
        assert set(shown["action"]) == {action}
        says = dict(zip(shown["rule"], shown["says"], strict=False))
        assert says["discharge_before_admission"] == "dischtime before admittime"
        # the overview shows one row per (table, rule) with its count and the policy
        page = _overview(copy, dataset)
        assert "plausibility-table" in page and "No plausibility findings" not in page
        total = sum(n for _, _, n, _, _ in live_rows)
        assert f"{len(live_rows)} rule(s) found {total:,} row(s) at the latest ingest" in page
        for table, rule, n, _, example in live_rows:
            assert rule in page and table in page and (example or "-") in page
        assert page.count(f'"children": "{policy}"') == len(live_rows)  # one policy badge per rule
        assert page.count(f'"children": "{action}"') == len(live_rows)

    # a snapshot published before the mart existed computes the same rows from raw.ingest_checks
    old = tmp_path / "old.snapshot.duckdb"
    old.write_bytes(copy.read_bytes())
    with duckdb.connect(str(old)) as con:
        con.execute("DROP SCHEMA dash CASCADE")
    assert queries.ingest_checks(old, "cohort_warn").equals(queries.ingest_checks(copy, "cohort_warn"))
