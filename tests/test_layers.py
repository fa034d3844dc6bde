"""The import contracts of pyproject.toml ([tool.importlinter]) hold, and they do catch an upward import.

`lint-imports` (import-linter) reads the code's real import graph: the library (medtx) never imports Prefect,
flows or the dashboard; medtx.models never imports medtx.training or medtx.text; the dashboard imports no
flows or training code; only the dashboard's commands (`medtx dashboard`, `status`, `leaderboard`) import the dashboard;
the sample-building kit (medtx.samples) never imports medtx.tasks.

The task registry finds its task files at run time (importlib), which a static import graph cannot follow, so the
worker contract does not cover them: `test_the_task_registry_loads_where_only_torch_lives` runs the registry where
DuckDB, polars and the rest cannot be imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache", "--no-logo"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "7 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "source", "contract"), [
    ("medtx/models/_upward.py", "from medtx.training.trainer import fit\n", "models never import"),
    ("medtx/_orchestrated.py", "import prefect\n", "medtx is a library"),
    ("dashboard/_runs_flows.py", "import flows.pipeline\n", "the dashboard reads the snapshot"),
    ("medtx/samples/_task_aware.py", "def f():\n    from medtx.tasks import get_task\n", "the sample-building kit"),
    ("medtx/text/_upward.py", "from medtx.training.trainer import fit\n", "the text tools"),
])
def test_an_upward_import_breaks_its_contract(tmp_path, module, source, contract):
    """A copy of the code with one violating module fails lint-imports, naming the broken contract."""
    for package in ("medtx", "flows", "dashboard"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                                          "assets", "*.gz"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / module).write_text(source)
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert len(broken) == 1 and broken[0].startswith(contract), result.stdout


BLOCKER = """
import sys


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"polars", "duckdb", "prefect", "dash", "dask", "ftfy", "flows", "dashboard"}:
            raise ModuleNotFoundError(f"{name} is blocked in this test", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
"""


def test_the_task_registry_loads_where_only_torch_lives(tmp_path):
    """Every task file (its record and its SQL) imports DuckDB and the kit only inside its `build`: the worker
    loads the whole registry without them. A task file importing duckdb at module level fails here."""
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    probe = ("import sys\n"
             "from medtx.tasks import all_tasks\n"
             "tasks = all_tasks()\n"
             "assert all(t.lineage.build is not None or t.lineage.builds for t in tasks)\n"
             "print(len(tasks), sorted(m for m in ('duckdb', 'polars', 'ftfy') if m in sys.modules))\n")
    ran = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    count, loaded = ran.stdout.split(" ", 1)
    assert int(count) >= 7 and loaded.strip() == "[]"
    blocked = subprocess.run([sys.executable, "-c", "import duckdb"], env=env, capture_output=True, text=True)
    assert blocked.returncode != 0 and "blocked in this test" in blocked.stderr  # the blocker really blocks


def _folder_cycles() -> list[list[str]]:
    """Loops among medtx's folders (and its top-level modules): each as the folders on it, with one import per step."""
    import grimp

    graph = grimp.build_graph("medtx", include_external_packages=False, exclude_type_checking_imports=True)

    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    arrows: dict[str, dict[str, str]] = {}
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = part(importer), part(imported)
            if a != b and "medtx" not in (a, b):
                arrows.setdefault(a, {}).setdefault(b, f"{importer} -> {imported}")
    loops, done = [], set()
    for start in sorted(arrows):  # a path back to `start` through folders not yet done
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(arrows.get(node, {})):
                if nxt == start:
                    loops.append([arrows[a][b] for a, b in zip(path, [*path[1:], start], strict=True)])
                elif nxt not in path and nxt not in done:
                    stack.append((nxt, [*path, nxt]))
            if loops:
                return loops
        done.add(start)
    return loops


def test_no_folders_of_medtx_import_each_other_in_a_loop():
    """The house stands in floors: no loop of imports runs through medtx's folders (nor medtx.worker /
    medtx.settings), function-level imports included. The last ones: medtx.worker -> medtx.pipeline.packages ->
    ... -> medtx.pipeline.steps -> medtx.worker (the package format now lives in medtx.training), and
    medtx.samples.vocab -> medtx.models.vocab while the models read the task registry that builds on the kit
    (`Vocab` now lives in medtx.samples.tokens)."""
    assert _folder_cycles() == []
