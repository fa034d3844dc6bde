"""The honest EHR tasks' figures before and after the one patient split (issue 43), side by side.

    python benchmarks/one_split_before_after.py run --tree /path/to/medtx --out before.json
    python benchmarks/one_split_before_after.py run --tree . --out after.json
    python benchmarks/one_split_before_after.py table before.json after.json

`run` runs `medtx pipeline` of the code tree `--tree` (PYTHONPATH; e.g. a worktree of commit 8a61ef9, before the
one split) on a fresh warehouse in a temporary folder: the 2,000-patient synthetic cohort of config/default.yaml
(generator seed 0, no notes), readmission and mortality, logreg and the oracle, training seed 42 (the split seed
both ways: before, the first training seed; after, `split_seed`, default 42). It then reads, with the same tree's
task registry, per task: samples, positive labels and patients per split, and each run's test AUROC and AUPRC with
their 95% patient-bootstrap intervals; JSON to `--out`. `table` prints the two side by side (Markdown).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = """
datasets:
  - source: synth:2000
    seed: 0
seeds: [42]
tasks:
  readmission:
    models: [{model: logreg}, {model: oracle}]
  mortality:
    models: [{model: logreg}, {model: oracle}]
runner: {torch_threads: 1}
"""
TASKS = ("readmission", "mortality")
DATASET = "synth_2000"


def query(db: Path) -> dict:
    """Figures of the warehouse, read with the task registry of the tree on PYTHONPATH."""
    import duckdb

    from medtx.store.db import quote_ident, quote_table
    from medtx.tasks import get_task

    out: dict = {"tasks": {}}
    with duckdb.connect(str(db), read_only=True) as con:
        for name in TASKS:
            task = get_task(name)
            own_sql = " AND s.task = $task" if task.samples.shared else ""
            rows = con.execute(
                f"""SELECT p.split, count(*), sum(CAST(s.{quote_ident(task.samples.label_column)} AS INTEGER)),
                           count(DISTINCT s.subject_id)
                    FROM {quote_table(task.samples.table)} s JOIN samples.splits p ON p.dataset = s.dataset
                         AND p.task = $split_task AND p.subject_id = s.subject_id
                    WHERE s.dataset = $dataset{own_sql} GROUP BY 1 ORDER BY 1""",
                {"dataset": DATASET, "split_task": task.samples_task,
                 **({"task": name} if task.samples.shared else {})}).fetchall()
            runs = con.execute(
                """SELECT r.model, r.status, m.metric, m.value, m.ci_low, m.ci_high FROM ml.runs r
                   JOIN ml.metrics m ON m.run_id = r.run_id AND m.split = 'test' AND m.metric IN ('auroc', 'auprc')
                   WHERE r.task = ? AND r.dataset = ? ORDER BY 1, 3""", [name, DATASET]).fetchall()
            out["tasks"][name] = {
                "splits": {s: {"samples": n, "positives": int(pos or 0), "patients": pts} for s, n, pos, pts in rows},
                "runs": [{"model": m, "status": st, "metric": k, "value": v, "ci": [lo, hi]}
                         for m, st, k, v, lo, hi in runs]}
        shared = con.execute(
            f"""SELECT count(*), count(*) FILTER (WHERE a.split <> b.split),
                       count(*) FILTER (WHERE (a.split = 'train') <> (b.split = 'train')
                                        AND 'test' IN (a.split, b.split))
                FROM samples.splits a JOIN samples.splits b USING (dataset, subject_id)
                WHERE dataset = '{DATASET}' AND a.task = 'readmission' AND b.task = 'mortality'""").fetchall()[0]
        out["shared_patients"] = {"shared": shared[0], "apart": shared[1], "train_vs_test": shared[2]}
    return out


def run(tree: Path, out: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="medtx-one-split-"))
    try:
        (work / "config.yaml").write_text(CONFIG)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
            "PYTHONPATH": str(tree.resolve()), "PREFECT_HOME": str(work / "prefect"),
            **{f"MEDTX_{k}_DIR": str(work / k.lower()) for k in ("CACHE", "RESULTS", "MODELS", "EXCHANGE")}}
        db = work / "var" / "warehouse.duckdb"
        done = subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", "pipeline", "--config",
                               str(work / "config.yaml"), "--db", str(db)], cwd=work, env=env, capture_output=True,
                              text=True)
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        figures = subprocess.run([sys.executable, __file__, "query", str(db)], env=env, capture_output=True,
                                 text=True, check=True).stdout
        result = json.loads(figures) | {"tree": str(tree.resolve()), "exit_status": done.returncode,
                                        "commit": subprocess.run(["git", "-C", str(tree), "rev-parse", "--short",
                                                                  "HEAD"], capture_output=True,
                                                                 text=True).stdout.strip()}
        out.write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(before: dict, after: dict) -> str:
    lines = [f"| task | figure | before ({before['commit']}) | after ({after['commit']}) |", "|---|---|---|---|"]
    for name in TASKS:
        b, a = before["tasks"][name], after["tasks"][name]
        for key in ("samples", "positives"):
            lines.append(f"| {name} | all {key} | {sum(x[key] for x in b['splits'].values())} | "
                         f"{sum(x[key] for x in a['splits'].values())} |")
        for split in ("train", "val", "test"):
            for key in ("samples", "positives", "patients"):
                lines.append(f"| {name} | {split} {key} | {b['splits'].get(split, {}).get(key, '-')} | "
                             f"{a['splits'].get(split, {}).get(key, '-')} |")
        for model in ("logreg", "oracle"):
            for metric in ("auroc", "auprc"):
                cell = []
                for side in (b, a):
                    r = [x for x in side["runs"] if x["model"] == model and x["metric"] == metric]
                    cell.append(f"{r[0]['value']:.3f} [{r[0]['ci'][0]:.3f}, {r[0]['ci'][1]:.3f}]" if r else "-")
                lines.append(f"| {name} | {model} test {metric} | {cell[0]} | {cell[1]} |")
    sb, sa = before["shared_patients"], after["shared_patients"]
    lines.append(f"| both | patients shared by readmission and mortality / in different splits / train for one "
                 f"and test for the other | {sb['shared']} / {sb['apart']} / {sb['train_vs_test']} | "
                 f"{sa['shared']} / {sa['apart']} / {sa['train_vs_test']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--tree", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    q = sub.add_parser("query")
    q.add_argument("db", type=Path)
    t = sub.add_parser("table")
    t.add_argument("before", type=Path)
    t.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.tree, args.out)
    elif args.command == "query":
        print(json.dumps(query(args.db)))
    else:
        print(table(json.loads(args.before.read_text()), json.loads(args.after.read_text())))


if __name__ == "__main__":
    main()
