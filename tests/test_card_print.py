"""Rendered model cards in headless Chromium, printed at A4 width: a binary run (with every standard figure), a
multi-label run, a text run and a failed run, each laid out as Chromium prints it (print media, a 794-pixel
page) must keep every table inside the page (no column lost on paper). Saves docs/screenshots/card_*.png when
MEDTX_SCREENSHOTS=1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from medtx.store.db import connect
from tests.conftest import REPO_ROOT
from tests.test_trust import _cohort, _demographics, _insert, _record, _val

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(shutil.which("chromedriver") is None, reason="needs chromium + chromedriver"),
]
KINDS = ("binary", "multilabel", "text", "failed")


def _multilabel(con, c: dict, run_id: str = "multilabel", n_labels: int = 8) -> None:
    from medtx.training import records

    labels = [f"D{j:02d}" for j in range(n_labels)]
    rng = np.random.default_rng(1)
    n = len(c["hadm"])
    p = rng.beta(1, 4, (n, n_labels))
    y = rng.random((n, n_labels)) < p
    records.start_run(con, run_id, task="next_visit", model="transformer", dataset="sim", seed=0, config={})
    records.write_predictions(con, run_id, pl.DataFrame({
        "sample_id": np.repeat(c["hadm"].astype(str), n_labels), "subject_id": np.repeat(c["subj"], n_labels),
        "hadm_id": np.repeat(c["hadm"], n_labels), "label": labels * n, "prob": p.ravel(), "y_true": y.ravel(),
        "predicted": p.ravel() >= 0.3}))
    records.finish_run(con, run_id)


def _text(con, run_id: str = "text", n: int = 90) -> None:
    """A specialty run: 90 test notes in 45 text groups, 3 classes."""
    from medtx.training import records

    classes = ["Cardiology", "Neurology", "Orthopedic"]
    rng = np.random.default_rng(2)
    truth = rng.integers(0, 3, n)
    _insert(con, "samples.specialty", pl.DataFrame({
        "note_id": np.arange(n), "text": ["note"] * n, "label": [classes[k] for k in truth],
        "group_id": np.arange(n) // 2, "split": ["test"] * n, "conflicting": [False] * n}))
    logits = rng.normal(0, 1, (n, 3))
    logits[np.arange(n), truth] += 1.5
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    records.start_run(con, run_id, task="specialty", model="tfidf_logreg", dataset="mtsamples", seed=0, config={})
    records.write_metrics(con, run_id, "test", [("accuracy", "none", 0.5, None, None),
                                                ("macro_f1", "none", 0.5, None, None)])
    records.write_predictions(con, run_id, pl.DataFrame({
        "sample_id": np.repeat(np.arange(n).astype(str), 3), "label": classes * n, "prob": p.ravel(),
        "y_true": (np.arange(3)[None, :] == truth[:, None]).ravel(),
        "predicted": (np.arange(3)[None, :] == p.argmax(axis=1)[:, None]).ravel()}))
    records.finish_run(con, run_id)


@pytest.fixture(scope="module")
def cards(tmp_path_factory) -> dict[str, Path]:
    from medtx.evaluation.card import render
    from medtx.training import records

    root = tmp_path_factory.mktemp("cards")
    db = root / "warehouse.duckdb"
    c = _cohort(400, seed=3)
    con = connect(db)
    try:
        _demographics(con, c)
        _record(con, "binary", "logreg", c, c["prob"], _val(6), val_auprc=0.6)
        _multilabel(con, c)
        _text(con)
        records.start_run(con, "failed", task="readmission", model="gru", dataset="sim", seed=0, config={})
        records.fail_run(con, "failed", "CUDA out of memory while training epoch 3")
        pages = {}
        for kind in KINDS:
            pages[kind] = root / f"{kind}.html"
            pages[kind].write_text(render(con, kind)[0])
    finally:
        con.close()
    return pages


@pytest.fixture(scope="module")
def driver():
    from dashboard.screenshots import chromium

    d = chromium()
    yield d
    d.quit()


def _shoot(driver, name: str, section: str | None = None) -> None:
    if os.environ.get("MEDTX_SCREENSHOTS") != "1":
        return
    if section is not None:
        driver.execute_script(f"document.getElementById('{section}').scrollIntoView()")
    path = REPO_ROOT / "docs" / "screenshots" / f"{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size < 400_000  # committed: keep them small


def test_cards_print_at_a4_width_without_losing_a_column(cards: dict[str, Path], driver):
    from dashboard.screenshots import OVERFLOWING_TABLES, print_view

    print_view(driver)
    for kind in KINDS:
        driver.get(cards[kind].as_uri())
        title = driver.execute_script("return document.querySelector('h1').innerText")
        assert (kind == "failed") == title.startswith("FAILED"), title
        assert driver.execute_script(OVERFLOWING_TABLES) == [], kind
        assert driver.execute_script("return document.documentElement.scrollWidth") <= 794, kind
        _shoot(driver, f"card_{kind}", "headline" if kind == "text" else None)  # below the study table: its figures
    driver.get(cards["binary"].as_uri())
    assert driver.execute_script("return document.querySelectorAll('#standard-figures svg').length") >= 6
    _shoot(driver, "card_binary_figures", "standard-figures")
    # the check can fail: the same card without its style sheet loses columns at A4 width
    page = cards["binary"].read_text()
    bare = cards["binary"].with_name("bare.html")
    bare.write_text(page.replace("<style>", "<style>td{white-space:nowrap}", 1))
    driver.get(bare.as_uri())
    assert driver.execute_script(OVERFLOWING_TABLES)
