"""Use the machine: the thread rule (medtx.runtime.resources) and two trainings at once under the thread runner."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from medtx.pipeline.config import RunnerConfig
from medtx.runtime.resources import (TRAININGS_DIR_ENV, auto_train_concurrency, available_cpus, cgroup_cpu_limit, fair_threads,
                             running_trainings, threads_per_training, training_slot)

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


HOLD_SLOT = """
import sys, time
from pathlib import Path
from medtx.runtime.resources import training_slot
with training_slot(Path(sys.argv[1])) as held:
    print("held" if held else "no registry", flush=True)
    time.sleep(600)
"""


def _other_training(folder: Path) -> subprocess.Popen:
    """Another process that holds a training slot (as a second `medtx train` would) until it is killed."""
    child = subprocess.Popen([sys.executable, "-c", HOLD_SLOT, str(folder)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_trainings_on_the_machine_are_counted_and_a_killed_one_stops_counting(tmp_path: Path) -> None:
    assert running_trainings(tmp_path) == 1  # nobody: still one share (the caller)
    with training_slot(tmp_path) as held:
        assert held and running_trainings(tmp_path) == 1
        other = _other_training(tmp_path)
        try:
            assert running_trainings(tmp_path) == 2
            assert fair_threads(ceiling=8, cpus=2, folder=tmp_path) == 1
            assert fair_threads(ceiling=8, cpus=8, folder=tmp_path) == 4
        finally:
            other.send_signal(signal.SIGKILL)  # no cleanup runs: its file stays, its lock goes with the process
            other.wait()
        assert len(list(tmp_path.glob("*.lock"))) == 2
        assert running_trainings(tmp_path) == 1
        assert len(list(tmp_path.glob("*.lock"))) == 1  # the dead one's leftover file is removed
        assert fair_threads(ceiling=8, cpus=2, folder=tmp_path) == 2
        assert fair_threads(ceiling=1, cpus=2, folder=tmp_path) == 1  # never above what the caller set
    assert list(tmp_path.glob("*.lock")) == []


def test_a_registry_that_cannot_be_written_leaves_nothing_behind(tmp_path: Path, monkeypatch) -> None:
    """No registry folder (its parent is a file), or a slot file that cannot be renamed into place: the training
    is just not counted (held is False), and no half-made slot file stays to be counted or cleaned up later."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with training_slot(blocker / "registry") as held:
        assert held is False
    assert not (blocker / "registry").exists()

    registry = tmp_path / "registry"

    def refuse(*_args) -> None:
        raise OSError("rename refused")

    monkeypatch.setattr("medtx.runtime.resources.os.rename", refuse)
    with training_slot(registry) as held:
        assert held is False
        assert list(registry.iterdir()) == []  # the .tmp slot was closed and removed
    monkeypatch.undo()
    assert running_trainings(registry) == 1


def test_fit_shares_the_cores_with_a_training_started_beside_it(tmp_path: Path, monkeypatch, caplog) -> None:
    import torch

    from medtx.training.trainer import TrainConfig, fit
    from tests.test_models import FRAMES, bundle_for

    registry = tmp_path / "registry"
    monkeypatch.setenv(TRAININGS_DIR_ENV, str(registry))
    monkeypatch.setattr("medtx.runtime.resources.available_cpus", lambda root=None: 2)
    bundle = bundle_for("transformer")
    items = bundle.encode(FRAMES["drug_rec"](n=12, seed=1))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # what `medtx train` alone sets on 2 cores
    other = _other_training(registry)
    try:
        seen: list[int] = []
        cfg = TrainConfig(epochs=2, batch_size=4, seed=0, device="cpu")
        with caplog.at_level(logging.INFO, logger="medtx.training"):
            fit(bundle.model, items[:8], items[8:], bundle.collate, cfg, tmp_path / "out",
                on_epoch=lambda epoch, metrics: seen.append(torch.get_num_threads()))
        assert seen == [1, 1]  # two trainings on 2 cores: one thread each, not 2 + 2
        assert "torch threads 2 -> 1" in caplog.text
        assert torch.get_num_threads() == 2  # given back afterwards
        explicit = TrainConfig(epochs=1, batch_size=4, seed=0, device="cpu", num_threads=2)
        fit(bundle.model, items[:8], items[8:], bundle.collate, explicit, tmp_path / "out2",
            on_epoch=lambda epoch, metrics: seen.append(torch.get_num_threads()))
        assert seen[-1] == 2  # an explicit num_threads is kept as asked
    finally:
        other.kill()
        other.wait()
        torch.set_num_threads(before)


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
              - {{model: gru, name: gru_a, overrides: {{epochs: 40, patience: 40, d_model: 16, hidden: 16}}}}
              - {{model: gru, name: gru_b, overrides: {{epochs: 40, patience: 40, d_model: 16, hidden: 16}}}}
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
