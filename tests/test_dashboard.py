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
    # The two conventions are different numbers for the same runs.
    assert {r["run_id"]: r["m_jaccard_samples"] for r in visit} != {r["run_id"]: r["m_jaccard_samples"] for r in rows}


def test_explorer_queries_reach_attention_of_real_runs(warehouse):
    _, snap = warehouse
    runs = queries.explorer_runs(snap, queries.EHR_TASKS)
    transformer = runs.filter(model="transformer").row(0, named=True)
    assert transformer["has_attention"]
    patients = queries.run_patients(snap, transformer["run_id"])
    subject = patients.filter(has_attention=True)["subject_id"][0]
    visits = queries.patient_visits(snap, transformer["run_id"], subject)
    sample_ids = [s for s in visits["sample_id"] if not queries.attention_modules(snap, transformer["run_id"], s).is_empty()]
    assert sample_ids, "a showcase visit of the patient has attention"
    modules = queries.attention_modules(snap, transformer["run_id"], sample_ids[0])
    assert "conditions" in set(modules["module"]) and modules["heads"].max() == 2
    weights = queries.attention(snap, transformer["run_id"], sample_ids[0], "conditions")
    row_sums = weights.group_by("layer", "head", "query_pos").agg(w=pl.col("weight").sum())
    assert row_sums["w"].min() > 0.5  # softmax rows (truncated to the stored key window) carry real mass
    history = queries.visit_history(snap, DATASET, subject)
    assert history["description"].drop_nulls().len() > 0  # ICD-9 descriptions joined
    notes = queries.explorer_runs(snap, queries.NOTE_TASKS)
    bert = notes.filter(model="bert_scratch").row(0, named=True)
    assert bert["has_attention"]
    assert queries.top_tokens_per_class(snap, bert["run_id"]).height > 0


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
    from medtx.pipeline_runs import start_pipeline_run
    from medtx.publish import publish_snapshot

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
