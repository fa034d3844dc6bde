"""`medtx pipeline` as a newcomer runs it, in a real subprocess off a terminal, on a tiny real config.

While it runs in the background, a snapshot with cohort rows is published before the training layer ends
(the dashboard has data to show); the console gets one plain line per finished step and no log noise (no
`httpx` request lines, no per-epoch lines), which all go to the log file it names at the start and the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from tests.fixtures_prefect import migrated_prefect_home

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "data"

CONFIG = """
    datasets:
      - source: {demo}
    seeds: [42]
    tasks:
      drug_rec:
        models:
          - {{model: most_frequent}}
          - {{model: logreg}}
          - {{model: gru, overrides: {{epochs: 2, d_model: 16, hidden: 16}}}}
          - {{model: transformer, name: transformer_broken, overrides: {{epochs: 1, copy_feature: no_such_feature}}}}
    runner: {{torch_threads: 1}}
    """


def _first_snapshot(snapshot: Path, proc: subprocess.Popen, timeout_s: float = 240) -> tuple[int, str, int, int]:
    """(patients, pipeline status, train steps finished, train steps planned) of the first published snapshot."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if snapshot.exists():
            with duckdb.connect(str(snapshot), read_only=True) as con:
                patients = con.sql("SELECT count(*) FROM raw.patients").fetchall()[0][0]
                status = con.sql("SELECT status FROM ml.pipeline_runs ORDER BY started_at DESC LIMIT 1").fetchall()[0][0]
                trained = con.sql("SELECT count(*) FROM ml.pipeline_steps WHERE kind = 'train'").fetchall()[0][0]
                planned = con.sql("SELECT count(*) FROM ml.pipeline_plan WHERE kind = 'train'").fetchall()[0][0]
            return patients, status, trained, planned
        time.sleep(0.2)
    pytest.fail("no snapshot was published while the pipeline ran")


def test_pipeline_publishes_as_data_lands_and_prints_one_line_per_step(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(textwrap.dedent(CONFIG.format(demo=DATA / "mimic3_demo")))
    db = tmp_path / "var" / "warehouse.duckdb"
    env = os.environ | {"PYTHONPATH": str(REPO), "PREFECT_HOME": str(migrated_prefect_home(tmp_path / "prefect")),
                        "MEDTX_CACHE_DIR": str(tmp_path / "cache"), "MEDTX_MODELS_DIR": str(tmp_path / "models"),
                        "MEDTX_RESULTS_DIR": str(tmp_path / "results")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from flows.cli import main; main()", "pipeline", "--config", str(config),
         "--db", str(db)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        patients, status, trained, planned = _first_snapshot(db.with_name("warehouse.snapshot.duckdb"), proc)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert patients > 0 and status == "running" and planned == 4 and trained < planned, (patients, status, trained)

    # the broken model fails: exit 1, failure named; everything else completed
    assert proc.returncode == 1, output
    with duckdb.connect(str(db), read_only=True) as con:
        steps = dict(con.sql("SELECT step, state FROM ml.pipeline_steps").fetchall())
    assert steps.pop("train.drug_rec.mimic3_demo.transformer_broken.s42") == "failed"
    assert set(steps.values()) == {"completed"}

    lines = output.splitlines()
    assert not [line for line in lines if "httpx" in line or "HTTP Request" in line or "epoch" in line.lower()], output
    progress = [line for line in lines if re.match(r"\[\s*\d+/\d+\] ", line)]
    assert len(progress) == len(steps) + 1, output  # one line per step
    for name in [*steps, "train.drug_rec.mimic3_demo.transformer_broken.s42"]:
        assert sum(name in line for line in progress) == 1, (name, output)
    assert re.search(r"\] failed\s+train\.drug_rec\.mimic3_demo\.transformer_broken\.s42 .*\S", output)
    assert len(lines) <= len(progress) + 4, output  # start line, end line, failure line: nothing else

    log_files = re.findall(r"log: (\S+\.log)", output)
    assert len(log_files) == 2 and log_files[0] == log_files[1], output  # named at the start and the end
    log_text = Path(log_files[0]).read_text()
    assert "HTTP Request" in log_text and "epoch" in log_text.lower()
    assert "dashboard: http://127.0.0.1:8050/" in output
