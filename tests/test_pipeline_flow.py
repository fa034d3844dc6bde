"""The real `medtx-pipeline` flow on tiny data under a Prefect test server.

One module-scoped warehouse goes through: a cold run (every table filled, one model forced to fail while the
others succeed), a rerun served from cache, `run-task --refresh` recomputing only the named step, an edited
source file redoing only what depends on it, and the published snapshot read while a writer holds the live
file. A second test runs the flow on a local Dask cluster.
"""

from __future__ import annotations

import csv
import gzip
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.pipeline import run_pipeline
from medtx.publish.snapshot import open_snapshot

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"
BROKEN = "train.specialty.mtsamples.bert_broken.s42"


def _mtsamples_subset(path: Path, n: int) -> Path:
    """A real MTSamples CSV with the first `n` notes of five frequent specialties (every split gets each)."""
    with gzip.open(DATA / "mtsamples" / "mtsamples.csv.gz", "rt", newline="") as handle:
        reader = csv.DictReader(handle)
        wanted = {"Surgery", "Cardiovascular / Pulmonary", "Orthopedic", "Radiology", "Neurology"}
        rows = [r for r in reader if r["medical_specialty"] in wanted][:n]
        fields = reader.fieldnames
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _config(folder: Path, body: str) -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(textwrap.dedent(body))
    return path


TINY = """
    datasets:
      - source: {demo}
      - source: synth:100
        notes: true
    mtsamples:
      source: mtsamples_small.csv
    seeds: [42]
    tasks:
      drug_rec:
        models:
          - {{model: most_frequent}}
          - {{model: logreg}}
          - {{model: oracle}}
          - {{model: gru, overrides: {{epochs: 1, d_model: 16, hidden: 16}}}}
      next_visit:
        datasets: [synth_100]
        models: [{{model: most_frequent}}]
      readmission:
        models: [{{model: logreg}}]
      readmission_notes:
        datasets: [synth_100]
        models: [{{model: majority}}]
      specialty:
        models:
          - {{model: majority}}
          - {{model: tfidf_logreg}}
          # forced failure that passes config validation: `bert` needs a checkpoint (bert_path), known only at run time
          - {{model: bert, name: bert_broken, overrides: {{epochs: 1}}}}
      faq:
        models: [{{model: retrieval}}]
    runner: {{torch_threads: 1}}
    """


def _task_states(flow_run_id) -> dict[str, str]:
    """Task run name -> Prefect state name ('Completed', 'Cached', 'Failed') of one flow run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name: r.state.name for r in runs}


def _last_pipeline_run(db: Path) -> str:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql("SELECT pipeline_run_id FROM ml.pipeline_runs ORDER BY started_at DESC LIMIT 1").fetchall()[0][0]


def _count(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return con.sql(sql).fetchall()[0][0]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory):
    """Isolated warehouse, caches and Prefect results for this module."""
    folder = tmp_path_factory.mktemp("pipeline")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("cache_dir", "results_dir", "models_dir"):
            mp.setenv(f"MEDTX_{name.upper()}", str(folder / name))
        yield folder


def test_pipeline_end_to_end_with_cache_refresh_and_snapshot(prefect_harness, workdir: Path) -> None:
    _mtsamples_subset(workdir / "mtsamples_small.csv", 150)
    config = _config(workdir, TINY.format(demo=DATA / "mimic3_demo"))
    db = workdir / "warehouse.duckdb"

    # 1. cold run: everything computed; the broken model fails, the flow ends failed after publishing
    cold = run_pipeline(config, db, return_state=True)
    assert cold.is_failed() and "bert_broken" in cold.message
    states = _task_states(cold.state_details.flow_run_id)
    assert states.pop(BROKEN) == "Failed"
    assert states.pop("publish") == "Completed"
    assert set(states.values()) == {"Completed"}, states
    assert len(states) == 29  # synth 1 + ingest 4 (one per dataset + oracle) + reference 1 + codes 2 + samples 7 + train 14 (+ broken)

    with duckdb.connect(str(db), read_only=True) as con:
        for table in ("raw.patients", "raw.admissions", "raw.diagnoses_icd", "raw.procedures_icd",
                      "raw.prescriptions", "raw.noteevents", "raw.mtsamples", "raw.synth_oracle_drug_rec",
                      "ref.ndc_atc3", "core.prescriptions_atc3", "samples.drug_rec", "samples.next_visit",
                      "samples.readmission", "samples.specialty", "samples.faq", "samples.splits", "samples.vocab",
                      "ml.metrics", "ml.predictions", "ml.pipeline_steps"):
            assert _count(con, f"SELECT count(*) FROM {table}") > 0, table
        assert _count(con, "SELECT count(DISTINCT dataset) FROM raw.admissions") == 2
        runs = con.sql("SELECT model, status, error FROM ml.runs ORDER BY model").fetchall()
        failed = [r for r in runs if r[1] == "failed"]
        assert len(failed) == 1 and failed[0][0] == "bert" and "bert_path" in failed[0][2]
        assert sum(r[1] == "completed" for r in runs) == 14
        assert con.sql("SELECT status, error FROM ml.pipeline_runs").fetchall() == [
            ("failed", f"1 step(s) failed: {BROKEN}")]

    # 2. `medtx pipeline` again: every step served from cache (the failed model is tried again: failures
    #    are not cached), and the command exits 1 because of it
    cli = CliRunner()
    result = cli.invoke(app, ["pipeline", "--config", str(config), "--db", str(db)])
    assert result.exit_code == 1 and "cached" in result.output
    rerun = _last_pipeline_run(db)
    # a reused step never reaches Prefect (the executor's cache): only the failed model and the publish ran
    assert _task_states(rerun) == {BROKEN: "Failed", "publish": "Completed"}
    with duckdb.connect(str(db), read_only=True) as con:
        steps = dict(con.execute("SELECT step, state FROM ml.pipeline_steps WHERE pipeline_run_id = ?",
                                 [rerun]).fetchall())
    assert steps.pop(BROKEN) == "failed" and len(steps) == 29 and set(steps.values()) == {"cached"}, steps

    # 3. run-task --refresh recomputes exactly the named step
    result = cli.invoke(app, ["run-task", "ingest.mimic3_demo", "--refresh",
                              "--config", str(config), "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert _task_states(_last_pipeline_run(db)) == {"ingest.mimic3_demo": "Completed",
                                                    "publish": "Completed"}
    listing = cli.invoke(app, ["run-task", "--config", str(config), "--db", str(db)])
    assert "train.drug_rec.mimic3_demo.logreg.s42" in listing.output

    # 4. an edited source redoes only what depends on it (re-ingesting identical rows above changed nothing)
    _mtsamples_subset(workdir / "mtsamples_small.csv", 140)
    edited = run_pipeline(config, db, return_state=True)
    states = _task_states(edited.state_details.flow_run_id)
    redone = {name for name, state in states.items() if state == "Completed"} - {"publish"}
    assert redone == {"ingest.mtsamples", "samples.specialty", "train.specialty.mtsamples.majority.s42",
                      "train.specialty.mtsamples.tfidf_logreg.s42"}, states
    assert states[BROKEN] == "Failed"

    # 5. the published snapshot stays readable (read-only) while a writer holds the live warehouse
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True);"
         " time.sleep(60)", str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with open_snapshot(db.with_name("warehouse.snapshot.duckdb")) as snap:
            assert _count(snap, "SELECT count(*) FROM raw.mtsamples") == 140
            assert _count(snap, "SELECT count(*) FROM ml.runs WHERE status = 'completed'") >= 14
    finally:
        holder.kill()
        holder.wait()


DASK = """
    datasets:
      - source: {demo}
      - source: {broken}                 # a source missing required tables: its steps fail or are skipped
    tasks:
      drug_rec:
        models: [{{model: most_frequent}}, {{model: logreg}}]
    runner: {{kind: dask, n_workers: 1, threads_per_worker: 1}}
    """


def test_pipeline_on_a_local_dask_cluster_isolates_a_broken_source(prefect_harness, workdir: Path) -> None:
    folder = workdir / "dask"
    broken = folder / "broken_cohort"
    broken.mkdir(parents=True)
    shutil.copy(DATA / "mimic3_demo" / "PATIENTS.csv.gz", broken)
    config = _config(folder, DASK.format(demo=DATA / "mimic3_demo", broken=broken))
    state = run_pipeline(config, folder / "warehouse.duckdb", return_state=True)
    assert state.is_failed()
    states = _task_states(state.state_details.flow_run_id)
    assert {n for n, s in states.items() if s == "Failed"} == {"ingest.broken_cohort"}  # one unit per dataset
    assert {n: s for n, s in states.items() if "broken" not in n and s != "Completed"} == {}
    with open_snapshot(folder / "warehouse.snapshot.duckdb") as snap:
        assert snap.sql("SELECT dataset, model, status FROM ml.runs ORDER BY model").fetchall() == [
            ("mimic3_demo", "logreg", "completed"), ("mimic3_demo", "most_frequent", "completed")]
        skipped = snap.sql("SELECT step FROM ml.pipeline_steps WHERE state = 'skipped' ORDER BY step").fetchall()
    assert [s[0] for s in skipped] == [
        "codes.broken_cohort", "samples.drug_rec.broken_cohort",
        "train.drug_rec.broken_cohort.logreg.s42", "train.drug_rec.broken_cohort.most_frequent.s42"]
