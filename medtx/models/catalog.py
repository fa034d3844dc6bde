"""The catalogue of tasks and models as Markdown, derived from the two registries (docs/ARCHITECTURE.md holds it).

    python -m medtx.models.catalog                 # print the table
    python -m medtx.models.catalog --write FILE    # replace it between FILE's catalogue markers

tests/test_docs.py checks that the table in docs/ARCHITECTURE.md is this function's output, so a new task or model
file shows up there (or the test says which command to run) and no listing goes stale by hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from medtx.models.registry import FAMILIES, models_for, specs
from medtx.tasks import all_tasks

BEGIN = "<!-- BEGIN catalogue (python -m medtx.models.catalog --write docs/ARCHITECTURE.md) -->"
END = "<!-- END catalogue -->"


def catalogue_markdown() -> str:
    """One row per task (its kind, family and every model that applies to it) and one row per model family."""
    rows = ["| task | kind | family | models that apply (registry order) |", "|---|---|---|---|"]
    for task in all_tasks():
        models = ", ".join(f"`{m}`" for m in models_for(task)) or "—"
        rows.append(f"| `{task.name}` | {task.kind} | {task.family} | {models} |")
    rows += ["", "| model family | models |", "|---|---|"]
    for family, words in FAMILIES.items():
        names = ", ".join(f"`{s.name}`" for s in specs(family)) or "—"
        rows.append(f"| `{family}` ({words}) | {names} |")
    return "\n".join(rows) + "\n"


def replace_between_markers(text: str, body: str) -> str:
    """`text` with the part between the catalogue markers replaced by `body` (the markers must be there)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"no catalogue markers ({BEGIN!r} ... {END!r})")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{body}{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="replace the catalogue between this file's markers")
    args = parser.parse_args(argv)
    body = catalogue_markdown()
    if args.write is None:
        print(body, end="")
        return
    args.write.write_text(replace_between_markers(args.write.read_text(), body))


if __name__ == "__main__":
    main()
