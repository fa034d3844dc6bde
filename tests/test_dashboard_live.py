"""The overview while a pipeline runs: its live progress over real published snapshots, in headless Chromium,
and the overview's formatting fixes (percentages, every unmapped-drug label).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dashboard import create_app
from medtx.pipeline import runs
from medtx.pipeline import progress
from medtx.pipeline.kinds import kind_named
from medtx.pipeline.plan import Step
from medtx.publish.snapshot import publish_snapshot
from tests.fixtures_dashboard import DATASET, real_warehouse

RUN = "live-run-1"
PLAN = [("ingest.mimic3_demo.patients", "ingest"), ("samples.drug_rec.mimic3_demo", "samples"),
        ("train.drug_rec.mimic3_demo.logreg.s42", "train"), ("train.drug_rec.mimic3_demo.gru.s42", "train")]


@pytest.fixture(autouse=True)
def _headless(request):
    """No display on CI machines: Chromium headless (set before dash_duo starts the browser)."""
    request.config.option.headless = True


@pytest.fixture
def live(tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the real warehouse with a pipeline run in progress: step 1 done, step 2 running."""
    db, _ = real_warehouse()
    live_db = tmp_path / "warehouse.duckdb"
    shutil.copy(db, live_db)
    runs.start_pipeline_run(live_db, RUN, {"purpose": "live progress test"})
    progress.write_plan(live_db, RUN, PLAN)
    _finish(live_db, 0)
    progress.mark_started(live_db, RUN, PLAN[1][0])
    return live_db, publish_snapshot(live_db, tmp_path / "warehouse.snapshot.duckdb").path


def _finish(db: Path, i: int, state: str = "completed") -> None:
    name, kind = PLAN[i]
    runs.record_step(db, RUN, runs.StepOutcome(Step(name, kind_named(kind), {}), state, seconds=1.0,
                                               error="boom" if state == "failed" else None))


def test_progress_counts_and_eta_from_previous_durations(live) -> None:
    from datetime import datetime, timedelta

    from dashboard import queries

    db, snapshot = live
    plan = queries.pipeline_progress(snapshot, RUN)
    steps = [progress.StepProgress(r["step"], r["kind"], progress.step_status(r["state"], r["started_at"]),
                                   r["expected_seconds"], r["started_at"]) for r in plan.iter_rows(named=True)]
    assert progress.counts(steps) == {"done": 1, "running": 1, "queued": 2, "failed": 0}
    assert progress.remaining_seconds(steps, datetime.now()) is None  # no earlier run: no ETA, not a made-up one
    # a second run of the same plan expects what the first took
    runs.finish_pipeline_run(db, RUN, [])
    planned = progress.write_plan(db, "live-run-2", PLAN)
    assert [p.expected_seconds for p in planned] == [1.0, None, None, None]
    later = [progress.StepProgress("a", "train", "running", 10.0, datetime.now() - timedelta(seconds=4)),
             progress.StepProgress("b", "train", "queued", 6.0), progress.StepProgress("c", "train", "queued")]
    assert progress.remaining_seconds(later, datetime.now()) == pytest.approx(6 + 6 + 8, abs=0.2)


def test_overview_formats_percentages_and_shows_every_unmapped_label(live) -> None:
    from dashboard.pages import overview

    _, snapshot = live
    coverage = overview._coverage(snapshot, DATASET).children[1]
    pct = [c for c in coverage.columnDefs if c["field"] == "pct_rows"]
    assert pct and "d3.format('.1%')" in pct[0]["valueFormatter"]["function"]
    assert all(isinstance(r["pct_rows"], float) for r in coverage.rowData)  # still numbers: they sort
    graph = overview._unmapped(snapshot, DATASET)
    labels = graph.figure["data"][0]["y"]
    assert len(labels) > 8 and graph.figure["layout"]["yaxis"]["dtick"] == 1
    assert graph.figure["layout"]["height"] >= 22 * len(labels)


@pytest.mark.browser
@pytest.mark.skipif(shutil.which("chromedriver") is None, reason="needs chromium + chromedriver")
def test_overview_shows_the_running_pipeline_change_between_two_loads(dash_duo, live) -> None:
    db, snapshot = live
    dash_duo.start_server(create_app(snapshot))
    dash_duo.wait_for_contains_text("#pipeline-progress-text", "1 done · 1 running · 2 queued · 0 failed of 4",
                                    timeout=30)
    dash_duo.wait_for_contains_text("#pipeline-progress", "running: samples.drug_rec.mimic3_demo", timeout=10)
    first = dash_duo.find_element("#pipeline-progress-text").text

    # the pipeline moves on (one step done, one failed, the last one running) and publishes
    _finish(db, 1)
    _finish(db, 2, "failed")
    progress.mark_started(db, RUN, PLAN[3][0])
    publish_snapshot(db, snapshot)
    dash_duo.driver.refresh()  # a second load
    dash_duo.wait_for_contains_text("#pipeline-progress-text", "2 done · 1 running · 0 queued · 1 failed of 4",
                                    timeout=30)
    assert dash_duo.find_element("#pipeline-progress-text").text != first
    dash_duo.wait_for_contains_text("#pipeline-progress", "running: train.drug_rec.mimic3_demo.gru.s42", timeout=10)
    assert not [e for e in dash_duo.get_logs() if e.get("level") == "SEVERE"]
