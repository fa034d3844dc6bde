"""The run page's trust views in headless Chromium: the subgroup forest plot and gap, the reliability
curve before/after recalibration, the operating-point table with its threshold control, and the model card link,
against a real published warehouse (a synthetic cohort, readmission, logreg + lightgbm). Saves the screenshots
docs/screenshots/run_trust*.png when MEDTX_SCREENSHOTS=1."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from dashboard import create_app
from tests.conftest import DATA, REPO_ROOT

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(shutil.which("chromedriver") is None, reason="needs chromium + chromedriver"),
]


@pytest.fixture(autouse=True)
def _headless(request):
    request.config.option.headless = True


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    from medtx.codes import map_codes
    from medtx.ingest import ingest_mimic3
    from medtx.publish.snapshot import publish_snapshot
    from medtx.tasks.build import build_samples
    from medtx.store.db import connect
    from medtx.synth import generate_mimic3
    from medtx.synth.shift import RiskShift
    from medtx.pipeline.steps import train_in_process
    from medtx.tasks import get_task

    root = tmp_path_factory.mktemp("trust")
    generate_mimic3(root / "synth", 2500, seed=5, risk_shift=RiskShift.parse("sex=female:1.5"))
    db = root / "warehouse.duckdb"
    ingest_mimic3(db, root / "synth", "synth_trust", root / "cache")
    con = connect(db)
    try:
        map_codes(con, DATA, ["synth_trust"])
        build_samples(con, DATA, ["readmission"], ["synth_trust"])
    finally:
        con.close()
    runs = {m: train_in_process(db, get_task("readmission"), m, dataset="synth_trust", models_dir=root / "models")
            for m in ("logreg", "lightgbm")}
    return publish_snapshot(db, root / "warehouse.snapshot.duckdb").path, runs


def _severe(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e.get("level") == "SEVERE"]


def _shoot(dash_duo, name: str) -> None:
    if os.environ.get("MEDTX_SCREENSHOTS") == "1":
        driver = dash_duo.driver
        driver.set_window_size(1400, driver.execute_script("return document.body.scrollHeight") + 100)
        driver.save_screenshot(str(REPO_ROOT / "docs" / "screenshots" / f"{name}.png"))


def test_the_run_page_shows_subgroups_calibration_and_operating_points(dash_duo, published):
    snapshot, runs = published
    dash_duo.start_server(create_app(snapshot))
    run_id = runs["lightgbm"]
    dash_duo.driver.set_window_size(1400, 1200)
    dash_duo.driver.get(f"{dash_duo.server_url}/run?run_id={run_id}")
    dash_duo.wait_for_element("#subgroup-forest .scatterlayer .point", timeout=60)
    n_points = len(dash_duo.driver.find_elements(By.CSS_SELECTOR, "#subgroup-forest .scatterlayer .point"))
    assert n_points >= 6  # sex x2, age bands, insurance, admission types ... not too small
    dash_duo.wait_for_contains_text("#subgroup-gap", "Largest auroc gap", timeout=20)
    dash_duo.wait_for_contains_text("#subgroup-gap", "Largest citl gap", timeout=20)
    names = dash_duo.driver.execute_script(
        "return Array.from(document.querySelectorAll('#reliability-graph .legendtext')).map(e => e.textContent)")
    assert {"before (model)", "after: platt", "after: isotonic"} <= set(names)
    dash_duo.wait_for_element("#calibration-grid .ag-row", timeout=20)
    targets = dash_duo.driver.execute_script(
        "return Array.from(document.querySelectorAll('#operating-grid .ag-row [col-id=target]'))"
        ".map(e => e.textContent)")
    assert {"sensitivity_0.80", "sensitivity_0.90", "top_10pct"} <= set(targets)
    dash_duo.wait_for_contains_text("#threshold-figures", "threshold 0.50: sensitivity", timeout=20)
    _shoot(dash_duo, "run_trust")
    # the standard figures (the model card's SVG) and the decision curve: both series cut alike, a 0 tick
    dash_duo.wait_for_element("#run-standard-figures #plp-roc img", timeout=30)
    assert {"plp-pr", "plp-distribution", "plp-smoothed-calibration", "plp-age-sex"} <= set(
        dash_duo.driver.execute_script("return Array.from(document.querySelectorAll('#run-standard-figures "
                                       "[id^=plp-]')).map(e => e.id)"))
    dash_duo.wait_for_element("#decision-graph .ytick", timeout=30)
    ticks = dash_duo.driver.execute_script(
        "return Array.from(document.querySelectorAll('#decision-graph .ytick text')).map(e => e.textContent)")
    assert "0" in ticks, ticks
    # the threshold control: two steps down redraws the test figures at 0.48
    handle = dash_duo.find_element("#threshold-slider [role=slider]")
    dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].focus()", handle)
    handle.send_keys(Keys.ARROW_LEFT, Keys.ARROW_LEFT)
    dash_duo.wait_for_contains_text("#threshold-figures", "threshold 0.48: sensitivity", timeout=20)
    assert _severe(dash_duo.get_logs()) == []
    href = dash_duo.find_element("#card-link").get_attribute("href")
    assert href.endswith(f"/card/{run_id}")
    dash_duo.driver.get(href)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not dash_duo.driver.find_elements(By.CSS_SELECTOR, "section#limitations"):
        time.sleep(0.2)
    ids = dash_duo.driver.execute_script("return Array.from(document.querySelectorAll('section')).map(s => s.id)")
    from medtx.evaluation.card import SECTIONS

    assert ids == list(SECTIONS)
    # forest, reliability, decision curve; ROC, PR, distribution, smoothed calibration, age x sex
    assert len(dash_duo.driver.find_elements(By.CSS_SELECTOR, "svg")) >= 8
    _shoot(dash_duo, "model_card")


def test_the_card_route_refuses_an_unknown_or_invalid_run_in_one_line(published):
    snapshot, runs = published
    client = create_app(snapshot).server.test_client()
    bad = client.get("/card/readmission.nope.x.s0.00000000")
    assert bad.status_code == 404 and b"not in this warehouse" in bad.data and bad.data.count(b"\n") == 0
    invalid = client.get("/card/%3Cscript%3E")
    assert invalid.status_code == 400 and b"not a valid run id" in invalid.data
    assert invalid.headers["Content-Type"].startswith("text/plain")  # the echoed id is not markup
    good = client.get(f"/card/{runs['logreg']}")
    from medtx.evaluation.card import SECTIONS

    assert good.status_code == 200 and good.data.count(b"<section id=") == len(SECTIONS)
