"""Issue 44: changing `seeds` (or the split) on an existing warehouse trains and records runs that complete, and
the console's final line tells the runs' true state.

Before: `seeds: [42]` -> `[43]` redrew the patient split (the first training seed seeded it), the new runs were
compared with the seed-42 reference baseline on other test samples, the writer marked them `failed` while their
steps (and the console) said completed, and a rerun reused the failed runs as cached. Now the split has its own
seed (`split_seed`), a run is compared with a reference trained on its data, a run the writer fails fails its
step, and a step whose run is not completed is trained again. Real `medtx pipeline` subprocesses on the demo.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from tests.fixtures_prefect import migrated_prefect_home

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "data" / "mimic3_demo"

CONFIG = """
    datasets:
      - source: {demo}
    seeds: {seeds}
    {split}
    tasks:
      mortality:
        models:
          - {{model: logreg}}
          - {{model: gru, overrides: {{epochs: 2, d_model: 16, hidden: 16}}}}
    runner: {{torch_threads: 1}}
    """


def _pipeline(tmp_path: Path, seeds: list[int], split_seed: int | None = None) -> tuple[int, str, dict[str, str]]:
    """Run `medtx pipeline` on one warehouse; (exit status, console output, step -> state of this run)."""
    config = tmp_path / "tiny.yaml"
    split = "" if split_seed is None else f"split_seed: {split_seed}"
    config.write_text(textwrap.dedent(CONFIG.format(demo=DEMO, seeds=seeds, split=split)))
    env = os.environ | {"PYTHONPATH": str(REPO), "PREFECT_HOME": str(migrated_prefect_home(tmp_path / "prefect")),
                        "MEDTX_CACHE_DIR": str(tmp_path / "cache"), "MEDTX_MODELS_DIR": str(tmp_path / "models"),
                        "MEDTX_RESULTS_DIR": str(tmp_path / "results")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", "pipeline", "--config",
                           str(config), "--db", str(tmp_path / "warehouse.duckdb")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    run_id = re.findall(r"^pipeline run (\S+): ", output, re.M)[-1]
    with duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True) as con:
        steps = dict(con.execute("SELECT step, state FROM ml.pipeline_steps WHERE pipeline_run_id = ?",
                                 [run_id]).fetchall())
    return done.returncode, output, steps


def _runs(tmp_path: Path, seed: int) -> dict[str, tuple[str, str | None]]:
    """model -> (status, reference run's seed) of the latest runs of a training seed."""
    with duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True) as con:
        return {m: (s, ref) for m, s, ref in con.execute(
            """SELECT r.model, arg_max(r.status, r.started_at),
                      arg_max((SELECT max(c.reference_run_id) FROM ml.comparisons c WHERE c.run_id = r.run_id),
                              r.started_at)
               FROM ml.runs r WHERE r.seed = ? GROUP BY 1""", [seed]).fetchall()}


def _final_line_is_honest(code: int, output: str, steps: dict[str, str]) -> None:
    final = [line for line in output.splitlines() if line.startswith("pipeline run ")][-1]
    failed = sum(s == "failed" for s in steps.values())
    assert (code == 0) == (failed == 0), output
    assert final.split(": ")[1].startswith("Completed" if failed == 0 else "Failed"), output
    if failed:
        assert f"{failed} failed" in final, output


def test_a_change_of_seeds_or_split_seed_trains_runs_that_complete(tmp_path: Path) -> None:
    code, output, steps = _pipeline(tmp_path, [42])
    assert code == 0 and set(steps.values()) == {"completed"}, output
    _final_line_is_honest(code, output, steps)

    # seeds 42 -> 43: the split is the same (samples reused), the new runs complete
    code, output, steps = _pipeline(tmp_path, [43])
    _final_line_is_honest(code, output, steps)
    assert code == 0, output
    assert steps["samples.mortality.mimic3_demo"] == "cached", output
    assert steps["train.mortality.mimic3_demo.gru.s43"] == "completed", output
    runs = _runs(tmp_path, 43)
    assert runs["gru"][0] == "completed" and runs["logreg"][0] == "completed", runs  # before: both failed
    assert runs["gru"][1] is not None, runs  # compared with a reference

    # another split (split_seed 7): the samples are rebuilt, every run trained again completes, measured against a
    # reference trained on the same data (before: the old split's baseline, and the run failed)
    code, output, steps = _pipeline(tmp_path, [43], split_seed=7)
    _final_line_is_honest(code, output, steps)
    assert code == 0 and steps["samples.mortality.mimic3_demo"] == "completed", output
    runs = _runs(tmp_path, 43)
    assert runs["gru"][0] == "completed" and runs["logreg"][0] == "completed", runs
    with duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True) as con:
        latest = dict(con.execute("SELECT model, arg_max(run_id, started_at) FROM ml.runs WHERE seed = 43 "
                                  "GROUP BY 1").fetchall())
    assert runs["gru"][1] == latest["logreg"], (runs, latest)

    # a run an older medtx left `failed` behind a completed step is trained again, not reused as cached
    with duckdb.connect(str(tmp_path / "warehouse.duckdb")) as con:
        con.execute("UPDATE ml.runs SET status = 'failed', error = 'test intervals/comparisons: left by an older "
                    "medtx' WHERE run_id = ?", [latest["gru"]])
    code, output, steps = _pipeline(tmp_path, [43], split_seed=7)
    _final_line_is_honest(code, output, steps)
    assert code == 0 and steps["train.mortality.mimic3_demo.gru.s43"] == "completed", output
    assert steps["train.mortality.mimic3_demo.logreg.s43"] == "cached", output
    assert _runs(tmp_path, 43)["gru"][0] == "completed"
