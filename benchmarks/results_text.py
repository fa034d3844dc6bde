"""Text benchmarks: MTSamples specialty (3 seeds) and FAQ tables, written between `<!-- BEGIN text -->` and
`<!-- END text -->` of benchmarks/RESULTS.md (the rest of the file is preserved; `--out` names another file).

    .venv/bin/python benchmarks/results_text.py --db var/bench/text.duckdb --prepare --run   # train + write
    .venv/bin/python benchmarks/results_text.py --db var/bench/text.duckdb                   # rewrite tables only
    .venv/bin/python benchmarks/results_text.py --db var/bench/text.duckdb --intervals       # + recompute intervals

Each cell is a run's point estimate on the whole test split with its 95% bootstrap interval (ml.metrics), and
each run is compared with its task's reference baseline by a paired bootstrap (ml.comparisons); the tables are
in benchmarks/results_text_render.py. `--intervals` recomputes both for runs recorded before they existed.

Parallel runs (DuckDB allows one writing process per file): run each model against its own copy of the
warehouse (`--faq-models none`), then `--merge var/bench/text_bilstm.duckdb ...` copies their `ml.*` rows back.
`--set model.key=value` overrides a model's TextConfig/FAQConfig field (e.g. `bilstm.bilstm_max_len=256`).

`--prepare` loads data/mtsamples into raw.mtsamples and builds samples.specialty / samples.faq (split seed 42).
Run heavy models with `nice`; on 2 CPU cores the full set takes tens of minutes.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_text_render import SPECIALTY_MODELS, faq_table, readmission_table, specialty_table  # noqa: E402
from medtx.store.db import connect, param_marks, quote_ident, quote_table  # noqa: E402
from medtx.settings import BUNDLED_DATA  # noqa: E402
from medtx.tasks import get_task, tasks_of_family  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS.md")
NOTES = Path(__file__).with_name("results_text_notes.md")  # how the recorded runs were made (CPU budget, configs)
# the text tasks on a bundled corpus (MTSamples specialty, the FAQ), from the task registry; readmission_notes reads
# an EHR dataset's notes and has its own database (READMISSION_TASKS)
TEXT_TASKS = tuple(t.name for t in tasks_of_family("text") if t.samples.dataset is not None)
READMISSION_TASKS = ("readmission", "readmission_notes")
FAQ_MODELS = (("retrieval", {}), ("retrieval", {"embedding": "minilm"}), ("seq2seq", {}))


def prepare(db: Path) -> None:
    """raw.mtsamples from the bundled CSV, then samples.specialty and samples.faq (split seed 42)."""
    from medtx.tasks import BuildContext

    con = connect(db)
    try:
        src = (BUNDLED_DATA / "mtsamples" / "mtsamples.csv.gz").as_posix()
        con.execute("DELETE FROM raw.mtsamples")
        con.execute(
            "INSERT INTO raw.mtsamples SELECT note_id, description, medical_specialty, sample_name, transcription, "
            "keywords FROM read_csv(?, header = true, all_varchar = false)", [src]
        )
        ctx = BuildContext(None, BUNDLED_DATA, seed=42, fractions=(0.7, 0.1, 0.2), min_count=1, k_folds=5)
        for task in TEXT_TASKS:
            get_task(task).lineage.build(con, ctx)
    finally:
        con.close()


def run_all(db: Path, seeds: list[int], models: list[str], overrides: dict[str, dict] | None = None,
            faq_models: list[str] | None = None) -> None:
    """Specialty runs (models x seeds), then the FAQ runs named in faq_models (None = all of FAQ_MODELS)."""
    from medtx.pipeline.steps import train_in_process

    overrides = overrides or {}
    for model in models:
        for seed in seeds:
            train_in_process(db, get_task("specialty"), model, seed, overrides.get(model))
    for model, faq_overrides in FAQ_MODELS:
        if faq_models is None or model in faq_models:
            train_in_process(db, get_task("faq"), model, 0, {**faq_overrides, **overrides.get(f"faq_{model}", {})})


def parse_sets(pairs: list[str]) -> dict[str, dict]:
    """`model.key=value` strings -> {model: {key: value}}; values parsed as JSON when they parse, else text."""
    import json

    out: dict[str, dict] = {}
    for pair in pairs:
        target, sep, value = pair.partition("=")
        model, dot, key = target.partition(".")
        if not (sep and dot and model and key):
            raise ValueError(f"--set expects model.key=value, got {pair!r}")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        out.setdefault(model, {})[key] = parsed
    return out


def merge_runs(db: Path, sources: list[Path]) -> int:
    """Copy every ml.* row of completed runs that `db` lacks from each source warehouse (same migrations); returns runs."""
    from medtx.store.db import transaction

    con = connect(db)
    copied = 0
    try:
        tables = [t for (t,) in con.sql("SELECT table_name FROM information_schema.columns WHERE table_schema = 'ml' "
                                        "AND column_name = 'run_id' AND table_name <> 'runs' GROUP BY 1").fetchall()]
        for i, src in enumerate(sources):
            alias_sql = quote_ident(f"src{i}")
            con.execute(f"ATTACH ? AS {alias_sql} (READ_ONLY)", [Path(src).as_posix()])
            new = [r for (r,) in con.sql(f"SELECT run_id FROM {alias_sql}.ml.runs WHERE status = 'completed' AND run_id "
                                         "NOT IN (SELECT run_id FROM ml.runs)").fetchall()]
            if new:
                with transaction(con):
                    for table in ["runs", *tables]:
                        con.execute(
                            f"INSERT INTO {quote_table('ml.' + table)} SELECT * FROM {alias_sql}.ml.{quote_ident(table)}"
                            f" WHERE run_id IN ({param_marks(len(new))})", new,
                        )
            con.execute(f"DETACH {alias_sql}")
            copied += len(new)
    finally:
        con.close()
    return copied


def recompute_intervals(db: Path, tasks: tuple[str, ...]) -> None:
    """(Re)compute the 95% intervals and paired comparisons of every completed run of `tasks`, one
    (task, dataset) at a time (runs recorded before issue 14 have none)."""
    from benchmarks.results_intervals import recompute

    con = connect(db, read_only=True)
    try:
        pairs = con.execute("SELECT DISTINCT task, dataset FROM ml.runs WHERE status = 'completed' "
                            "AND task IN (SELECT unnest(?::VARCHAR[])) ORDER BY ALL", [list(tasks)]).fetchall()
    finally:
        con.close()
    for task, dataset in pairs:
        recompute(db, dataset, [task])


def write_section(db: Path, results: Path = RESULTS, readmission_db: Path | None = None,
                  notes: list[str] | None = None) -> str:
    """Replace the text section of RESULTS.md (appending the markers when missing); returns the section.
    `readmission_db`: a warehouse with readmission_notes runs; `notes`: extra markdown lines appended."""
    con = connect(db, read_only=True)
    try:
        body = "\n".join(["## Clinical text models", "", *specialty_table(con), "", *faq_table(con)])
    finally:
        con.close()
    if readmission_db is not None:
        con = connect(readmission_db, read_only=True)
        try:
            body += "\n\n" + "\n".join(readmission_table(con))
        finally:
            con.close()
    if notes:
        body += "\n\n" + "\n".join(notes)
    section = f"<!-- BEGIN text -->\n{body}\n<!-- END text -->"
    text = results.read_text() if results.exists() else "# medtx benchmark results\n"
    pattern = re.compile(r"<!-- BEGIN text -->.*?<!-- END text -->", re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip() + "\n\n" + section + "\n"
    results.write_text(text)
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", type=Path, default=Path("var/bench/text.duckdb"))
    parser.add_argument("--prepare", action="store_true")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="*", default=list(SPECIALTY_MODELS))
    parser.add_argument("--faq-models", nargs="+", default=None, help="FAQ models to run (default all; 'none')")
    parser.add_argument("--set", nargs="+", default=[], metavar="MODEL.KEY=VALUE",
                        help="config overrides, e.g. bilstm.epochs=8 faq_seq2seq.epochs=30")
    parser.add_argument("--merge", nargs="+", type=Path, default=[], help="warehouses whose ml.* runs to copy in")
    parser.add_argument("--readmission-db", type=Path, default=Path("var/bench/readm_notes.duckdb"),
                        help="warehouse with readmission_notes runs (used when it exists)")
    parser.add_argument("--notes", type=Path, default=NOTES, help="markdown appended to the section (how it was run)")
    parser.add_argument("--intervals", action="store_true",
                        help="(re)compute intervals and paired comparisons of the runs before rendering")
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file whose text section is rewritten")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.prepare:
        prepare(args.db)
    if args.run:
        run_all(args.db, args.seeds, args.models, parse_sets(args.set), args.faq_models)
    if args.merge:
        print(f"merged {merge_runs(args.db, args.merge)} runs")
    notes = args.notes.read_text().splitlines() if args.notes and args.notes.exists() else None
    readmission_db = args.readmission_db if args.readmission_db and args.readmission_db.exists() else None
    if args.intervals:
        recompute_intervals(args.db, TEXT_TASKS)
        if readmission_db is not None:
            recompute_intervals(readmission_db, READMISSION_TASKS)
    print(write_section(args.db, args.out, readmission_db=readmission_db, notes=notes))


if __name__ == "__main__":
    main()
