"""Record the result packages a GPU call returned (benchmarks/gpu/run.py's results-*.tar) into this warehouse, then
publish its snapshot, so the leaderboard shows the device's runs beside the CPU ones.

    .venv/bin/python benchmarks/gpu/record.py /work/.device/<call>/       # the folder holding results-*.tar
    .venv/bin/python benchmarks/gpu/record.py OUT --db var/warehouse.duckdb --no-publish

The same path and guards as the pipeline's own recording: the warehouse's writer file is held for the whole
command (a live pipeline makes it wait, then refuse: exit 1); each package is checked and recorded on its own by
medtx.pipeline.exchange.record_result_package (one transaction, never replacing a run the warehouse holds; the
writer computes the intervals and comparisons), after its training data is checked against this warehouse: the
data fingerprint the training package carried (tables and scope as the worker read them) must equal this
warehouse's fingerprint of the same tables, so a run trained on other data under the same dataset name is
refused. A bad tar or package is one line naming it and the others are still recorded. Inputs are never deleted
(tars are unpacked into a scratch folder; package folders are read in place). Exit 0 when every package was
recorded, 2 when some input was refused (bad input), 1 when the warehouse is busy.
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


def _same_data(db: Path, package: Path) -> str | None:
    """Why the package's training data is not this warehouse's (None when it is): its data fingerprint, recomputed
    here on the same tables and scope (medtx.pipeline.exchange.package_fingerprint)."""
    from medtx.pipeline.exchange import package_fingerprint
    from medtx.store.db import open_warehouse

    data = json.loads((package / "manifest.json").read_text()).get("trained_on_data") or {}
    want, tables, scope = data.get("fingerprint"), data.get("tables"), data.get("scope")
    if not isinstance(want, str) or not isinstance(tables, list) or not isinstance(scope, dict):
        return ("its manifest carries no data fingerprint (trained by an older medtx?); cannot tell it was trained "
                "on this warehouse's data")
    with open_warehouse(db, read_only=True) as con:
        here = package_fingerprint(con, [str(t) for t in tables], scope)
    if here != want:
        return (f"trained on other data than this warehouse holds for {scope} (data fingerprint {want}, here "
                f"{here}); build the same samples here first (benchmarks/gpu/pack.py)")
    return None


def record(folder: Path, db: Path, models_dir: Path) -> tuple[list[dict], list[str]]:
    """Record every result package inside `folder`'s results-*.tar (or package folders directly in it), each on
    its own: (recorded runs, one line per input refused)."""
    import duckdb

    from medtx.pipeline.exchange import record_result_package
    from medtx.store.db import open_warehouse
    from medtx.training.integrity import PackageDamaged

    recorded, problems = [], []
    with tempfile.TemporaryDirectory(prefix="medtx-gpu-record-") as scratch:
        packages = [p for p in sorted(folder.iterdir()) if (p / "manifest.json").exists()]
        tars = sorted(folder.glob("results-*.tar"))
        if not packages and not tars:
            raise FileNotFoundError(f"{folder}: no results-*.tar and no result package folders")
        for tar_path in tars:
            try:
                packages += _extract(tar_path, Path(scratch) / tar_path.stem)
            except (tarfile.TarError, OSError, EOFError) as exc:
                problems.append(f"{tar_path}: not a readable tar ({type(exc).__name__}: {exc})")
        for package in packages:
            try:
                why = _same_data(db, package)
                if why is not None:
                    problems.append(f"{package.name}: {why}")
                    continue
                run_ids = record_result_package(db, package, models_dir, cleanup=False)  # inputs are never deleted
            except (PackageDamaged, ValueError, OSError, duckdb.Error) as exc:
                problems.append(f"{package.name}: {' '.join(str(exc).split())}")
                continue
            for run_id in run_ids:
                with open_warehouse(db, read_only=True) as con:
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
    from medtx.store.writer_lock import HolderFileDamaged, WarehouseBusy, hold_writer

    settings = get_settings(db=args.db)
    if not args.folder.is_dir():
        print(f"record.py: {args.folder} is not a folder", file=sys.stderr)
        return 2
    if not Path(settings.db).is_file():
        print(f"record.py: no warehouse at {settings.db}", file=sys.stderr)
        return 2
    try:
        with hold_writer(settings.db, "benchmarks/gpu/record.py",
                         say=lambda line: print(f"record.py: {line}", file=sys.stderr)):
            recorded, problems = record(args.folder, Path(settings.db), Path(settings.models_dir))
            for row in recorded:
                print(json.dumps(row))
            for problem in problems:
                print(f"record.py: not recorded: {problem}", file=sys.stderr)
            from benchmarks.gpu.verdicts import verdict_lines  # each seed's paired verdict, the claim the seeds support

            for line in verdict_lines(Path(settings.db), [r["run_id"] for r in recorded]):
                print(f"verdict: {line}")
            if recorded and not args.no_publish:
                from medtx.publish.snapshot import publish_snapshot

                publish_snapshot(settings.db, settings.snapshot)
                print(f"published {settings.snapshot}")
    except WarehouseBusy as exc:
        print(f"record.py: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, HolderFileDamaged) else 1
    except FileNotFoundError as exc:
        print(f"record.py: {exc}", file=sys.stderr)
        return 2
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
