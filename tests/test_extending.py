"""docs/EXTENDING.md's worked check: a new admission-level task file and a new model file, written into a copy of
the checkout exactly as the page shows them, with only the documented steps besides (a config line, a docs/TASKS.md
row, the regenerated catalogue), build, train end to end (the new baseline and a neural model) and pass the
registry, lineage and docs tests there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DATA, REPO_ROOT

pytestmark = pytest.mark.slow

CODE = ("medtx", "flows", "dashboard", "warehouse", "config", "tests", "docs", "benchmarks", "pyproject.toml")
TASK, MODEL = "prolonged_stay", "naive_bayes"


def worked_files() -> dict[str, str]:
    """The files docs/EXTENDING.md shows under `<!-- file: PATH -->`, by path."""
    text = (REPO_ROOT / "docs" / "EXTENDING.md").read_text()
    return dict(re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", text, flags=re.S))


def test_the_page_shows_both_files():
    assert set(worked_files()) == {f"medtx/tasks/{TASK}.py", f"medtx/models/{MODEL}.py"}


def test_a_task_and_a_model_dropped_in_train_and_pass_the_registry_and_lineage_tests(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in CODE:
        src = REPO_ROOT / name
        (shutil.copytree(src, checkout / name, ignore=ignore) if src.is_dir() else shutil.copy(src, checkout / name))
    (checkout / "data").symlink_to(DATA)
    for path, text in worked_files().items():
        assert not (checkout / path).exists(), path
        (checkout / path).write_text(text)
    # the documented steps besides the two files: a config line, a docs row, the regenerated catalogue
    config = checkout / "config" / "default.yaml"
    config.write_text(config.read_text().replace(
        "\ntasks:\n", f"\ntasks:\n  {TASK}: {{models: [{{model: logreg}}, {{model: {MODEL}}}]}}\n", 1))
    tasks_doc = checkout / "docs" / "TASKS.md"
    tasks_doc.write_text(tasks_doc.read_text().replace(
        "| `mortality` |", f"| `{TASK}` | 48 h after admission | as mortality | stay > 7 days | stays > 48 h |\n"
        "| `mortality` |", 1))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDTX_", "PREFECT_HOME"))}
    env |= {"PYTHONPATH": str(checkout), "PYTHONDONTWRITEBYTECODE": "1"}

    def run(*args: str, timeout: int = 600) -> str:
        done = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, (args, done.stdout[-6000:], done.stderr[-3000:])
        return done.stdout + done.stderr

    run("-m", "medtx.models.catalog", "--write", "docs/ARCHITECTURE.md")
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)  # the name tests grep the tracked files
    subprocess.run(["git", "add", "-A"], cwd=checkout, check=True)

    db = str(tmp_path / "w.duckdb")
    cli = ("-c", "from flows.cli import main; main()")
    run(*cli, "ingest", "mimic3", "--db", db)
    run(*cli, "map-codes", "--db", db)
    assert f"{TASK}/mimic3_demo" in run(*cli, "build-samples", "--task", TASK, "--db", db)
    for model, extra in ((MODEL, ()), ("gru", ("--epochs", "1"))):
        out = run(*cli, "train", "--task", TASK, "--model", model, *extra, "--db", db)
        assert f"{TASK}.{model}.mimic3_demo" in out, out[-2000:]
    assert "ok" in run(*cli, "pipeline", "--check", "--config", "config/default.yaml").lower()

    # the registry and docs tests whole; lineage: the plan's checks and every step of the new task
    tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_tasks.py", "tests/test_docs.py",
                "tests/test_lineage.py", "-k", f"not test_step_runs_on_only or {TASK}", timeout=900)
    assert re.search(r"\d+ passed", tests) and "failed" not in tests, tests[-3000:]
