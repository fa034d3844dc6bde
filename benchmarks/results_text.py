"""Text benchmarks: MTSamples specialty (3 seeds) and FAQ tables, written between `<!-- BEGIN text -->` and
`<!-- END text -->` of benchmarks/RESULTS.md (the rest of the file is preserved).

    .venv/bin/python benchmarks/results_text.py --db var/bench/text.duckdb --prepare --run   # train + write
    .venv/bin/python benchmarks/results_text.py --db var/bench/text.duckdb                   # rewrite tables only

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
from pathlib import Path

from medtx.db import connect, param_marks, quote_ident, quote_table
from medtx.settings import BUNDLED_DATA

RESULTS = Path(__file__).with_name("RESULTS.md")
NOTES = Path(__file__).with_name("results_text_notes.md")  # how the recorded runs were made (CPU budget, configs)
SPECIALTY_MODELS = ("majority", "tfidf_logreg", "bilstm", "bert_scratch", "minilm")
FAQ_MODELS = (("retrieval", {}), ("retrieval", {"embedding": "minilm"}), ("seq2seq", {}))


def prepare(db: Path) -> None:
    """raw.mtsamples from the bundled CSV, then samples.specialty and samples.faq (split seed 42)."""
    from medtx.samples.faq import build_faq
    from medtx.samples.specialty import build_specialty

    con = connect(db)
    try:
        src = (BUNDLED_DATA / "mtsamples" / "mtsamples.csv.gz").as_posix()
        con.execute("DELETE FROM raw.mtsamples")
        con.execute(
            "INSERT INTO raw.mtsamples SELECT note_id, description, medical_specialty, sample_name, transcription, "
            "keywords FROM read_csv(?, header = true, all_varchar = false)", [src]
        )
        build_specialty(con, seed=42, fractions=(0.7, 0.1, 0.2), min_count=1)
        build_faq(con, BUNDLED_DATA, seed=42, k_folds=5)
    finally:
        con.close()


def run_all(db: Path, seeds: list[int], models: list[str], overrides: dict[str, dict] | None = None,
            faq_models: list[str] | None = None) -> None:
    """Specialty runs (models x seeds), then the FAQ runs named in faq_models (None = all of FAQ_MODELS)."""
    from medtx.text.experiment import run_text_experiment

    overrides = overrides or {}
    for model in models:
        for seed in seeds:
            run_text_experiment(db, "specialty", model, seed, overrides.get(model))
    for model, faq_overrides in FAQ_MODELS:
        if faq_models is None or model in faq_models:
            run_text_experiment(db, "faq", model, 0, {**faq_overrides, **overrides.get(f"faq_{model}", {})})


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
    from medtx.db import transaction

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


ENCODER_LAYERS = {"minilm": 6}  # all-MiniLM-L6-v2: 6 transformer layers (for "top K of N" labels)

# How a BERT-family run used its encoder, from ml.runs.config: '' (trained end to end, or not a BERT),
# 'probe' (frozen encoder + linear probe) or 'top<K>' (only the top K layers fine-tuned).
VARIANT_SQL = """CASE WHEN json_extract_string(r.config, '$.text.freeze_encoder') = 'true' THEN 'probe'
     WHEN json_extract_string(r.config, '$.text.finetune_layers') IS NOT NULL
     THEN 'top' || json_extract_string(r.config, '$.text.finetune_layers') ELSE '' END"""


def model_label(model: str, variant: str) -> str:
    """Row name saying what was trained: e.g. 'minilm, top 2 of 6 layers fine-tuned'."""
    if variant == "probe":
        return f"{model}, frozen encoder + linear probe (not fine-tuned)"
    if variant.startswith("top"):
        n = ENCODER_LAYERS.get(model)
        return f"{model}, top {variant[3:]}{f' of {n}' if n else ''} layers fine-tuned"
    return model


def _fmt(mean, sd) -> str:
    return "—" if mean is None else f"{mean:.3f} ± {sd:.3f}"


def specialty_table(con) -> list[str]:
    rows = con.sql("""
        SELECT r.model, {VARIANT_SQL} AS variant, count(DISTINCT r.run_id) AS seeds, bool_or(r.collapsed) AS collapsed,
               avg(m.value) FILTER (WHERE metric = 'accuracy'), stddev_pop(m.value) FILTER (WHERE metric = 'accuracy'),
               avg(m.value) FILTER (WHERE metric = 'macro_f1'), stddev_pop(m.value) FILTER (WHERE metric = 'macro_f1'),
               avg(m.value) FILTER (WHERE metric = 'weighted_f1'), stddev_pop(m.value) FILTER (WHERE metric = 'weighted_f1'),
               avg(r.train_seconds)
        FROM ml.runs r JOIN ml.metrics m USING (run_id)
        WHERE r.task = 'specialty' AND r.status = 'completed' AND m.split = 'test'
        GROUP BY r.model, variant ORDER BY 7""".replace("{VARIANT_SQL}", VARIANT_SQL)).fetchall()
    summary = dict(con.sql("SELECT metric, value FROM samples.task_summary WHERE task = 'specialty'").fetchall())
    lines = [
        "### MTSamples medical specialty (40 classes, deduplicated, group split 70/10/20, seed 42)",
        "",
        f"Test: {int(summary.get('test_units', 0) or 0)} text groups; label-noise ceiling on test (best reachable accuracy "
        f"when identical texts carry different labels): **{summary.get('label_noise_ceiling_test', float('nan')):.3f}**; "
        f"majority-class share on test {summary.get('majority_class_accuracy_test', float('nan')):.3f}. "
        "Mean ± sd over training seeds of the per-run bootstrap means (10 resamples of 80% of test text groups).",
        "",
        "| model | seeds | accuracy | macro-F1 | weighted-F1 | train s / run | collapse guard |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, variant, seeds, collapsed, a, asd, f, fsd, w, wsd, secs in rows:
        flag = "**COLLAPSED**" if collapsed else "ok"
        lines.append(f"| {model_label(model, variant)} | {seeds} | {_fmt(a, asd)} | {_fmt(f, fsd)} | {_fmt(w, wsd)} | "
                     f"{secs or 0:.0f} | {flag} |")
    lines += ["", *config_lines(con)]
    missing = [m for m in SPECIALTY_MODELS if m not in {r[0] for r in rows}]
    if missing:
        lines += ["", f"Not measured yet in this table: {', '.join(missing)} (run `--run --models ...`)."]
    lines += ["", "Published anchors: CLiGNet 2026 (Bio_ClinicalBERT + label GCN, leakage-free) macro-F1 **0.279**; "
              "the PyHealth book's ClinicalBERT run (accuracy 0.254, macro-F1 0.0116) is a collapsed majority-class "
              "predictor, like `majority` above."]
    return lines


def config_lines(con) -> list[str]:
    """One line per specialty model: the config fields its runs changed from the model's defaults."""
    import dataclasses
    import json

    from medtx.text.experiment import text_config

    rows = con.sql(f"""SELECT r.model, {VARIANT_SQL} AS variant, any_value(r.config) FROM ml.runs r
                       WHERE r.task = 'specialty' AND r.status = 'completed' GROUP BY ALL ORDER BY 1, 2""").fetchall()
    lines = ["Configs recorded in `ml.runs.config` (changes from the defaults in `medtx.text.experiment`); neural "
             "models keep their best epoch on validation macro-F1, test is scored once:"]
    for model, variant, config in rows:
        used = json.loads(config)["text"]
        base = dataclasses.asdict(text_config(model))
        diff = {k: v for k, v in used.items() if k in base and base[k] != v}
        lines.append(f"- `{model_label(model, variant)}`: " + (", ".join(f"{k}={v}" for k, v in sorted(diff.items())) or "defaults"))
    return lines


def faq_table(con) -> list[str]:
    rows = con.sql("""
        SELECT r.model, coalesce(json_extract_string(r.config, '$.faq.embedding'), '') AS emb, r.collapsed,
               max(m.value) FILTER (WHERE metric = 'token_f1'), max(m.sd) FILTER (WHERE metric = 'token_f1'),
               max(m.value) FILTER (WHERE metric = 'exact_match'), max(m.sd) FILTER (WHERE metric = 'exact_match')
        FROM ml.runs r JOIN ml.metrics m USING (run_id)
        WHERE r.task = 'faq' AND r.status = 'completed'
        GROUP BY r.run_id, r.model, emb, r.collapsed ORDER BY 4 DESC""").fetchall()
    lines = [
        "### Mental Health FAQ (98 pairs): held-out paraphrases, 5-fold",
        "",
        "Per fold: index/train on all 98 original questions + the other folds' paraphrases, test on this fold's "
        "paraphrases; pooled; mean ± sd over 10 resamples of 80% of pairs.",
        "",
        "| model | token F1 | exact match | collapse guard |",
        "|---|---|---|---|",
    ]
    for model, emb, collapsed, f, fsd, e, esd in rows:
        name = f"{model} ({emb})" if model == "retrieval" else f"{model} (word-level Transformer)"
        lines.append(f"| {name} | {_fmt(f, fsd)} | {_fmt(e, esd)} | {'**COLLAPSED**' if collapsed else 'ok'} |")
    return lines


def readmission_table(con) -> list[str]:
    """30-day readmission on a synthetic cohort with notes: text models beside the EHR bag-of-codes LR and
    the generator's oracle (the best reachable ranking on this cohort)."""
    rows = con.sql("""
        SELECT r.task, r.model, r.dataset, count(DISTINCT r.run_id), bool_or(r.collapsed),
               avg(m.value) FILTER (WHERE metric = 'auroc'), CASE WHEN count(DISTINCT r.run_id) = 1 THEN avg(m.sd) FILTER (WHERE metric = 'auroc') ELSE stddev_pop(m.value) FILTER (WHERE metric = 'auroc') END,
               avg(m.value) FILTER (WHERE metric = 'auprc'), CASE WHEN count(DISTINCT r.run_id) = 1 THEN avg(m.sd) FILTER (WHERE metric = 'auprc') ELSE stddev_pop(m.value) FILTER (WHERE metric = 'auprc') END,
               avg(m.value) FILTER (WHERE metric = 'rp80'), CASE WHEN count(DISTINCT r.run_id) = 1 THEN avg(m.sd) FILTER (WHERE metric = 'rp80') ELSE stddev_pop(m.value) FILTER (WHERE metric = 'rp80') END
        FROM ml.runs r JOIN ml.metrics m USING (run_id)
        WHERE r.task IN ('readmission', 'readmission_notes') AND r.status = 'completed' AND m.split = 'test'
        GROUP BY ALL ORDER BY 6 DESC""").fetchall()
    if not rows:
        return []
    lines = [
        f"### 30-day readmission from discharge notes (synthetic cohort `{rows[0][2]}`, templated NOTEEVENTS)",
        "",
        "Same patient split as the EHR readmission task; only admissions with a discharge summary. Mean ± sd over "
        "training seeds of the per-run bootstrap means (one seed: the bootstrap sd). `oracle` scores the generator's true probabilities.",
        "",
        "| task | model | seeds | AUROC | AUPRC | RP80 | collapse guard |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, model, _ds, seeds, collapsed, a, asd, p, psd, r, rsd in rows:
        lines.append(f"| {task} | {model} | {seeds} | {_fmt(a, asd)} | {_fmt(p, psd)} | {_fmt(r, rsd)} | "
                     f"{'**COLLAPSED**' if collapsed else 'ok'} |")
    return lines


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
    print(write_section(args.db, readmission_db=readmission_db, notes=notes))


if __name__ == "__main__":
    main()
