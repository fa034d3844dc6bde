"""Memory bounds of a full-scale run (issue #35): DuckDB's memory limit on every warehouse connection medtx opens
(MEDTX_DUCKDB_MEMORY_LIMIT / the pipeline config's `runner.duckdb_memory_limit`, refused in one line when it
is not a size), and training packages whose tables are read only when a run asks for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from medtx.pipeline.executor import duckdb_memory_limit
from medtx.pipeline.config import RunnerConfig
from medtx.pipeline.exchange import export_training_package
from medtx.runtime.train_processes import call_in, training_processes
from medtx.store.db import MEMORY_LIMIT_ENV, auto_memory_limit, cgroup_memory_limit, connect
from medtx.training.packages import PackageError, read_training_package
from tests import fixtures_samples

REPO = Path(__file__).resolve().parent.parent
demo_db, demo_copy = fixtures_samples.demo_db, fixtures_samples.demo_copy  # fixtures: the built demo warehouse
GIB = 1 << 30
ALLOWED = ("not a DuckDB memory limit; allowed: auto (1/32 of the machine's memory, 1-8 GiB) or a size of at least "
           "256MiB such as 2GiB or 1500MB")


def _shown(size: str) -> str:
    """How DuckDB itself shows a memory limit set to `size` (its current_setting text, e.g. '1.4 GiB')."""
    with duckdb.connect() as con:
        con.execute(f"SET memory_limit = '{size}'")
        return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def _limit(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MEDTX_"))}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _medtx(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from flows.cli import main; main()", *args], capture_output=True,
                          text=True, env=env, timeout=300, cwd=REPO, check=False)


def _lines(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]


def test_every_warehouse_connection_gets_the_memory_limit(tmp_path: Path, monkeypatch) -> None:
    db = tmp_path / "w.duckdb"
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    with connect(db) as con:  # auto: DuckDB's own default is 80% of the machine's memory
        assert _limit(con) == _shown(f"{auto_memory_limit()}B") != _shown("80%")
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1500MiB")
    with connect(db) as con:
        assert _limit(con) == _shown("1500MiB") == "1.4 GiB"
    with connect(db, read_only=True) as con:
        assert _limit(con) == "1.4 GiB"
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "768MB")
    with connect(db, read_only=True) as con:
        assert _limit(con) == _shown("768MB") == "732.4 MiB"


def test_auto_is_a_32nd_of_the_memory_between_1_and_8_gib(tmp_path: Path) -> None:
    assert auto_memory_limit(24 * GIB) == GIB  # this machine: 0.75 GiB, raised to the floor
    assert auto_memory_limit(64 * GIB) == 2 * GIB
    assert auto_memory_limit(1024 * GIB) == 8 * GIB
    assert auto_memory_limit(2 * GIB) == GIB
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text(f"{4 * GIB}\n")
    assert cgroup_memory_limit(tmp_path) == 4 * GIB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "unlimited"
    assert cgroup_memory_limit(v1) is None


@pytest.mark.parametrize("value", ["lots", "100MB", "-1GB", "0"])
def test_a_bad_memory_limit_in_the_environment_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    out = _medtx("ingest", "mimic3", "--db", str(tmp_path / "w.duckdb"), env=_env(MEDTX_DUCKDB_MEMORY_LIMIT=value))
    assert out.returncode == 2
    assert _lines(out) == [f"medtx: MEDTX_DUCKDB_MEMORY_LIMIT={value!r}: {ALLOWED}"]
    assert list(tmp_path.iterdir()) == []


def test_a_bad_memory_limit_in_the_config_is_one_line_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(f"datasets:\n  - source: {REPO / 'data' / 'mimic3_demo'}\ntasks:\n  drug_rec:\n    models:\n"
                      "      - {model: most_frequent}\nrunner:\n  duckdb_memory_limit: 12 apples\n")
    for check in ([], ["--check"]):
        out = _medtx("pipeline", "--config", str(config), "--db", str(tmp_path / "w" / "w.duckdb"), *check,
                     env=_env())
        assert out.returncode == 2, out.stderr[-2000:]
        assert _lines(out) == [f"config error: {config}: runner.duckdb_memory_limit = '12 apples': {ALLOWED}"]
        assert not (tmp_path / "w").exists() or list((tmp_path / "w").iterdir()) == []  # no warehouse, no logs


def test_the_configs_limit_reaches_the_runs_processes_and_the_environment_wins(tmp_path: Path,
                                                                               monkeypatch) -> None:
    db = tmp_path / "w.duckdb"
    connect(db).close()
    child = [sys.executable, "-c", "import sys; from medtx.store.db import connect; "
             "c = connect(sys.argv[1], read_only=True); print(c.execute(\"SELECT current_setting('memory_limit')\")"
             ".fetchone()[0])", str(db)]
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    with duckdb_memory_limit(RunnerConfig(duckdb_memory_limit="768MiB").duckdb_memory_limit):
        with connect(db) as con:
            assert _limit(con) == "768.0 MiB"
        # a process the run starts (a training process, a Dask worker) inherits it
        out = subprocess.run(child, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
                             check=False, timeout=120)
        assert out.stdout.strip() == "768.0 MiB", out.stderr[-2000:]
    assert MEMORY_LIMIT_ENV not in os.environ  # the run's setting ends with the run
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "2GiB")
    with duckdb_memory_limit(RunnerConfig(duckdb_memory_limit="768MiB").duckdb_memory_limit), connect(db) as con:
        assert _limit(con) == "2.0 GiB"
    assert os.environ[MEMORY_LIMIT_ENV] == "2GiB"


READS = ("samples.drug_rec", "samples.splits", "samples.vocab", "samples.leakage_gate", "ref.ddi_atc3",
         "raw.synth_oracle_drug_rec")
SCOPE = {"dataset": "mimic3_demo", "task": "drug_rec"}


def test_a_training_package_reads_a_table_only_when_it_is_asked_for(demo_copy: Path, tmp_path: Path) -> None:
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k-lazy")
    manifest, tables = read_training_package(package)  # every file checked here (sha256, row count)
    assert sorted(tables) == sorted(READS) and len(tables) == len(READS) and "raw.synth_oracle_drug_rec" in tables
    oracle = package / "raw.synth_oracle_drug_rec.parquet"
    oracle.rename(tmp_path / "aside.parquet")  # after the checks: only a read of this table would fail now
    for name in READS[:-1]:  # what a run of any model but the oracle reads
        assert tables[name].num_rows == manifest["tables"][name] and tables[name] is tables[name]
    assert "raw.synth_oracle_drug_rec" in tables  # membership reads nothing
    with pytest.raises(PackageError, match=r"raw\.synth_oracle_drug_rec\.parquet: unreadable after the package"):
        tables["raw.synth_oracle_drug_rec"]  # one line naming the file (tests/test_package_tables.py: rewritten)
    (tmp_path / "aside.parquet").rename(oracle)
    assert tables["raw.synth_oracle_drug_rec"].num_rows == manifest["tables"]["raw.synth_oracle_drug_rec"]
    with pytest.raises(KeyError):
        tables["raw.not_in_the_package"]


def test_a_row_count_that_differs_from_the_manifest_is_still_refused_up_front(demo_copy: Path,
                                                                              tmp_path: Path) -> None:
    package = export_training_package(demo_copy, READS, SCOPE, tmp_path / "exchange", "k-rows")
    manifest = json.loads((package / "manifest.json").read_text())
    rows = pq.read_metadata(package / "samples.drug_rec.parquet").num_rows
    manifest["tables"]["samples.drug_rec"] = rows + 1  # the table's file (and its sha256) unchanged
    (package / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=rf"samples\.drug_rec\.parquet: {rows} rows, the manifest says {rows + 1}"):
        read_training_package(package)


_KEPT: list[bytearray] = []


def _fragment(mib: int) -> tuple[int, int, int]:
    """What a training leaves in its process's allocator: `mib` MiB of 64 KiB blocks, written, then all freed but
    every 100th (a block still in use keeps glibc from trimming the heap beneath it). Returns this process's pid
    and its RSS before and at the peak, measured here: the worker has by then imported this module and what it
    imports (duckdb, pyarrow, prefect: over 100 MiB on some machines), which is not what the release is about."""
    before = _rss_mib(os.getpid())
    blocks = [bytearray(b"x" * (64 << 10)) for _ in range(mib * 16)]
    peak = _rss_mib(os.getpid())
    _KEPT.extend(blocks[::100])
    del blocks
    return os.getpid(), before, peak


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) >> 10
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_training_process_gives_back_what_its_training_freed() -> None:
    with training_processes(2) as pool:
        for pid, before, peak in [call_in(pool, _fragment, 600) for _ in range(2)]:  # whichever worker takes it
            assert peak > before + 500, (pid, before, peak)  # the blocks were really there
            # freed 594 of 600 MiB: without the release after each call the process kept it (61 -> 809 MiB measured)
            assert _rss_mib(pid) < before + 150, (pid, before, peak, _rss_mib(pid))
