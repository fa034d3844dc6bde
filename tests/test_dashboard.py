"""Dashboard without a browser: validation, security, empty state, queries on a real published snapshot,
and pick-up of a newly published snapshot. The browser tests are in test_dashboard_browser.py."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from dashboard import create_app, queries, resolve_snapshot, validate
from dashboard.pages import leaderboard
from dashboard.security import InsecureBindError, is_loopback, require_password_for
from tests.fixtures_dashboard import DATASET, real_warehouse
from medtx.tasks import all_tasks, tasks_of_family


def _note_tasks():
    """The tasks the note explorer lists (dashboard/pages/notes.py): the registry's text classification tasks."""
    return [t for t in all_tasks() if t.classifies_text]


@pytest.fixture(scope="module")
def warehouse() -> tuple[Path, Path]:
    return real_warehouse()


def _dash_post(client, output: str, inputs: list[dict], state: list[dict] | None = None):
    """One callback round-trip exactly as the browser sends it."""
    component, prop = output.split(".")
    body = {
        "output": output,
        "outputs": {"id": component, "property": prop},
        "inputs": inputs,
        "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs],
        "state": state or [],
    }
    return client.post("/_dash-update-component", json=body)


# --- validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["x'; DROP TABLE ml.runs; --", "", "a" * 200, "../etc/passwd", None, 5])
def test_run_id_validation_rejects_anything_odd(bad):
    with pytest.raises(validate.InvalidParameter, match="run_id"):
        validate.run_id(bad)


def test_valid_ids_pass_and_integer_ids_are_strict():
    assert validate.run_id("drug_rec.transformer.synth_1000.s0.3f9a1c2b") == "drug_rec.transformer.synth_1000.s0.3f9a1c2b"
    assert validate.integer_id("hadm_id", "142345") == 142345
    for bad in ("-1", "0", "1e3", "12 OR 1=1", True, "9" * 30):
        with pytest.raises(validate.InvalidParameter, match="subject_id"):
            validate.integer_id("subject_id", bad)
    with pytest.raises(validate.InvalidParameter):
        validate.dataset("Mimic-3")
    with pytest.raises(validate.InvalidParameter):
        validate.task("drop_table")
    assert validate.query_params("?run_id=a&run_id=b&x=1") == {"run_id": "a", "x": "1"}


def test_resolve_snapshot_accepts_live_warehouse_or_snapshot(tmp_path: Path):
    assert resolve_snapshot(tmp_path / "warehouse.duckdb") == tmp_path / "warehouse.snapshot.duckdb"
    assert resolve_snapshot(tmp_path / "w.snapshot.duckdb") == tmp_path / "w.snapshot.duckdb"


# --- security -----------------------------------------------------------------------------------------


def test_non_loopback_bind_needs_a_password():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    require_password_for("127.0.0.1", None)
    require_password_for("0.0.0.0", "s3cret")
    with pytest.raises(InsecureBindError, match="MEDTX_DASHBOARD_PASSWORD"):
        require_password_for("0.0.0.0", None)


def test_cli_refuses_public_bind_without_password(tmp_path: Path, monkeypatch):
    from flows.cli import app as cli

    monkeypatch.delenv("MEDTX_DASHBOARD_PASSWORD", raising=False)
    result = CliRunner().invoke(cli, ["dashboard", "--db", str(tmp_path / "w.duckdb"), "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "refusing to bind" in result.output


def test_basic_auth_guards_every_request(tmp_path: Path):
    app = create_app(tmp_path / "none.snapshot.duckdb", credentials=("medtx", "s3cret"))
    client = app.server.test_client()
    assert client.get("/").status_code == 401
    assert client.get("/_dash-layout").status_code == 401
    assert client.get("/", auth=("medtx", "wrong")).status_code == 401
    assert client.get("/", auth=("other", "s3cret")).status_code == 401
    assert client.get("/", auth=("medtx", "s3cret")).status_code == 200


# --- empty state --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/leaderboard", "/run", "/patient", "/notes"])
def test_every_page_shows_an_empty_state_before_the_first_publish(tmp_path: Path, path: str):
    missing = tmp_path / "warehouse.snapshot.duckdb"
    client = create_app(missing).server.test_client()
    response = _dash_post(client, "page.children", [
        {"id": "url", "property": "pathname", "value": path},
        {"id": "url", "property": "search", "value": ""},
        {"id": "snapshot-present", "property": "data", "value": False},
    ])
    assert response.status_code == 200
    text = json.dumps(response.get_json())
    assert "No published warehouse yet" in text and str(missing) in text
    assert "Traceback" not in text
    assert queries.datasets(missing) == [] and queries.runs_index(missing).is_empty()


def test_a_snapshot_without_ml_tables_reads_as_empty(tmp_path: Path):
    """An old or partial snapshot (a stage not run yet) gives empty frames, not errors."""
    snap = tmp_path / "w.snapshot.duckdb"
    duckdb.connect(str(snap)).close()
    assert queries.runs_index(snap).is_empty()
    assert queries.leaderboard_runs(snap, "drug_rec", DATASET).is_empty()
    assert queries.last_pipeline_run(snap) is None


# --- queries on the real snapshot -------------------------------------------------------------------


def test_overview_queries_on_real_data(warehouse):
    _, snap = warehouse
    assert DATASET in queries.datasets(snap)
    cohort = queries.cohort_counts(snap).filter(dataset=DATASET).row(0, named=True)
    assert cohort["patients"] == 100 and cohort["admissions"] == 129  # the MIMIC-III demo
    samples = queries.sample_counts(snap, DATASET)
    assert set(samples["task"]) == {"drug_rec", "specialty"} and {"train", "test"} <= set(samples["split"])
    coverage = queries.mapping_coverage(snap, DATASET)
    assert {"rxcui", "unmapped"} <= set(coverage["route"])
    assert queries.top_unmapped_drugs(snap, DATASET).height > 0
    assert queries.last_pipeline_run(snap)["status"] == "completed"


def test_leaderboard_has_every_run_with_mean_and_sd(warehouse):
    _, snap = warehouse
    conventions = queries.averaging_options(snap, "drug_rec", DATASET)
    assert set(conventions) == {"visit", "patient"}
    rows, metric_names = leaderboard.leaderboard_rows(
        queries.leaderboard_runs(snap, "drug_rec", DATASET),
        queries.leaderboard_metrics(snap, "drug_rec", DATASET, "patient"),
    )
    assert sorted(r["model"].split("]")[0][1:] for r in rows) == ["logreg", "transformer"]
    assert "jaccard_samples" in metric_names
    assert all(r["m_jaccard_samples"] is not None and r["m_jaccard_samples_sd"] is not None for r in rows)
    visit, _ = leaderboard.leaderboard_rows(queries.leaderboard_runs(snap, "drug_rec", DATASET),
                                            queries.leaderboard_metrics(snap, "drug_rec", DATASET, "visit"))
    # The two conventions are different numbers for the same runs, unless the test split is one patient (the demo's
    # drug_rec test split under the one patient split per dataset: 14 visits of one patient), where they coincide.
    import duckdb

    with duckdb.connect(str(snap), read_only=True) as con:
        test_patients = con.execute("SELECT count(DISTINCT subject_id) FROM samples.splits WHERE dataset = ? AND "
                                    "task = 'drug_rec' AND split = 'test'", [DATASET]).fetchall()[0][0]
    same = {r["run_id"]: r["m_jaccard_samples"] for r in visit} == {r["run_id"]: r["m_jaccard_samples"] for r in rows}
    assert same == (test_patients == 1), test_patients


def test_explorer_queries_reach_attention_of_real_runs(warehouse):
    _, snap = warehouse
    runs = queries.explorer_runs(snap, tasks_of_family("ehr"))
    transformer = runs.filter(model="transformer").row(0, named=True)
    assert transformer["has_attention"]
    patients = queries.run_patients(snap, transformer["run_id"])
    subject = patients.filter(has_attention=True)["subject_id"][0]
    visits = queries.patient_visits(snap, transformer["run_id"], subject)
    sample_ids = [s for s in visits["sample_id"] if not queries.attention_modules(snap, transformer["run_id"], s).is_empty()]
    assert sample_ids, "a showcase visit of the patient has attention"
    modules = queries.attention_modules(snap, transformer["run_id"], sample_ids[0])
    # drug_rec's transformer reads one joint sequence of every feature's codes: one attention module, `codes`
    assert set(modules["module"]) == {"codes"} and modules["heads"].max() == 2
    weights = queries.attention(snap, transformer["run_id"], sample_ids[0], "codes")
    row_sums = weights.group_by("layer", "head", "query_pos").agg(w=pl.col("weight").sum())
    assert row_sums["w"].min() > 0.5  # softmax rows (truncated to the stored key window) carry real mass
    history = queries.patient_history(snap, DATASET, subject)
    diagnoses = [d for visit in history["diagnoses"] for d in visit]
    assert any(" " in d for d in diagnoses)  # "code description": ICD-9 descriptions joined
    notes = queries.explorer_runs(snap, _note_tasks())
    bert = notes.filter(model="bert_scratch").row(0, named=True)
    assert bert["has_attention"]
    assert queries.top_tokens_per_class(snap, bert["run_id"]).height > 0


def test_the_run_page_metrics_say_why_the_ece_has_no_interval(warehouse):
    """The run page's metrics grid carries ci_method: the ECE's value without an interval, and why."""
    from medtx.metrics.intervals import CI_METHOD, WITHHELD

    _, snap = warehouse
    run_id = queries.explorer_runs(snap, tasks_of_family("ehr")).filter(model="transformer").row(0, named=True)["run_id"]
    test = queries.run_metrics(snap, run_id).filter(split="test")
    ece = test.filter(metric="ece").row(0, named=True)
    assert ece["value"] is not None and ece["ci_low"] is None and ece["ci_method"] == CI_METHOD + WITHHELD
    brier = test.filter(metric="brier").row(0, named=True)
    assert brier["ci_low"] <= brier["value"] <= brier["ci_high"] and brier["ci_method"] == CI_METHOD
    # the 10x80% subsample sd sits last under its convention's name, not as a bare "sd" beside n_boot = 1000
    assert test.columns[-1] == "safedrug_sd" and "sd" not in test.columns and brier["n_boot"] == 1000


def test_user_input_never_reaches_sql_text(warehouse):
    """An injection attempt travels as a bound value: it matches nothing and changes nothing."""
    _, snap = warehouse
    before = queries.runs_index(snap).height
    attack = "x' OR '1'='1"
    assert queries.run(snap, attack) is None
    assert queries.visit_predictions(snap, attack, "1' OR '1'='1").is_empty()
    assert queries.leaderboard_runs(snap, "drug_rec' OR '1'='1", DATASET).is_empty()
    queries.clear_cache()
    assert queries.runs_index(snap).height == before


def test_run_detail_callback_rejects_a_bad_url_id(warehouse):
    _, snap = warehouse
    client = create_app(snap).server.test_client()
    response = _dash_post(client, "page.children", [
        {"id": "url", "property": "pathname", "value": "/run"},
        {"id": "url", "property": "search", "value": "?run_id=%27%3B%20DROP%20TABLE%20ml.runs%3B--"},
        {"id": "snapshot-present", "property": "data", "value": True},
    ])
    text = json.dumps(response.get_json())
    assert response.status_code == 200 and "is not a valid run id" in text


def test_new_publish_is_picked_up_without_restart(warehouse, tmp_path: Path):
    """Cached results are keyed by the snapshot version: a publish (os.replace) is seen by the next query."""
    from medtx.pipeline.runs import start_pipeline_run
    from medtx.publish.snapshot import publish_snapshot

    db, snap = warehouse
    copy_db, copy_snap = tmp_path / "w.duckdb", tmp_path / "w.snapshot.duckdb"
    copy_db.write_bytes(db.read_bytes())
    publish_snapshot(copy_db, copy_snap)
    assert queries.last_pipeline_run(copy_snap)["pipeline_run_id"] == "test-pipeline-1"
    start_pipeline_run(copy_db, "test-pipeline-2", {"purpose": "second publish"})
    assert queries.last_pipeline_run(copy_snap)["pipeline_run_id"] == "test-pipeline-1"  # not published yet
    publish_snapshot(copy_db, copy_snap)
    last = queries.last_pipeline_run(copy_snap)
    assert last["pipeline_run_id"] == "test-pipeline-2" and last["status"] == "running"
    assert json.loads(queries.query(copy_snap, "SELECT config FROM ml.pipeline_runs WHERE pipeline_run_id = ?",
                                    ["test-pipeline-2"]).item())["purpose"] == "second publish"


# --- publish-time marts and cache warm-up -------------------------------------------------------------


def test_published_marts_equal_their_definitions_on_the_base_tables(warehouse):
    """Every `dash.*` mart in the snapshot holds exactly what its SELECT computes from the copied tables."""
    from medtx.publish.marts import MARTS

    _, snap = warehouse
    con = duckdb.connect(str(snap), read_only=True)
    try:
        for name, mart in MARTS.items():
            stored = con.sql(f"SELECT count(*) FROM dash.{name}").fetchall()[0][0]
            if name == "ingest_checks":  # the demo and MTSamples have no plausibility finding (filled and
                assert stored == 0       # compared in tests/test_dashboard_checks.py)
            else:
                assert stored > 0, f"mart {name} is empty on a warehouse with real runs"
            for a, b in ((f"dash.{name}", f"({mart.select})"), (f"({mart.select})", f"dash.{name}")):
                diff = con.sql(f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})").fetchall()
                assert diff[0][0] == 0, f"mart {name} differs from its definition"
    finally:
        con.close()


def test_a_snapshot_without_marts_gives_the_same_answers(warehouse, tmp_path: Path):
    """A snapshot published before the marts existed: the dashboard computes them inline, same results."""
    _, snap = warehouse
    old = tmp_path / "old.snapshot.duckdb"
    old.write_bytes(snap.read_bytes())
    con = duckdb.connect(str(old))
    con.execute("DROP SCHEMA dash CASCADE")
    con.close()
    run = queries.explorer_runs(snap, tasks_of_family("ehr")).filter(model="transformer")["run_id"][0]
    note_run = queries.explorer_runs(snap, _note_tasks()).filter(model="bert_scratch")["run_id"][0]
    subject = queries.run_patients(snap, run)["subject_id"][0]
    for read in (
        lambda s: queries.cohort_counts(s), lambda s: queries.sample_counts(s, DATASET),
        lambda s: queries.explorer_runs(s, tasks_of_family("ehr")), lambda s: queries.run_patients(s, run),
        lambda s: queries.patient_visits(s, run, subject), lambda s: queries.patient_history(s, DATASET, subject),
        lambda s: queries.run_calibration(s, run), lambda s: queries.run_notes(s, note_run),
        lambda s: queries.top_tokens_per_class(s, note_run),
    ):
        new, inline = read(snap), read(old)
        assert new.height > 0 and new.equals(inline)


def test_warm_up_fills_the_caches_every_page_reads(warehouse, tmp_path: Path):
    """After `warm`, loading every page again runs no SQL: the first visitor after a publish does not wait."""
    from dashboard.warm import PAGE_CALLBACKS, load_page, warm

    _, snap = warehouse
    copy = tmp_path / "w.snapshot.duckdb"
    copy.write_bytes(snap.read_bytes())
    app = create_app(copy)
    queries.clear_cache()
    assert warm(app, copy) > 0
    misses = queries._cached_query.cache_info().misses
    client = app.server.test_client()
    for page in PAGE_CALLBACKS:
        assert all(seconds >= 0 for _, seconds, _ in load_page(app, client, page, copy))
    assert queries._cached_query.cache_info().misses == misses


def test_patient_dropdown_ships_a_bounded_list_and_searches_the_rest():
    from dashboard.pages import patient

    many = pl.DataFrame({"subject_id": list(range(1000, 1000 + 3 * patient.MAX_PATIENT_OPTIONS)),
                         "visits": 2, "has_attention": False})
    first = patient.patient_choices(many, current=1000)
    assert len(first) == patient.MAX_PATIENT_OPTIONS and first[0]["value"] == 1000
    last = int(many["subject_id"][-1])
    assert [o["value"] for o in patient.patient_choices(many, current=None, search=str(last))] == [last]
    kept = patient.patient_choices(many, current=last, search="1")  # the selected patient stays selectable
    assert kept[0]["value"] == last and len(kept) == patient.MAX_PATIENT_OPTIONS + 1


def test_the_app_warms_itself_when_a_new_snapshot_appears(warehouse, tmp_path: Path):
    """`create_app(warm=True)` (what `medtx dashboard` uses) warms at start and again after each publish."""
    import os
    import time

    _, snap = warehouse
    path = tmp_path / "w.snapshot.duckdb"
    path.write_bytes(snap.read_bytes())
    queries.clear_cache()
    warmer = create_app(path, warm=True).server.extensions["medtx_warmer"]
    try:
        def warmed(timeout: float = 60.0):
            deadline = time.monotonic() + timeout
            while warmer.version != queries.snapshot_signature(path) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert warmer.version == queries.snapshot_signature(path), "the warmer did not warm this version"
            return warmer.version

        first = warmed()
        staged = tmp_path / "w.snapshot.duckdb.tmp"
        staged.write_bytes(snap.read_bytes())
        os.replace(staged, path)  # what publish_snapshot does
        assert warmed() != first
    finally:
        warmer.stop()


def test_marts_of_missing_tables_are_skipped_not_fatal(tmp_path: Path):
    """Publishing a warehouse where a stage has not run yet still succeeds: that mart is just absent."""
    from medtx.publish.marts import build_marts

    con = duckdb.connect(str(tmp_path / "partial.duckdb"))
    con.execute("CREATE SCHEMA raw")  # ingested, nothing else yet
    for table in ("patients", "admissions", "diagnoses_icd", "procedures_icd", "prescriptions"):
        con.execute(f"CREATE TABLE raw.{table} AS SELECT 'demo' AS dataset, range AS subject_id FROM range(3)")
    rows = build_marts(con, "partial")
    assert rows == {"cohort_counts": 5}  # every other mart reads samples.* / ml.*, absent here
    assert con.sql("SELECT sum(n) FROM dash.cohort_counts").fetchall() == [(15,)]
    con.close()


def test_leaderboard_names_how_a_text_encoder_was_trained():
    """Two `minilm` runs (linear probe vs top-2 fine-tuning) must not look like the same model."""
    import duckdb
    import polars as pl

    con = duckdb.connect()
    con.execute("CREATE TABLE r (run_id VARCHAR, config JSON, device VARCHAR)")
    con.execute("INSERT INTO r VALUES ('a', '{\"text\": {\"freeze_encoder\": true}}', 'cpu'), "
                "('b', '{\"text\": {\"finetune_layers\": 2, \"freeze_encoder\": false}}', 'cpu'), "
                "('c', '{\"epochs\": 3}', 'cpu')")
    variants = dict(con.sql(f"SELECT run_id, {queries.RUN_VARIANT_SQL} FROM r").fetchall())
    assert variants == {"a": "frozen encoder + linear probe", "b": "top 2 layers fine-tuned", "c": None}
    # a run recorded from a GPU machine (benchmarks/gpu/record.py) is its own row, never pooled with CPU runs
    con.execute("INSERT INTO r VALUES ('g', '{\"epochs\": 3}', 'cuda'), "
                "('h', '{\"text\": {\"freeze_encoder\": true}}', 'cuda:0')")
    gpu = dict(con.sql(f"SELECT run_id, {queries.RUN_VARIANT_SQL} FROM r WHERE run_id IN ('g', 'h')").fetchall())
    assert gpu == {"g": "on cuda", "h": "frozen encoder + linear probe, on cuda:0"}
    runs = pl.DataFrame({"run_id": list(variants), "model": ["minilm", "minilm", "tfidf_logreg"],
                         "variant": list(variants.values()), "seed": [0, 0, 0], "status": ["completed"] * 3,
                         "is_synthetic": [False] * 3, "collapsed": [False] * 3, "collapse_reason": [None] * 3,
                         "threshold": [None] * 3, "n_params": [1, 1, 1], "train_seconds": [1.0] * 3,
                         "error": [None] * 3})
    rows, _ = leaderboard.leaderboard_rows(runs, pl.DataFrame())
    labels = [r["model"] for r in rows]
    assert labels[0].endswith("(frozen encoder + linear probe)") and labels[1].endswith("(top 2 layers fine-tuned)")
    assert labels[2] == "[tfidf_logreg](/run?run_id=c)"


def test_leaderboard_rows_carry_intervals_sizes_and_verdicts(warehouse):
    """Issue 14 on the real snapshot: every drug_rec metric but the ECE has its 95% interval, each row n test
    patients and samples; the demo split is too small to compare, so the transformer's verdict is `too_small` against logreg
    (the only non-neural baseline, hence the reference) and the paired differences reach the run detail."""
    _, snap = warehouse
    runs = queries.leaderboard_runs(snap, "drug_rec", DATASET)
    metrics = queries.leaderboard_metrics(snap, "drug_rec", DATASET, "visit")
    rows, names = leaderboard.leaderboard_rows(runs, metrics, queries.leaderboard_sizes(snap, "drug_rec", DATASET),
                                               leaderboard.headline_metric("drug_rec"))
    by_model = {r["model"].split("]")[0][1:]: r for r in rows}
    for row in rows:
        lo, value, hi = row["m_pr_auc_samples_lo"], row["m_pr_auc_samples"], row["m_pr_auc_samples_hi"]
        assert lo is not None and lo <= hi and 0 <= lo and hi <= 1, row["run_id"]
        assert row["n_test_patients"] >= 1 and row["n_test_samples"] >= row["n_test_patients"]
        assert value is not None and row["m_brier_lo"] is not None
        assert row["m_ece"] is not None and row["m_ece_lo"] is None  # the ECE: a value, no (biased) interval
    assert by_model["logreg"]["verdict"] == "reference"
    assert by_model["transformer"]["verdict"] == "too_small"
    sizes = queries.task_datasets(snap).filter(pl.col("task") == "drug_rec")["n_test_units"].to_list()
    assert all(n is not None and n < 30 for n in sizes)
    diffs = queries.run_comparisons(snap, by_model["transformer"]["run_id"])
    assert set(diffs["metric"]) == {"pr_auc_samples", "jaccard_samples"}
    assert all(len(d) == 1000 for d in diffs["diffs"]) and set(diffs["verdict"]) == {"too_small"}
    grouped = leaderboard.ci.group_seeds(rows, [leaderboard._field(m) for m in names])
    assert len(grouped) == len(rows)  # one seed per model here: nothing merged


def test_leaderboard_defaults_to_the_dataset_with_most_test_patients():
    assert leaderboard.default_dataset(["mimic3_demo", "synth_10000", "x"], [2, 265, None]) == "synth_10000"
    assert leaderboard.default_dataset(["a", "b"], [None, None]) == "a"
    assert leaderboard.default_dataset([], []) is None


def test_seed_grouping_gives_a_verdict_only_when_every_seed_agrees():
    from dashboard import intervals as ci

    def row(seed, value, verdict, model="transformer"):
        return {"model": model, "group_key": model, "seed": seed, "m_x": value, "m_x_lo": value - 0.01,
                "m_x_hi": value + 0.01, "verdict": verdict}

    agree = ci.group_seeds([row(0, 0.70, "better"), row(1, 0.72, "better"), row(2, 0.74, "better")], ["m_x"])
    assert len(agree) == 1 and agree[0]["verdict"] == "better" and agree[0]["seed"] == "3 seeds"
    assert agree[0]["m_x"] == pytest.approx(0.72) and agree[0]["m_x_seed_sd"] == pytest.approx(0.02)
    assert agree[0]["m_x_lo"] is None  # a per-seed interval does not describe the mean over seeds
    split = ci.group_seeds([row(0, 0.70, "better"), row(1, 0.72, "no_detectable_difference")], ["m_x"])
    assert split[0]["verdict"] == "seeds_disagree" and "no verdict" in split[0]["verdict_text"]


def test_the_leakage_gate_shows_on_overview_leaderboard_and_run_detail(warehouse):
    """Issue 33: the gate's verdict per (task, dataset), recorded when the samples were built, reaches the
    overview's gate table, the leaderboard's alert and the run page (drug_rec on the demo: pass)."""
    _, snap = warehouse
    gates = queries.leakage_gates(snap, DATASET)
    row = gates.filter(task="drug_rec").row(0, named=True)
    assert (row["status"], row["split_overlap"], row["late_codes"]) == ("pass", 0, 0)
    assert row["message"].startswith(f"leakage gate pass drug_rec/{DATASET}")
    client = create_app(snap).server.test_client()
    overview = json.dumps(_dash_post(client, "overview-body.children", [
        {"id": "overview-dataset", "property": "value", "value": DATASET},
        {"id": "snapshot-version", "property": "data", "value": "v1"}]).get_json())
    assert "gate-table" in overview and f"leakage gate pass drug_rec/{DATASET}" in overview
    outputs = [("leaderboard-grid", "rowData"), ("leaderboard-grid", "columnDefs"), ("lb-note", "children"),
               ("lb-size-alert", "children"), ("lb-forest", "children")]
    inputs = [{"id": "lb-task", "property": "value", "value": "drug_rec"},
              {"id": "lb-dataset", "property": "value", "value": DATASET},
              {"id": "lb-averaging", "property": "value", "value": "visit"},
              {"id": "lb-group", "property": "value", "value": []},
              {"id": "snapshot-version", "property": "data", "value": "v1"}]
    board = json.dumps(client.post("/_dash-update-component", json={
        "output": ".." + "...".join(f"{c}.{p}" for c, p in outputs) + "..",
        "outputs": [{"id": c, "property": p} for c, p in outputs], "inputs": inputs, "state": [],
        "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs]}).get_json())
    assert "lb-gate" in board and "Leakage gate: pass." in board
    run_id = queries.explorer_runs(snap, tasks_of_family("ehr")).filter(model="logreg").row(0, named=True)["run_id"]
    page = json.dumps(_dash_post(client, "run-body.children", [
        {"id": "run-select", "property": "value", "value": run_id},
        {"id": "snapshot-version", "property": "data", "value": "v1"}]).get_json())
    assert "run-gate" in page and f"leakage gate pass drug_rec/{DATASET}" in page
    # a text task split by text group is not gated: its run page shows no gate line
    text_run = queries.runs_index(snap).filter(task="specialty").row(0, named=True)["run_id"]
    text_page = json.dumps(_dash_post(client, "run-body.children", [
        {"id": "run-select", "property": "value", "value": text_run},
        {"id": "snapshot-version", "property": "data", "value": "v1"}]).get_json())
    assert "run-gate" not in text_page
