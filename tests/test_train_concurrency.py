"""Use the machine: the thread rule (medtx.resources) and two trainings at once under the thread runner."""

from __future__ import annotations

import textwrap
from pathlib import Path

import duckdb
import pytest

from medtx.pipeline_config import RunnerConfig
from medtx.resources import (auto_train_concurrency, available_cpus, cgroup_cpu_limit, threads_per_training)

DATA = Path(__file__).resolve().parent.parent / "data"


def test_cgroup_v2_quota_caps_cores(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    assert available_cpus(tmp_path) <= 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v1_quota_and_unreadable(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None  # nothing there: unlimited
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert cgroup_cpu_limit(tmp_path) == 1.0
    assert available_cpus(tmp_path) == 1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert cgroup_cpu_limit(tmp_path) is None


def test_thread_rule_never_oversubscribes() -> None:
    for cpus in (1, 2, 3, 8, 16):
        for concurrent in (1, 2, 3, 8):
            threads = threads_per_training(concurrent, cpus)
            assert threads >= 1
            assert threads * concurrent <= max(cpus, concurrent)
    assert threads_per_training(1, 8) == 8  # `medtx train` alone uses the whole machine
    assert auto_train_concurrency(cpus=2) == 2
    assert auto_train_concurrency(cpus=16, threads=4) == 4
    assert auto_train_concurrency(cpus=16, gpus=2) == 2  # one training per GPU


def test_runner_auto_resolves_from_the_machine() -> None:
    assert RunnerConfig().resolved(cpus=2) == (2, 1)
    assert RunnerConfig(train_concurrency=1).resolved(cpus=2) == (1, 2)
    assert RunnerConfig(torch_threads=2).resolved(cpus=4) == (2, 2)
    assert RunnerConfig(train_concurrency=3, torch_threads=None).resolved(cpus=2) == (3, None)
    assert RunnerConfig().resolved(cpus=16, gpus=2) == (2, 8)
    with pytest.raises(ValueError):
        RunnerConfig(train_concurrency=0)
    with pytest.raises(ValueError):
        RunnerConfig(torch_threads="many")


@pytest.mark.slow
def test_two_trainings_run_at_once_and_both_land(prefect_harness, tmp_path: Path, monkeypatch) -> None:
    from flows.pipeline import run_pipeline

    for name in ("cache_dir", "results_dir", "models_dir"):
        monkeypatch.setenv(f"MEDTX_{name.upper()}", str(tmp_path / name))
    config = tmp_path / "pipeline.yaml"
    config.write_text(textwrap.dedent(f"""
        datasets: [{{source: {DATA / 'mimic3_demo'}}}]
        seeds: [42]
        tasks:
          drug_rec:
            models:
              - {{model: gru, name: gru_a, overrides: {{epochs: 3, d_model: 16, hidden: 16}}}}
              - {{model: gru, name: gru_b, overrides: {{epochs: 3, d_model: 16, hidden: 16}}}}
        runner: {{train_concurrency: 2, torch_threads: 1}}
        """))
    db = tmp_path / "warehouse.duckdb"
    run_pipeline(config, db=db)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.sql("SELECT status, started_at, finished_at FROM ml.runs ORDER BY started_at").fetchall()
    assert [r[0] for r in rows] == ["completed", "completed"]
    (_, start_a, end_a), (_, start_b, _) = rows
    assert start_b < end_a, f"the second training started only after the first ended: {rows}"
    # Same config, same seed, side by side: the same model (each training has its own process, so its own
    # torch generator; tests/test_train_processes.py shows why threads cannot promise it).
    with duckdb.connect(str(db), read_only=True) as con:
        preds = con.sql("SELECT run_id, sample_id, label, prob FROM ml.predictions "
                        "ORDER BY sample_id, label").fetchall()
    by_run: dict[str, list] = {}
    for run_id, sample_id, label, prob in preds:
        by_run.setdefault(run_id, []).append((sample_id, label, prob))
    first, second = by_run.values()
    assert first and first == second
