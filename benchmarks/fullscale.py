"""One pipeline run, measured whole: per-stage wall, CPU and peak RSS of the process tree, rows written, snapshot
size, the ten slowest steps, dashboard latency with 20 concurrent clients, and the load average — one printout.

    .venv/bin/python benchmarks/fullscale.py --config config/full-cpu.yaml          # the full-scale run (issue 35)
    .venv/bin/python benchmarks/fullscale.py --config config/default.yaml --work var/fs-default
    .venv/bin/python benchmarks/fullscale.py --work var/fs --dashboard-only          # re-measure the dashboard

The pipeline runs in this process (flows.pipeline.run_pipeline, its own Prefect server, its training processes
as children) against a fresh warehouse and caches in `--work`. A sampler thread reads, every `--every` seconds,
the RSS of this process and all its descendants (summed: the tree's footprint) and their CPU seconds (live
children's and the reaped ones' `children_*` times), and the load average. A stage's figures come from its steps
in ml.pipeline_steps: wall = from its first step's start to its last step's end; CPU and peak RSS = the tree's over
that window (stages overlap when their steps do: their windows, CPU and peaks then overlap too). Rows written =
each warehouse schema's rows after the run. The dashboard is then served by `medtx dashboard` (waitress, 8 threads)
on the published snapshot and `--clients` threads each load every page `--rounds` times over HTTP, replaying the
exact callback requests a browser sends (dashboard.warm.load_page).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
GIB = 1 << 30
STAGE_TABLES = {"ingest": "raw", "codes": "core", "reference": "ref", "samples": "samples", "train": "ml"}


@dataclass
class Sample:
    t: float
    rss: int
    cpu: float
    load: float
    pss: int = 0  # proportional set size summed: a page shared by n processes counts 1/n in each (RSS counts it n times)


@dataclass
class Sampler:
    """The process tree's summed RSS and CPU seconds, and the 1-minute load average, every `every` seconds."""

    every: float = 1.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _read(self) -> Sample:
        import psutil

        me = psutil.Process()
        rss, pss, cpu = 0, 0, 0.0
        for proc in [me, *me.children(recursive=True)]:
            try:
                full = proc.memory_full_info()  # reads smaps: pss where the kernel has it
                rss += full.rss
                pss += getattr(full, "pss", full.rss)
                times = proc.cpu_times()
                cpu += times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        own = me.cpu_times()
        cpu += own.children_user + own.children_system  # children already reaped
        return Sample(time.time(), rss, cpu, os.getloadavg()[0], pss)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._read())
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self._read())

    def window(self, start: float, end: float) -> tuple[float, int]:
        """(CPU seconds, peak RSS) of the tree between two wall-clock times."""
        inside = [s for s in self.samples if start <= s.t <= end]
        before = [s for s in self.samples if s.t <= start] or self.samples[:1]
        after = [s for s in self.samples if s.t >= end] or self.samples[-1:]
        cpu = after[0].cpu - before[-1].cpu
        return max(cpu, 0.0), max((s.rss for s in inside + before[-1:] + after[:1]), default=0)


def run_pipeline(config: Path, work: Path) -> tuple[str, float]:
    for name in ("cache_dir", "results_dir", "models_dir", "exchange_dir"):
        os.environ[f"MEDTX_{name.upper()}"] = str(work / name)
    os.environ.setdefault("PREFECT_HOME", str(work / "prefect-home"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from flows.pipeline import run_pipeline as flow

    started = time.perf_counter()
    state = flow(config, work / "warehouse.duckdb", return_state=True)
    return str(state.state_details.flow_run_id), time.perf_counter() - started


def warehouse_figures(db: Path, pipeline_run_id: str | None) -> dict:
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        if pipeline_run_id is None:
            found = con.execute("SELECT pipeline_run_id FROM ml.pipeline_runs ORDER BY started_at DESC LIMIT 1"
                                ).fetchall()
            pipeline_run_id = found[0][0] if found else ""
        steps = con.execute(
            "SELECT step, kind, state, seconds, epoch(finished_at) - coalesce(seconds, 0), epoch(finished_at) "
            "FROM ml.pipeline_steps WHERE pipeline_run_id = ?", [pipeline_run_id]).fetchall()
        tables = con.execute("SELECT schema_name, table_name, estimated_size FROM duckdb_tables() "
                             "WHERE schema_name <> 'main'").fetchall()
        rows = {}
        for schema, table, _ in tables:
            from medtx.store.db import quote_ident

            n = con.execute(f"SELECT count(*) FROM {quote_ident(schema)}.{quote_ident(table)}").fetchall()[0][0]
            rows[schema] = rows.get(schema, 0) + n
        runs = con.execute("SELECT status, count(*) FROM ml.runs GROUP BY 1").fetchall()
    return {"pipeline_run_id": pipeline_run_id, "steps": steps, "rows": rows, "runs": dict(runs)}


# ----------------------------------------------------------------------------------------------- dashboard


class _HttpClient:
    """The slice of Flask's test client that dashboard.warm.load_page uses, over real HTTP."""

    def __init__(self, base: str) -> None:
        self.base = base

    def post(self, path: str, json: dict, headers: dict | None = None):  # noqa: A002  (load_page's keyword)
        import json as _json

        request = urllib.request.Request(self.base + path, data=_json.dumps(json).encode(), method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(request, timeout=60) as response:
            return _Response(response.status, response.read())


@dataclass
class _Response:
    status_code: int
    body: bytes

    def get_data(self) -> bytes:
        return self.body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dashboard_latency(db: Path, clients: int, rounds: int) -> dict:
    """Serve the published snapshot with `medtx dashboard`; `clients` threads load every page `rounds` times."""
    from dashboard import create_app, resolve_snapshot
    from dashboard.warm import PAGE_CALLBACKS, load_page

    snapshot = resolve_snapshot(db)
    port = _free_port()
    medtx = [str(Path(sys.executable).with_name("medtx"))] if Path(sys.executable).with_name("medtx").exists() else \
        [sys.executable, "-c", "from flows.cli import main; main()"]
    server = subprocess.Popen([*medtx, "dashboard", "--db", str(db), "--port", str(port)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):  # up to 60 s to start
            try:
                urllib.request.urlopen(base + "/", timeout=2).read()
                break
            except OSError:
                time.sleep(0.5)
        app = create_app(snapshot)  # callback metadata only (ids, inputs); the server answers
        for page in PAGE_CALLBACKS:  # one warm-up load per page (the server's own warm-up may still run)
            load_page(app, _HttpClient(base), page, snapshot)
        per_page: dict[str, list[float]] = {p: [] for p in PAGE_CALLBACKS}
        errors: list[str] = []
        lock = threading.Lock()

        def client() -> None:
            http = _HttpClient(base)
            for _ in range(rounds):
                for page in PAGE_CALLBACKS:
                    try:
                        timings = load_page(app, http, page, snapshot)
                    except Exception as exc:  # a failed callback is counted and named, not hidden
                        with lock:
                            errors.append(f"{page}: {type(exc).__name__}: {exc}"[:200])
                        continue
                    with lock:
                        per_page[page] += [t for _, t, _ in timings]

        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(timeout=30)
    every = [t for ts in per_page.values() for t in ts]
    return {"clients": clients, "rounds": rounds, "wall_s": wall, "callbacks": len(every), "errors": errors,
            "load_before": load_before, "load_after": os.getloadavg()[0],
            "p50_ms": 1000 * _pct(every, 50), "p95_ms": 1000 * _pct(every, 95),
            "pages": {p: {"n": len(ts), "p50_ms": 1000 * _pct(ts, 50), "p95_ms": 1000 * _pct(ts, 95)}
                      for p, ts in per_page.items() if ts}}


def _pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


# ----------------------------------------------------------------------------------------------- printout


def report(fig: dict, sampler: Sampler | None, wall: float | None, db: Path, dash: dict | None) -> str:
    out = [f"# fullscale: {fig.get('config')} ({os.cpu_count()} CPUs, {fig['mem_gib']:.0f} GiB RAM)", ""]
    if sampler is not None and sampler.samples:
        loads = [s.load for s in sampler.samples]
        peak = max(s.rss for s in sampler.samples)
        cpu = sampler.samples[-1].cpu - sampler.samples[0].cpu
        top = max(sampler.samples, key=lambda s: s.pss)
        running = [s[0] for s in fig["steps"] if s[4] is not None and s[5] is not None and s[4] <= top.t <= s[5]]
        out += [f"pipeline wall {wall:.0f} s, CPU {cpu:.0f} s ({cpu / wall:.2f} cores busy on average), peak RSS of "
                f"the process tree {peak / GIB:.2f} GiB (summed RSS: a shared page counts once per process), peak PSS "
                f"{top.pss / GIB:.2f} GiB (shared pages split between their processes) while "
                f"{', '.join(running) or 'no step'} ran; load average (1 min) start {loads[0]:.2f}, max "
                f"{max(loads):.2f}, end {loads[-1]:.2f}", ""]
    steps = fig["steps"]
    out += ["| stage | steps | failed | cached | wall s | step-seconds | CPU s | peak RSS GiB | rows now in its schema |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind in dict.fromkeys(s[1] for s in sorted(steps, key=lambda s: s[4])):
        mine = [s for s in steps if s[1] == kind]
        start, end = min(s[4] for s in mine), max(s[5] for s in mine)
        cpu, peak = sampler.window(start, end) if sampler is not None and sampler.samples else (float("nan"), 0)
        schema = STAGE_TABLES.get(kind)
        out.append(f"| {kind} | {len(mine)} | {sum(s[2] == 'failed' for s in mine)} | "
                   f"{sum(s[2] == 'cached' for s in mine)} | {end - start:.0f} | {sum(s[3] or 0 for s in mine):.0f} | "
                   f"{cpu:.0f} | {peak / GIB:.2f} | {fig['rows'].get(schema, '') if schema else ''} |")
    out += ["", "rows by schema: " + ", ".join(f"{k} {v:,}" for k, v in sorted(fig["rows"].items())),
            "runs: " + ", ".join(f"{k} {v}" for k, v in sorted(fig["runs"].items())), ""]
    snapshot = db.with_name(f"{db.stem}.snapshot{db.suffix}")
    out.append(f"snapshot {snapshot.name}: {snapshot.stat().st_size / 2**20:.0f} MiB; warehouse "
               f"{db.stat().st_size / 2**20:.0f} MiB" if snapshot.exists() else "snapshot: none published")
    out += ["", "ten slowest steps:", "", "| step | state | seconds |", "|---|---|---:|"]
    for step, _, state, seconds, *_ in sorted(steps, key=lambda s: -(s[3] or 0))[:10]:
        out.append(f"| {step} | {state} | {seconds or 0:.1f} |")
    if dash is not None:
        out.append(_dash_lines(dash))
    return "\n".join(out) + "\n"


def _dash_lines(dash: dict) -> str:
    out = []
    if dash is not None:
        out += ["", f"dashboard, {dash['clients']} concurrent clients x {dash['rounds']} rounds of every page over HTTP "
                f"(medtx dashboard, waitress): {dash['callbacks']} callbacks in {dash['wall_s']:.0f} s, p50 "
                f"{dash['p50_ms']:.0f} ms, p95 {dash['p95_ms']:.0f} ms per callback (target p95 < 150 ms: "
                f"{'met' if dash['p95_ms'] < 150 else 'NOT met'}); load {dash['load_before']:.2f} -> "
                f"{dash['load_after']:.2f}; errors {len(dash['errors'])}", "",
                "| page | callbacks | p50 ms | p95 ms |", "|---|---:|---:|---:|"]
        for page, p in dash["pages"].items():
            out.append(f"| {page} | {p['n']} | {p['p50_ms']:.0f} | {p['p95_ms']:.0f} |")
        out += [f"error: {e}" for e in dash["errors"][:5]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import psutil

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "config" / "full-cpu.yaml")
    ap.add_argument("--work", type=Path, default=REPO / "var" / "fullscale", help="fresh warehouse and caches here")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between samples of the process tree")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="loads of every page per client")
    ap.add_argument("--dashboard-only", action="store_true", help="measure the dashboard on --work's warehouse")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if not args.config.exists():
        print(f"fullscale.py: no config {args.config}", file=sys.stderr)
        return 2
    db = args.work / "warehouse.duckdb"
    sampler, wall, run_id = None, None, None
    if not args.dashboard_only:
        if args.work.exists():
            shutil.rmtree(args.work)
        args.work.mkdir(parents=True)
        with Sampler(args.every) as sampler:
            run_id, wall = run_pipeline(args.config, args.work)
    elif not db.exists():
        print(f"fullscale.py: --dashboard-only needs a warehouse at {db}", file=sys.stderr)
        return 2
    fig = warehouse_figures(db, run_id)
    fig["config"], fig["mem_gib"] = str(args.config), psutil.virtual_memory().total / GIB
    print(report(fig, sampler, wall, db, None), flush=True)  # the pipeline's figures first: the dashboard may fail
    dash = None
    if args.clients > 0:
        try:
            dash = dashboard_latency(db, args.clients, args.rounds)
        except Exception as exc:  # reported in one line; the pipeline's figures above stand
            print(f"dashboard latency: not measured ({type(exc).__name__}: {exc})", flush=True)
    if dash is not None:
        print(_dash_lines(dash), flush=True)
    if args.json:
        args.json.write_text(json.dumps({**fig, "wall_s": wall, "dashboard": dash,
                                         "samples": [s.__dict__ for s in sampler.samples] if sampler else []},
                                        default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
