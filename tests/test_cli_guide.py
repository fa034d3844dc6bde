"""The CLI that guides, on a real warehouse built by the real commands (bundled MIMIC-III demo).

`train` without --dataset uses the only dataset present, and with two present fails listing both (nothing
written); `status` shows rows, samples and runs; `leaderboard` prints the dashboard's leaderboard from the
published snapshot (values with their 95% intervals, the paired verdict against the reference baseline, n test
patients; the SafeDrug sd only on request, named); `--version` prints the installed version.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from flows.cli import app
from medtx.publish.snapshot import publish_snapshot
from medtx.settings import snapshot_path

DATA = Path(__file__).resolve().parent.parent / "data"
runner = CliRunner()


def _ok(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _runs(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.sql("SELECT dataset, task, model, status FROM ml.runs ORDER BY started_at").fetchall()


@pytest.fixture(scope="module")
def one_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse holding only the demo, ingested under a name that is not the old hard-coded default."""
    folder = tmp_path_factory.mktemp("cli")
    db = folder / "w.duckdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEDTX_MODELS_DIR", str(folder / "models"))
        mp.setenv("MEDTX_CACHE_DIR", str(folder / "cache"))
        _ok("ingest", "mimic3", "--dataset", "demo_a", "--db", str(db))
        _ok("map-codes", "--db", str(db))
        _ok("build-samples", "--task", "drug_rec", "--db", str(db))
        yield db


def test_train_defaults_to_the_only_dataset_then_lists_them_when_several(one_dataset: Path, tmp_path: Path,
                                                                         monkeypatch) -> None:
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    db = one_dataset
    _ok("train", "--task", "drug_rec", "--model", "most_frequent", "--db", str(db))
    assert _runs(db) == [("demo_a", "drug_rec", "most_frequent", "completed")]

    # a second dataset: the command may no longer guess; it names both and writes nothing
    _ok("ingest", "mimic3", "--dataset", "demo_b", "--db", str(db))
    result = runner.invoke(app, ["train", "--task", "drug_rec", "--model", "most_frequent", "--db", str(db)])
    assert result.exit_code == 1
    flat = " ".join(result.output.split())
    assert "demo_a, demo_b" in flat and "--dataset" in flat, result.output
    assert len(_runs(db)) == 1

    # a named dataset without samples: the hint is a real command with its arguments
    result = runner.invoke(app, ["train", "--task", "drug_rec", "--model", "most_frequent", "--dataset", "demo_b",
                                 "--db", str(db)])
    assert result.exit_code == 1
    hints = re.findall(r"`(medtx [^`]+)`", " ".join(result.output.split()))
    assert hints == ["medtx map-codes --dataset demo_b", "medtx build-samples --task drug_rec --dataset demo_b"], \
        result.output
    for hint in hints:  # the hints work, in order
        _ok(*hint.split()[1:], "--db", str(db))
    _ok("train", "--task", "drug_rec", "--model", "most_frequent", "--dataset", "demo_b", "--db", str(db))
    assert [(r[0], r[3]) for r in _runs(db)] == [("demo_a", "completed"), ("demo_b", "failed"), ("demo_b", "completed")]


def _nospace(text: str) -> str:
    """The text without whitespace: the console wraps long lines anywhere, inside a long temporary path too."""
    return "".join(text.split())


def test_train_on_an_empty_warehouse_says_what_to_ingest(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    _ok("map-codes", "--db", str(db))  # creates the schema, no dataset
    result = runner.invoke(app, ["train", "--task", "readmission", "--model", "logreg", "--db", str(db)])
    assert result.exit_code == 1
    assert _nospace(f"medtx ingest mimic3 --db {db}") in _nospace(result.output)


def test_status_and_leaderboard(one_dataset: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MEDTX_MODELS_DIR", str(tmp_path / "models"))
    db = one_dataset
    if not _runs(db):  # this test alone
        _ok("train", "--task", "drug_rec", "--model", "most_frequent", "--dataset", "demo_a", "--db", str(db))
    with duckdb.connect(str(db), read_only=True) as con:
        patients = con.sql("SELECT count(*) FROM raw.patients WHERE dataset = 'demo_a'").fetchall()[0][0]
        tests = con.sql("SELECT count(*) FROM samples.drug_rec d JOIN samples.splits s USING (dataset, subject_id) "
                        "WHERE s.task = 'drug_rec' AND s.split = 'test' AND d.dataset = 'demo_a'").fetchall()[0][0]
    out = _ok("status", "--db", str(db))
    assert re.search(rf"demo_a\s+│\s+patients\s+│\s+{patients}\b", out), out
    assert re.search(rf"demo_a\s+│\s+drug_rec\s+│\s+test\s+│\s+{tests}\b", out), out
    assert re.search(r"demo_a\s+│\s+drug_rec\s+│\s+completed\s+│\s+1\b", out), out

    missing = runner.invoke(app, ["leaderboard", "--task", "drug_rec", "--db", str(db)])
    assert missing.exit_code == 1 and "medtxpipeline" in _nospace(missing.output)  # nothing published yet
    publish_snapshot(db, snapshot_path(db))
    board = _ok("leaderboard", "--task", "drug_rec", "--dataset", "demo_a", "--db", str(db))
    assert "drug_rec on demo_a" in board and "most_frequent" in board and "pr_auc_samples" in board, board
    with duckdb.connect(str(db), read_only=True) as con:  # the default: most test patients among datasets with runs
        ranked = con.sql("SELECT dataset, count(*) AS n FROM samples.splits WHERE task = 'drug_rec' AND split = 'test' "
                         "AND dataset IN (SELECT dataset FROM ml.runs) GROUP BY 1").fetchall()
    best = {d for d, n in ranked if n == max(n for _, n in ranked)}
    default = re.search(r"drug_rec on (\w+)", _ok("leaderboard", "--task", "drug_rec", "--db", str(db))).group(1)
    assert default in best
    # each value with its 95% patient-bootstrap interval, never the SafeDrug sd as a bare "±" (it printed
    # "± 0.000" on the demo's 2 test patients); the demo is too small for verdicts, and the table says so
    assert re.search(r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]", board), board
    assert "±" not in board and "SafeDrug" not in board, board
    flat = " ".join(board.split())
    assert re.search(r"Too small to compare models: at most \d+ test patients", flat), board
    wrong = runner.invoke(app, ["leaderboard", "--task", "faq", "--db", str(db)])
    assert wrong.exit_code == 1 and "drug_rec" in wrong.output


def test_status_without_a_warehouse_says_what_to_run(tmp_path: Path) -> None:
    missing = tmp_path / "none.duckdb"
    result = runner.invoke(app, ["status", "--db", str(missing)])
    assert result.exit_code == 1 and _nospace(f"medtx pipeline --db {missing}") in _nospace(result.output)
    assert not missing.exists()  # looking does not create it


def test_version() -> None:
    from importlib.metadata import version

    assert _ok("--version").strip() == f"medtx {version('medtx')}"


def test_leaderboard_prints_intervals_and_paired_verdicts(tmp_path: Path, monkeypatch) -> None:
    """A synthetic cohort with enough test patients for verdicts, through the real commands: every value carries
    its stored 95% interval, the reference baseline and the other model's paired verdict with its difference
    interval are printed, n test is the split's patients; `--safedrug-sd` adds the named second convention."""
    monkeypatch.setenv("MEDTX_HOME", str(tmp_path))
    db = tmp_path / "w.duckdb"
    _ok("synth", "mimic3", "--patients", "500", "--seed", "1", "--out", str(tmp_path / "s500"))
    _ok("ingest", "mimic3", "--source", str(tmp_path / "s500"), "--dataset", "s500", "--db", str(db))
    _ok("map-codes", "--db", str(db))
    _ok("build-samples", "--task", "readmission", "--db", str(db))
    trained = [_ok("train", "--task", "readmission", "--model", model, "--db", str(db))
               for model in ("most_frequent", "logreg")]
    publish_snapshot(db, snapshot_path(db))
    with duckdb.connect(str(db), read_only=True) as con:
        n_test = con.sql("SELECT count(*) FROM samples.splits WHERE task = 'readmission' AND split = 'test'"
                         ).fetchall()[0][0]
        stored = {(model, metric): (value, lo, hi, sd) for model, metric, value, lo, hi, sd in con.sql(
            "SELECT r.model, m.metric, m.value, m.ci_low, m.ci_high, m.sd FROM ml.metrics m JOIN ml.runs r "
            "USING (run_id) WHERE m.split = 'test' AND m.metric IN ('auroc', 'auprc')").fetchall()}
        diff, d_lo, d_hi, verdict, ref, other = con.sql(
            "SELECT c.diff, c.ci_low, c.ci_high, c.verdict, rr.model, r.model FROM ml.comparisons c "
            "JOIN ml.runs r USING (run_id) JOIN ml.runs rr ON rr.run_id = c.reference_run_id "
            "WHERE c.metric = 'auprc'").fetchall()[0]
    assert n_test >= 30
    # `medtx train`'s own table: the test size is a count (it printed "87.0000")
    assert re.search(rf"│ n_patients\s+│ none\s+│ {n_test}\s+│", trained[1]), trained[1]
    board = _ok("leaderboard", "--task", "readmission", "--db", str(db))
    lines = {line.split("│")[1].strip(): line for line in board.splitlines()
             if line.count("│") > 3 and line.split("│")[1].strip()}  # a row's first line (flags may wrap)
    assert set(lines) == {"most_frequent", "logreg"}, board
    for (model, metric), (value, lo, hi, _) in stored.items():
        assert f"{value:.3f} [{lo:.3f}, {hi:.3f}]" in lines[model], (model, metric, board)
        assert f"│ {n_test:>6} │" in lines[model], board
    # the reference is whichever baseline is better on validation (on this cohort: logreg)
    assert {ref, other} == {"most_frequent", "logreg"} and "reference" in lines[ref]
    word = {"better": "better", "worse": "worse", "no_detectable_difference": "no detectable diff."}[verdict]
    assert word in lines[other] and f"{diff:+.3f} [{d_lo:+.3f}, {d_hi:+.3f}]" in lines[other], board
    assert "±" not in board and "Too small" not in board
    assert "paired bootstrap on auprc" in " ".join(board.split())
    with_sd = _ok("leaderboard", "--task", "readmission", "--metrics", "1", "--safedrug-sd", "--db", str(db))
    assert "SafeDrug sd" in with_sd
    sd_line = next(line for line in with_sd.splitlines() if "│ logreg" in line)
    assert f"│ {stored[('logreg', 'auroc')][3]:>11.3f} │" in sd_line, with_sd
    # the pipeline's Prefect artifact of test metrics: the same interval, and the sd under its convention's name
    from medtx.pipeline.runs import metrics_rows

    with duckdb.connect(str(db), read_only=True) as con:
        run_ids = [r[0] for r in con.sql("SELECT run_id FROM ml.runs").fetchall()]
    artifact = {(r["model"], r["metric"]): r for r in metrics_rows(db, run_ids)}
    for (model, metric), (value, lo, hi, sd) in stored.items():
        row = artifact[(model, metric)]
        assert (row["value"], row["ci95_low"], row["ci95_high"], row["safedrug_sd"]) == (
            round(value, 4), round(lo, 4), round(hi, 4), round(sd, 4)) and "sd" not in row
