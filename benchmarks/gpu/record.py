"""Record the result packages a GPU call returned (benchmarks/gpu/run.py's results-*.tar) into this warehouse, then
publish its snapshot, so the leaderboard shows the device's runs beside the CPU ones.

    .venv/bin/python benchmarks/gpu/record.py /work/.device/<call>/       # the folder holding results-*.tar
    .venv/bin/python benchmarks/gpu/record.py OUT --db var/warehouse.duckdb --no-publish

Each package is recorded once (medtx.pipeline.exchange.record_result_package: idempotent, one transaction per
package; the writer computes the intervals and comparisons). The runs' datasets must already be in the warehouse
(their sample tables are what the comparisons pair on): a run whose dataset has no samples here is refused, one line.
Exit 0 when every package was recorded, 1 when some could not be, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _extract(tar_path: Path, into: Path) -> list[Path]:
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")  # no absolute paths, links out of the folder or devices
    return sorted(p for p in into.iterdir() if (p / "manifest.json").exists())


def record(folder: Path, db: Path, models_dir: Path) -> tuple[list[dict], list[str]]:
    """Record every result package inside `folder`'s results-*.tar (or package folders directly in it)."""
    import duckdb

    from medtx.pipeline.exchange import record_result_package
    from medtx.tasks import find_task

    recorded, problems = [], []
    with tempfile.TemporaryDirectory(prefix="medtx-gpu-record-") as scratch:
        packages = [p for p in sorted(folder.iterdir()) if (p / "manifest.json").exists()]
        for tar_path in sorted(folder.glob("results-*.tar")):
            packages += _extract(tar_path, Path(scratch) / tar_path.stem)
        if not packages:
            raise FileNotFoundError(f"{folder}: no results-*.tar and no result package folders")
        for package in packages:
            import pyarrow.parquet as pq

            run = pq.read_table(package / "ml.runs.parquet").to_pylist()
            if not run:
                problems.append(f"{package.name}: empty ml.runs")
                continue
            dataset, task = run[0]["dataset"], run[0]["task"]
            spec = find_task(task)  # readmission_notes: the splits of readmission, the task that builds its samples
            split_task = (spec.builds if spec else None) or task
            with duckdb.connect(str(db), read_only=True) as con:
                have = con.execute("SELECT count(*) FROM samples.splits WHERE dataset = ? AND task = ?",
                                   [dataset, split_task]).fetchall()[0][0]
            if not have:
                problems.append(f"{package.name}: dataset {dataset!r} task {task!r} has no samples in {db}; "
                                "build them here first (benchmarks/gpu/pack.py builds synth_<scale>)")
                continue
            for run_id in record_result_package(db, package, models_dir):
                with duckdb.connect(str(db), read_only=True) as con:
                    status, device, error = con.execute("SELECT status, device, error FROM ml.runs WHERE run_id = ?",
                                                        [run_id]).fetchall()[0]
                recorded.append({"run_id": run_id, "status": status, "device": device,
                                 "error": (error or "")[:200] or None})
    return recorded, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the folder holding results-*.tar (a device call's files)")
    ap.add_argument("--db", type=Path, help="the warehouse (default: the settings' db)")
    ap.add_argument("--no-publish", action="store_true", help="do not publish the dashboard snapshot")
    args = ap.parse_args(argv)
    from medtx.settings import get_settings

    settings = get_settings(db=args.db)
    if not args.folder.is_dir():
        print(f"record.py: {args.folder} is not a folder", file=sys.stderr)
        return 2
    if not Path(settings.db).exists():
        print(f"record.py: no warehouse at {settings.db}", file=sys.stderr)
        return 2
    try:
        recorded, problems = record(args.folder, Path(settings.db), Path(settings.models_dir))
    except FileNotFoundError as exc:
        print(f"record.py: {exc}", file=sys.stderr)
        return 2
    for row in recorded:
        print(json.dumps(row))
    for problem in problems:
        print(f"record.py: not recorded: {problem}", file=sys.stderr)
    from benchmarks.gpu.verdicts import verdict_lines  # each seed's paired verdict and the claim the seeds support

    for line in verdict_lines(Path(settings.db), [r["run_id"] for r in recorded]):
        print(f"verdict: {line}")
    if recorded and not args.no_publish:
        from medtx.publish.snapshot import publish_snapshot

        publish_snapshot(settings.db, settings.snapshot)
        print(f"published {settings.snapshot}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
