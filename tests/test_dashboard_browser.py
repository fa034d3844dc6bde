"""The dashboard in headless Chromium (dash_duo) against a real published warehouse.

Every page renders real data without browser console errors; the patient explorer's selectors redraw the
attention heatmap; the leaderboard sorts; a snapshot published while the app runs shows up by itself.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from dashboard import create_app
from tests.fixtures_dashboard import DATASET, real_warehouse

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(shutil.which("chromedriver") is None, reason="needs chromium + chromedriver"),
]

PAGES = (
    ("/", "#cohort-card .stat-value"),
    ("/leaderboard", "#leaderboard-grid .ag-row"),
    ("/run", "#run-summary"),
    ("/patient", "#attention-heatmap .heatmaplayer"),
    ("/notes", "#note-highlight .tok"),
)


@pytest.fixture(autouse=True)
def _headless(request):
    """No display on CI machines: run Chromium headless without needing `--headless` on the command line."""
    request.config.option.headless = True


@pytest.fixture(scope="module")
def snapshot() -> Path:
    return real_warehouse()[1]


@pytest.fixture
def live(tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the real warehouse and its snapshot, for the test that writes and publishes."""
    from medtx.publish.snapshot import publish_snapshot

    db, _ = real_warehouse()
    live_db = tmp_path / "warehouse.duckdb"
    shutil.copy(db, live_db)
    return live_db, publish_snapshot(live_db, tmp_path / "warehouse.snapshot.duckdb").path


def _severe(logs: list[dict]) -> list[dict]:
    return [entry for entry in logs if entry.get("level") == "SEVERE"]


def _choose(dash_duo, dropdown_id: str, label: str) -> None:
    """Open a dcc.Dropdown (Dash 4 markup) and click the option with this label, as a user would."""
    driver = dash_duo.driver
    box = dash_duo.find_element(f"#{dropdown_id}")
    # JS clicks: a spinner overlay or the page layout must not make the test flaky (no hit-testing).
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click()", box)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        options = [o for o in driver.find_elements(By.CSS_SELECTOR, "[role=option]") if o.text.strip() == label]
        if options:
            driver.execute_script("arguments[0].click()", options[0])
            return
        time.sleep(0.2)
    raise AssertionError(f"{dropdown_id}: no option {label!r}")


def _heatmap_title(dash_duo) -> str:
    return dash_duo.driver.execute_script(
        "const t = document.querySelector('#attention-heatmap .gtitle'); return t ? t.textContent : null;")


def test_every_page_renders_real_data_without_console_errors(dash_duo, snapshot):
    dash_duo.start_server(create_app(snapshot))
    for path, selector in PAGES:
        dash_duo.driver.get(dash_duo.server_url + path)
        dash_duo.wait_for_element(selector, timeout=30)
        assert _severe(dash_duo.get_logs()) == [], path
    dash_duo.driver.get(dash_duo.server_url + "/")
    dash_duo.wait_for_contains_text("#cohort-card", "100", timeout=20)  # 100 demo patients
    dash_duo.wait_for_contains_text("#pipeline-status", "completed", timeout=20)
    dash_duo.wait_for_contains_text("#plausibility-card", "No plausibility findings", timeout=20)  # issue 34


def test_patient_explorer_selectors_redraw_the_heatmap(dash_duo, snapshot):
    dash_duo.start_server(create_app(snapshot))
    dash_duo.driver.get(dash_duo.server_url + "/patient")
    dash_duo.wait_for_element("#attention-heatmap .heatmaplayer", timeout=30)
    assert _heatmap_title(dash_duo) == "layer 1, mean of heads"
    _choose(dash_duo, "pt-head", "head 0")
    dash_duo.wait_for_text_to_equal("#attention-heatmap .gtitle", "layer 1, head 0", timeout=20)
    _choose(dash_duo, "pt-layer", "layer 0")
    dash_duo.wait_for_text_to_equal("#attention-heatmap .gtitle", "layer 0, head 0", timeout=20)
    # The model view draws one panel per (layer, head): 2 layers x 2 heads in the test model.
    model_view = dash_duo.find_element("#pt-view input[value='model']")
    dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click()", model_view)
    dash_duo.wait_for_element("#attention-model-view .heatmaplayer", timeout=20)
    panels = dash_duo.driver.execute_script(
        "return document.querySelectorAll('#attention-model-view .heatmaplayer .hm').length")
    assert panels == 4
    assert dash_duo.find_element("#history-table").text  # visit history with ICD-9 descriptions
    assert _severe(dash_duo.get_logs()) == []


def _click(dash_duo, element, timeout: float = 10) -> None:
    """A real mouse click, as a user makes it, once the element is in view and nothing lies over it.

    Bootstrap sets `scroll-behavior: smooth`, so a plain scrollIntoView is still moving the page when the click
    lands; and a panel that finishes loading above the element can push it under another one. Scroll instantly,
    then retry while another element would receive the click (CI failed once on exactly that)."""
    from selenium.common.exceptions import ElementClickInterceptedException

    deadline = time.monotonic() + timeout
    while True:
        dash_duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'});", element)
        try:
            element.click()
            return
        except ElementClickInterceptedException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_leaderboard_sorts_by_a_clicked_column(dash_duo, snapshot):
    dash_duo.start_server(create_app(snapshot))
    dash_duo.driver.get(dash_duo.server_url + "/leaderboard")
    dash_duo.wait_for_element("#leaderboard-grid .ag-row", timeout=30)

    def models() -> list[str]:
        cells = dash_duo.driver.find_elements(By.CSS_SELECTOR, "#leaderboard-grid .ag-pinned-left-cols-container [col-id='model']")
        return [c.text for c in sorted(cells, key=lambda c: c.location["y"])]

    def wait_for_order(expected: list[str]) -> None:
        deadline = time.monotonic() + 10
        while models() != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert models() == expected

    header = dash_duo.find_element("#leaderboard-grid .ag-header-cell[col-id='model'] .ag-header-cell-label")
    _click(dash_duo, header)
    wait_for_order(["logreg", "transformer"])
    _click(dash_duo, header)
    wait_for_order(["transformer", "logreg"])
    assert _severe(dash_duo.get_logs()) == []


def test_leaderboard_shows_intervals_patients_and_a_verdict_badge(dash_duo, snapshot):
    """Issue 14: `0.780 [0.771, 0.789]` cells, the n test patients column, coloured verdict badges (the demo split
    is too small: the reference baseline and a `too small to compare` badge), the too-small alert, the forest plot."""
    import re

    dash_duo.start_server(create_app(snapshot))
    dash_duo.driver.get(dash_duo.server_url + f"/leaderboard?task=drug_rec&dataset={DATASET}")
    dash_duo.wait_for_element("#leaderboard-grid .ag-row", timeout=30)
    dash_duo.wait_for_element("#lb-too-small", timeout=30)
    dash_duo.wait_for_element("#lb-forest-graph .scatterlayer .point", timeout=30)
    grid = dash_duo.find_element("#leaderboard-grid")
    cells = grid.find_elements(By.CSS_SELECTOR, ".ag-center-cols-container [col-id='m_pr_auc_samples']")
    assert cells and all(re.fullmatch(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", c.text) for c in cells), \
        [c.text for c in cells]
    patients = grid.find_elements(By.CSS_SELECTOR, ".ag-center-cols-container [col-id='n_test_patients']")
    assert len(patients) == len(cells) and all(int(p.text) >= 1 for p in patients)
    badges = {c[len("verdict-"):]: b.text for b in grid.find_elements(By.CSS_SELECTOR, ".verdict-badge.ag-cell")
              for c in b.get_attribute("class").split() if c.startswith("verdict-") and c != "verdict-badge"}
    assert badges.get("too_small") == "too small to compare" and badges.get("reference") == "reference baseline"
    color = grid.find_element(By.CSS_SELECTOR, ".verdict-too_small").value_of_css_property("background-color")
    assert color.replace(" ", "") in ("rgba(255,243,205,1)", "rgb(255,243,205)")
    assert "too small to compare" in dash_duo.find_element("#lb-too-small").text.lower()
    assert _severe(dash_duo.get_logs()) == []


def test_a_snapshot_published_while_serving_appears(dash_duo, live):
    from medtx.publish.snapshot import publish_snapshot
    from medtx.pipeline.steps import train_in_process
    from medtx.tasks import get_task

    live_db, snapshot = live
    dash_duo.start_server(create_app(snapshot))
    dash_duo.driver.get(dash_duo.server_url + "/leaderboard?task=drug_rec&dataset=" + DATASET)
    dash_duo.wait_for_element("#leaderboard-grid .ag-row", timeout=30)
    assert "most_frequent" not in dash_duo.find_element("#leaderboard-grid").text
    # A flow writes the live warehouse while the app keeps serving the old snapshot, then publishes.
    train_in_process(live_db, get_task("drug_rec"), "most_frequent", 0, dataset=DATASET)
    dash_duo.wait_for_element("#leaderboard-grid .ag-row")  # still serving
    publish_snapshot(live_db, snapshot)
    dash_duo.wait_for_contains_text("#leaderboard-grid", "most_frequent", timeout=30)
    assert _severe(dash_duo.get_logs()) == []


def test_invalid_url_ids_show_a_message_not_a_traceback(dash_duo, snapshot):
    dash_duo.start_server(create_app(snapshot))
    dash_duo.driver.get(dash_duo.server_url + "/patient?run_id=%27%3BDROP%20TABLE%20x&subject_id=abc")
    dash_duo.wait_for_contains_text(".invalid-parameter", "not a valid run id", timeout=20)
    dash_duo.wait_for_contains_text("#page", "subject_id 'abc' is not a positive integer id", timeout=20)
    assert "Traceback" not in dash_duo.find_element("#page").text
    assert _severe(dash_duo.get_logs()) == []
