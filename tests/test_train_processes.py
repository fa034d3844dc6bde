"""Trainings at once run in processes of their own (medtx.runtime.train_processes): a seed fixes the result however many
run side by side, and a training process that dies fails its own training only."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from medtx.runtime.train_processes import call_in, training_processes


def _seeded_draws(seed: int) -> list[float]:
    """What a training does with torch's default generator: seed it, then draw (init, dropout) over time."""
    torch.manual_seed(seed)
    draws = []
    for _ in range(60):
        draws.append(float(torch.rand(1)))
        time.sleep(0.002)
    return draws


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def test_threads_share_one_generator_processes_do_not() -> None:
    alone = _seeded_draws(7)
    with ThreadPoolExecutor(2) as threads:
        side_by_side = list(threads.map(_seeded_draws, [7, 7]))
    assert side_by_side != [alone, alone]  # one generator, two trainings: the seed no longer fixes the draws
    with training_processes(2) as pool, ThreadPoolExecutor(2) as threads:
        in_processes = list(threads.map(lambda s: call_in(pool, _seeded_draws, s), [7, 7]))
    assert in_processes == [alone, alone]


def test_a_dead_training_process_fails_its_training_and_the_pool_goes_on() -> None:
    with training_processes(2) as pool:
        with pytest.raises(RuntimeError, match="training process died"):
            call_in(pool, _die)
        assert call_in(pool, _seeded_draws, 3) == _seeded_draws(3)


def test_one_at_a_time_runs_here() -> None:
    with training_processes(1) as pool:
        assert pool is None
        assert call_in(pool, os.getpid) == os.getpid()


def _loaded(module: str) -> tuple[int, bool]:
    import sys

    return os.getpid(), module in sys.modules


def test_warm_starts_every_worker_with_its_imports_before_any_training() -> None:
    with training_processes(2, preload=("tests.fixtures_samples",)) as pool:
        seen = {}
        deadline = time.monotonic() + 120
        while len(seen) < 2 and time.monotonic() < deadline:  # both workers answer, each already warmed
            with ThreadPoolExecutor(2) as threads:
                for pid, warmed in threads.map(lambda _: pool.call(_loaded, "tests.fixtures_samples"), range(2)):
                    seen[pid] = warmed
    assert len(seen) == 2 and all(seen.values())


def _warn_from_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.get_logger("transformers.modeling_utils").warning("LOAD REPORT stand-in")


def test_library_warnings_of_a_training_process_go_to_the_log_file(tmp_path, capfd) -> None:
    import logging

    log_file = tmp_path / "pipeline.log"
    handler = logging.FileHandler(log_file)
    logging.getLogger().addHandler(handler)
    try:
        with training_processes(2) as pool:
            pool.call(_warn_from_transformers)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert "LOAD REPORT stand-in" in log_file.read_text()
    assert "LOAD REPORT stand-in" not in capfd.readouterr().err
