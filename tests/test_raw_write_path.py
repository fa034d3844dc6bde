"""Issue 34: the guards are a property of the write path, so a new importer cannot forget them.

medtx.ingest.writepath is the one way into `raw.*`: `raw_writer` (the writer lock) and `RawWriter.replacing`
(one transaction, the row-count guard at its end). This test reads the source of medtx/ and flows/ and fails
when SQL that writes a raw table (INSERT/DELETE/UPDATE/... naming `raw.` or a spec's `raw_table`) sits in a
function that is not called only from inside a `with ....replacing(...)` block, directly or through other such
writer functions. A new command that writes raw tables some other way fails here, naming the file and line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DML = re.compile(r"\b(INSERT\s+(OR\s+\w+\s+)?INTO|DELETE\s+FROM|UPDATE|TRUNCATE|DROP\s+TABLE|ALTER\s+TABLE|"
                 r"CREATE\s+(OR\s+REPLACE\s+)?TABLE|COPY)\b", re.I)
RAW = re.compile(r"raw\.|raw_table")
PATH = ("medtx/ingest/writepath.py", "replacing")  # the guarded transaction (plausibility rules run inside it)
# Known writers outside the guarded path, each with the reason it is not user data the guard protects.
EXEMPT = {
    # A synthetic cohort's ground truth (raw.synth_oracle_*), written by the pipeline's own synth/ingest step
    # under the pipeline's writer lock; regenerated from its seed, never a user's only copy.
    ("medtx/synth/oracle.py", "load_oracle"),
}


def _text(node: ast.AST) -> str | None:
    """A string constant, or an f-string with its expressions written back as `{source}`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.values)
    return None


def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(REPO)): ast.parse(p.read_text(), str(p))
            for folder in ("medtx", "flows") for p in sorted((REPO / folder).rglob("*.py"))}


def _functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def raw_writers(modules: dict[str, ast.Module]) -> dict[tuple[str, str], int]:
    """(file, function) -> line of the first raw-table-writing SQL string in it."""
    found: dict[tuple[str, str], int] = {}
    for path, tree in modules.items():
        for fn in _functions(tree):
            for node in ast.walk(fn):
                text = _text(node)
                if text and DML.search(text) and RAW.search(text):
                    found.setdefault((path, fn.name), node.lineno)
    return found


def _called_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def unguarded_calls(modules: dict[str, ast.Module], writers: set[str]) -> list[str]:
    """Calls of a writer function that are neither inside a `with ....replacing(...)` block nor inside another
    writer function."""
    bad = []
    for path, tree in modules.items():
        for fn in _functions(tree):
            if fn.name in writers or (path, fn.name) == PATH:
                continue  # RawWriter.replacing itself runs its checks inside its own transaction
            guarded: set[int] = set()
            for node in ast.walk(fn):
                if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                        isinstance(i.context_expr, ast.Call) and _called_name(i.context_expr) == "replacing"
                        for i in node.items):
                    guarded |= {id(n) for n in ast.walk(node)}
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and _called_name(node) in writers and id(node) not in guarded:
                    bad.append(f"{path}:{node.lineno}: {fn.name} calls {_called_name(node)} outside "
                               "RawWriter.replacing (medtx.ingest.writepath)")
    return bad


def test_every_raw_table_writer_runs_inside_the_guarded_write_path() -> None:
    modules = _modules()
    writers = raw_writers(modules)
    assert ("medtx/ingest/staging.py", "_swap_in") in writers and ("medtx/meds/tables.py", "write_raw") in writers
    names = {name for (path, name) in writers if (path, name) not in EXEMPT}
    assert unguarded_calls(modules, names) == []
    # every writer is reached: an unused one would be a way around that nobody calls yet
    called = {_called_name(n) for tree in modules.values() for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert names <= called, names - called


def test_the_scan_catches_a_writer_outside_the_path() -> None:
    """A command writing raw.patients directly, and one calling a writer outside `replacing`, are both found."""
    rogue = ast.parse(
        "def import_other(con, dataset):\n"
        "    con.execute(f\"DELETE FROM raw.patients WHERE dataset = ?\", [dataset])\n"
        "def replace_meds(writer, con):\n"
        "    write_raw(con, 'd', None)\n"
        "def fine(writer, con):\n"
        "    with writer.replacing('d', None):\n"
        "        write_raw(con, 'd', None)\n")
    modules = {"medtx/rogue.py": rogue}
    assert raw_writers(modules) == {("medtx/rogue.py", "import_other"): 2}
    assert unguarded_calls(modules, {"write_raw", "import_other"}) == [
        "medtx/rogue.py:4: replace_meds calls write_raw outside RawWriter.replacing (medtx.ingest.writepath)"]
