"""benchmarks/gpu end to end on CPU at small scale: pack the demo's training packages, run the GPU script with
`--device cpu` (CUDA tests skip, a one-point throughput sweep, a GRU on drug_rec, readmission and mortality through
`python -m medtx.worker`), record the returned tars into the warehouse and publish. What a GPU session runs at
full scale in one device call (benchmarks/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_pack_run_record_on_cpu(demo_copy: Path, tmp_path: Path) -> None:
    payload, out = tmp_path / "payload", tmp_path / "out"
    packed = _run(str(GPU / "pack.py"), "--db", str(demo_copy), "--dataset", "mimic3_demo", "--out", str(payload),
                  "--no-wheels")
    assert packed.returncode == 0, packed.stderr[-2000:]
    assert "carry size: tree" in packed.stdout and "-> OK" in packed.stdout
    assert sorted(p.name for p in (payload / "packages").iterdir()) == ["drug_rec", "mortality", "readmission"]
    done = _run(str(GPU / "run.py"), "--payload", str(payload), "--out", str(out), "--device", "cpu", "--epochs", "1",
                "--families", "gru", "--sweep-models", "gru", "--sweep-batch-sizes", "16", "--precisions", "fp32",
                "--sweep-batches", "2", "--jobs", "3", "--threads", "1", "--budget-s", "200",
                "--train-overrides", json.dumps({"batch_size": 16, "d_model": 8, "hidden": 8}))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["tests"]["rc"] == 0 and "skipped" in report["tests"]["summary"]  # no CUDA here: they skip
    assert [(r["model"], r["batch_size"]) for r in report["sweep"]] == [("gru", 16)]
    assert report["sweep"][0]["train_samples_per_s"] > 0
    assert sorted((r["task"], r["status"]) for r in report["trainings"]) == [
        ("drug_rec", "completed"), ("mortality", "completed"), ("readmission", "completed")]
    assert sorted(p.name for p in out.iterdir()) == ["logs.txt", "report.json", "report.md", "results-1.tar"]
    recorded = _run(str(GPU / "record.py"), str(out), "--db", str(demo_copy))
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    run_ids = [json.loads(line)["run_id"] for line in recorded.stdout.splitlines() if line.startswith("{")]
    assert len(run_ids) == 3
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        rows = con.execute(
            "SELECT r.task, r.device, r.status, m.value, m.ci_low, m.ci_high FROM ml.runs r JOIN ml.metrics m "
            "USING (run_id) WHERE m.split = 'test' AND m.metric IN ('auprc', 'pr_auc_samples') "
            f"AND m.averaging IN ('none', 'visit') AND r.run_id IN ({', '.join(map(repr, run_ids))}) ORDER BY 1"
        ).fetchall()
    assert [r[:3] for r in rows] == [("drug_rec", "cpu", "completed"), ("mortality", "cpu", "completed"),
                                     ("readmission", "cpu", "completed")]
    assert all(lo is not None and lo <= v <= hi for _, _, _, v, lo, hi in rows)  # intervals by the writer
    assert (demo_copy.parent / "demo.snapshot.duckdb").exists()
    again = _run(str(GPU / "record.py"), str(out), "--db", str(demo_copy), "--no-publish")
    assert again.returncode == 0  # idempotent: the same runs, recorded once
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        assert con.execute(f"SELECT count(*) FROM ml.runs WHERE run_id IN ({', '.join(map(repr, run_ids))})"
                           ).fetchall()[0][0] == 3


def test_pack_refuses_a_carry_over_its_limit_and_bad_input(demo_copy: Path, tmp_path: Path) -> None:
    over = _run(str(GPU / "pack.py"), "--db", str(demo_copy), "--dataset", "mimic3_demo", "--out",
                str(tmp_path / "p"), "--no-wheels", "--tasks", "drug_rec", "--limit-mib", "1")
    assert over.returncode == 1 and "-> OVER" in over.stdout  # the tree alone is over 1 MiB
    no_dataset = _run(str(GPU / "pack.py"), "--db", str(demo_copy), "--out", str(tmp_path / "q"))
    assert no_dataset.returncode == 2 and "--db needs --dataset" in no_dataset.stderr
    no_payload = _run(str(GPU / "run.py"), "--payload", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"))
    assert no_payload.returncode == 2 and "run benchmarks/gpu/pack.py" in no_payload.stderr
    nothing = tmp_path / "empty"
    nothing.mkdir()
    empty = _run(str(GPU / "record.py"), str(nothing), "--db", str(demo_copy))
    assert empty.returncode == 2 and "no results-*.tar" in empty.stderr
