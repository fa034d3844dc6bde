"""Train anywhere, write once: a real Dask scheduler and two workers as separate OS processes that cannot see
the warehouse's folder (a private mount namespace with an empty tmpfs over it). The pipeline still completes
with every run recorded, because workers train from training packages in the exchange folder and the flow is
the only process that opens the warehouse."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parent.parent / "data"
DASK = str(Path(sys.executable).with_name("dask"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _can_hide_folders() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0


def _wait_for_workers(address: str, n: int, timeout: float = 90) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        client.wait_for_workers(n, timeout=timeout)


@pytest.fixture
def cluster(prefect_harness, tmp_path: Path):
    """Scheduler + 2 workers; the workers' view of `<tmp>/hidden` is an empty tmpfs."""
    if not _can_hide_folders():
        pytest.skip("needs `unshare -m` (root or user namespaces) to hide the warehouse folder from workers")
    from prefect.settings import PREFECT_API_URL

    hidden, shared = tmp_path / "hidden", tmp_path / "shared"
    hidden.mkdir()
    shared.mkdir()
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = os.environ | {"PREFECT_API_URL": str(PREFECT_API_URL.value()),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(DATA.parent), os.environ.get("PYTHONPATH")]))}
    logs = [open(tmp_path / f"{name}.log", "w") for name in ("scheduler", "worker1", "worker2")]
    procs = [subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                              env=env, stdout=logs[0], stderr=subprocess.STDOUT)]
    for i in (1, 2):
        hide = f"mount -t tmpfs none {hidden} && exec {DASK} worker {address} --nthreads 1 --no-nanny " \
               f"--no-dashboard --name w{i}"
        procs.append(subprocess.Popen(["unshare", "-m", "sh", "-c", hide], env=env, stdout=logs[i],
                                      stderr=subprocess.STDOUT))
    try:
        _wait_for_workers(address, 2)
        yield address, hidden, shared, [p.pid for p in procs[1:]]
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for log in logs:
            log.close()


def test_workers_that_cannot_see_the_warehouse_train_every_run(cluster, tmp_path: Path, monkeypatch) -> None:
    from flows.pipeline import run_pipeline

    address, hidden, shared, worker_pids = cluster
    monkeypatch.setenv("MEDTX_CACHE_DIR", str(hidden / "cache"))
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(hidden / "models"))
    monkeypatch.setenv("MEDTX_RESULTS_DIR", str(shared / "prefect-results"))  # workers persist task results
    monkeypatch.setenv("MEDTX_EXCHANGE_DIR", str(shared / "exchange"))
    monkeypatch.setenv("MEDTX_KEEP_RESULTS", "1")  # recorded result packages stay, to read who trained each run
    config = tmp_path / "pipeline.yaml"
    config.write_text(textwrap.dedent(f"""
        datasets: [{{source: {DATA / 'mimic3_demo'}}}]
        seeds: [42]
        tasks:
          drug_rec:
            models:
              - {{model: logreg}}
              - {{model: gru, overrides: {{epochs: 1, d_model: 16, hidden: 16}}}}
          readmission:
            models: [{{model: logreg}}]
        runner: {{kind: dask, address: "{address}", train_concurrency: 2, torch_threads: 1}}
        """))
    db = hidden / "warehouse.duckdb"
    run_pipeline(config, db=db)

    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.sql("SELECT task, model, status FROM ml.runs ORDER BY task, model").fetchall()
        predictions = con.sql("SELECT count(DISTINCT run_id) FROM ml.predictions").fetchall()[0][0]
        checkpoints = con.sql("SELECT path FROM ml.models").fetchall()
    assert runs == [("drug_rec", "gru", "completed"), ("drug_rec", "logreg", "completed"),
                    ("readmission", "logreg", "completed")]
    assert predictions == 3
    assert checkpoints and all(Path(p).is_relative_to(hidden / "models") and Path(p).exists() for (p,) in checkpoints)
    manifests = list((shared / "exchange" / "results").rglob("manifest.json"))
    trained_by = {json.loads(m.read_text())["worker"]["pid"] for m in manifests}
    assert len(manifests) == 3 and trained_by <= set(worker_pids), (trained_by, worker_pids)


def test_a_worker_killed_mid_training_never_leaves_a_half_written_run(cluster, tmp_path: Path, monkeypatch) -> None:
    """SIGKILL one worker while trainings run: Dask reruns its task on the other worker (or the step fails);
    either way every run in the warehouse is whole and none stays `running`."""
    import tempfile
    import threading

    from flows.pipeline import run_pipeline

    address, hidden, shared, worker_pids = cluster
    for name, root in (("CACHE", hidden), ("MODELS", hidden), ("RESULTS", shared), ("EXCHANGE", shared)):
        monkeypatch.setenv(f"MEDTX_{name}_DIR", str(root / name.lower()))
    config = tmp_path / "pipeline.yaml"
    config.write_text(textwrap.dedent(f"""
        datasets: [{{source: {DATA / 'mimic3_demo'}}}]
        seeds: [42]
        tasks:
          drug_rec:
            models:
              - {{model: gru, name: gru_a, overrides: {{epochs: 40, d_model: 16, hidden: 16, patience: 40}}}}
              - {{model: gru, name: gru_b, overrides: {{epochs: 40, d_model: 16, hidden: 16, patience: 40}}}}
        runner: {{kind: dask, address: "{address}", train_concurrency: 2, torch_threads: 1}}
        """))
    before = set(Path(tempfile.gettempdir()).glob("medtx-worker-*"))
    killed = threading.Event()

    def kill_when_training() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if set(Path(tempfile.gettempdir()).glob("medtx-worker-*")) - before:
                time.sleep(1.0)
                os.kill(worker_pids[0], signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.1)

    threading.Thread(target=kill_when_training, daemon=True).start()
    db = hidden / "warehouse.duckdb"
    state = run_pipeline(config, db=db, return_state=True)
    assert killed.is_set()
    with duckdb.connect(str(db), read_only=True) as con:
        runs = con.sql("SELECT run_id, status FROM ml.runs").fetchall()
        whole = con.sql("SELECT r.run_id FROM ml.runs r WHERE r.status = 'completed' AND "
                        "EXISTS (SELECT 1 FROM ml.predictions p WHERE p.run_id = r.run_id) AND "
                        "EXISTS (SELECT 1 FROM ml.metrics m WHERE m.run_id = r.run_id)").fetchall()
    assert all(status in ("completed", "failed") for _, status in runs), runs
    assert {r for r, s in runs if s == "completed"} == {r for (r,) in whole}
    if state.is_completed():  # Dask moved the killed task to the surviving worker
        assert sorted(s for _, s in runs) == ["completed", "completed"]
