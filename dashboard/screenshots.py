"""Headless-Chromium screenshots of every page (for docs/screenshots/ and visual checks).

    python -m dashboard.screenshots --db var/warehouse.duckdb --out docs/screenshots

Serves the app on a free loopback port in a thread, drives /usr/bin/chromium through selenium
(a test dependency: `pip install medtx[test]`), waits for each page's content, and saves one PNG per page.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Annotated

import typer

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# (file name, path + query, CSS selectors that all appear once the page has drawn its real content)
PAGES = (
    ("overview", "/", ("#cohort-card .stat-value", "#coverage-graph .barlayer")),
    ("leaderboard", "/leaderboard", ("#leaderboard-grid .ag-row",)),
    ("run_detail", "/run", ("#run-summary", "#calibration-graph .scatterlayer")),
    ("patient_explorer", "/patient", ("#prediction-graph .barlayer", "#attention-heatmap .heatmaplayer")),
    ("note_explorer", "/notes", ("#note-probs .barlayer", "#note-top-tokens .card")),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_in_thread(snapshot: Path, port: int) -> None:
    """Run the app with waitress on 127.0.0.1:port in a daemon thread."""
    from waitress import serve

    from dashboard import create_app

    app = create_app(snapshot)
    threading.Thread(target=serve, args=(app.server,), kwargs={"host": "127.0.0.1", "port": port, "threads": 4},
                     daemon=True).start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"dashboard did not start on port {port}")


def chromium(width: int = 1440, height: int = 1000):
    """A headless Chromium driven by the system chromedriver (never downloads a browser)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(driver, selector: str, timeout: float = 30.0) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, selector)))


def wait_idle(driver, timeout: float = 30.0) -> None:
    """Wait until no callback is pending. Dash shows `._dash-loading-callback` while any callback runs, and a
    dcc.Loading hides its children (visibility: hidden) meanwhile: a capture then shows blank graphs even
    though they are in the DOM (where a presence wait already finds them)."""
    deadline = time.monotonic() + timeout
    while driver.execute_script("return document.querySelector('._dash-loading-callback') !== null"):
        if time.monotonic() > deadline:
            raise TimeoutError("callbacks still pending after the wait")
        time.sleep(0.2)


A4_WIDTH = 794  # CSS pixels of an A4 page (210 mm at 96 dpi)


def print_view(driver, width: int = A4_WIDTH, height: int = 1123) -> None:
    """Lay the page out as Chromium prints it: print media, an A4-wide viewport."""
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})


# Every table wider than the page, or sticking out past its right edge: a column lost on paper.
OVERFLOWING_TABLES = """
const page = document.documentElement.clientWidth;
return Array.from(document.querySelectorAll('table')).filter(
    t => t.scrollWidth > t.clientWidth + 1 || t.getBoundingClientRect().right > page + 1
).map(t => (t.closest('section') || {}).id + ': ' + t.rows[0].innerText.slice(0, 60));
"""


def full_height(driver) -> int:
    return int(driver.execute_script("return document.documentElement.scrollHeight"))


def main(
    db: Annotated[Path, typer.Option(help="Live warehouse or snapshot file.")],
    out: Annotated[Path, typer.Option(help="Folder for the PNG files.")] = Path("docs/screenshots"),
    width: int = 1440,
) -> None:
    from dashboard import resolve_snapshot

    snapshot = resolve_snapshot(db)
    port = free_port()
    serve_in_thread(snapshot, port)
    out.mkdir(parents=True, exist_ok=True)
    driver = chromium(width)
    try:
        for name, path, selectors in PAGES:
            driver.set_window_size(width, 1000)
            driver.get(f"http://127.0.0.1:{port}{path}")
            for selector in selectors:
                wait_for(driver, selector, timeout=60)
            wait_idle(driver, timeout=60)
            time.sleep(1.0)  # let Plotly finish drawing
            driver.set_window_size(width, min(full_height(driver) + 40, 4000))
            time.sleep(1.0)  # the resize redraws responsive graphs
            wait_idle(driver, timeout=60)
            driver.save_screenshot(str(out / f"{name}.png"))
            typer.echo(f"saved {out / f'{name}.png'}")
    finally:
        driver.quit()


if __name__ == "__main__":
    typer.run(main)
