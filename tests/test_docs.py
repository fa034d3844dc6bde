"""The docs stay true to the code: every listing of tasks, models and migrations derives from what is there."""

from __future__ import annotations

import re
from pathlib import Path

from medtx.models.catalog import BEGIN, END, catalogue_markdown, replace_between_markers
from medtx.tasks import task_names

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_architecture_catalogue_is_the_registries():
    text = (ROOT / "docs/ARCHITECTURE.md").read_text()
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")
    assert shown == catalogue_markdown(), "run: python -m medtx.models.catalog --write docs/ARCHITECTURE.md"


def test_catalogue_markers_are_required():
    import pytest

    with pytest.raises(ValueError, match="no catalogue markers"):
        replace_between_markers("# a page without the table\n", catalogue_markdown())


def test_architecture_lists_every_migration_in_order():
    text = (ROOT / "docs/ARCHITECTURE.md").read_text()
    section = text.split("## Migrations", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `(\d{4}_\w+\.sql)`", section, flags=re.M)
    files = sorted(p.name for p in (ROOT / "warehouse/migrations").glob("*.sql"))
    assert listed == files


def test_tasks_doc_has_a_row_for_every_task():
    text = (ROOT / "docs/TASKS.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))
    assert rows == set(task_names())


def test_benchmarks_readme_is_a_short_index_whose_links_resolve():
    readme = ROOT / "benchmarks/README.md"
    assert len(readme.read_text().splitlines()) <= 200
    pages = [readme, *sorted((ROOT / "benchmarks/notes").glob("*.md"))]
    broken = [f"{page.relative_to(ROOT)} -> {link}" for page in pages for link in LINK.findall(page.read_text())
              if not link.startswith(("http://", "https://")) and not (page.parent / link).exists()]
    assert broken == []
    names = [p.name for p in pages[1:]]
    assert names and all(re.match(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md$", n) for n in names), names


def test_every_step_kind_module_is_in_the_layer_order():
    from medtx.pipeline.kinds import ORDER, kinds

    modules = sorted(p.stem for p in (ROOT / "medtx/pipeline/kinds").glob("*.py") if p.stem != "__init__")
    assert sorted(ORDER) == modules
    assert [k.name for k in kinds()] == list(ORDER)


def test_the_browser_test_loads_every_dashboard_page():
    """docs/EXTENDING.md, 'Add a dashboard page': a new page needs a selector in the browser test's list."""
    from dashboard.app import PAGES
    from tests.test_dashboard_browser import PAGES as LOADED

    assert sorted(path for path, _ in LOADED) == sorted(page.PATH for page in PAGES)
