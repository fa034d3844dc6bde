"""An ACES task is a medtx task (issue 45): a task config written for ACES, declared by name, gives medtx samples
whose labels and prediction times ACES itself extracted, whose features are the clock-bounded history at those
times, which pass the leakage gate and train medtx's models.

Real tools only: es-aces 0.7.3 from the pinned venv tests/test_meds_tools.py builds (cached by its pins' hash;
es-aces pins polars<2, so it runs as a subprocess, MEDTX_ACES), on the bundled demo and a 300-patient synthetic
cohort. The reference configs: MEDS-DEV's hospital readmission task with MEDS-DEV's MIMIC-IV predicates, copied
unchanged from the meds-dev 0.0.14 package (tests/aces/meds_dev/, MIT, attribution in each file); medtx's own
config/aces/{readmission,mortality}.yaml (the built-in tasks written in ACES); one task of our own
(tests/aces/discharged_within_7d.yaml).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest

from medtx.codes import map_codes
from medtx.ingest import ingest_mimic3
from medtx.meds import export_meds
from medtx.aces.run import AcesError
from medtx.samples.common import EmptyCohortError
from medtx.store.db import connect
from medtx.synth import generate_mimic3
from medtx.tasks import get_task, task_names
from medtx.aces.task import AcesSpec, declare, declared
from medtx.tasks.build import build_samples
from medtx.tasks.leakage import require_pass, run_gate
from medtx.pipeline.steps import train_in_process
from tests.conftest import DATA, REPO_ROOT
from tests.test_meds_tools import _run, _tools_venv

pytestmark = pytest.mark.slow

FIXTURES = REPO_ROOT / "tests" / "aces"
MEDS_DEV = FIXTURES / "meds_dev"
DEMO, SYNTH = "mimic3_demo", "synth_aces"
SPECS = (
    AcesSpec("aces_readmission", REPO_ROOT / "config" / "aces" / "readmission.yaml"),
    AcesSpec("aces_mortality", REPO_ROOT / "config" / "aces" / "mortality.yaml"),
    AcesSpec("medsdev_readmission", MEDS_DEV / "readmission_general_hospital_30d.yaml",
             MEDS_DEV / "mimic_iv_predicates.yaml"),
    AcesSpec("discharged_within_7d", FIXTURES / "discharged_within_7d.yaml"),
)
NAMES = [s.name for s in SPECS]
FEATURES = "subject_id, hadm_id, prediction_time, label, conditions, procedures, drugs"


@pytest.fixture(scope="module")
def aces_env():
    """MEDTX_ACES -> the pinned venv's aces-cli, and the four ACES tasks declared; both undone after the module
    (the registry of the rest of the session has no ACES task)."""
    before = os.environ.get("MEDTX_ACES")
    os.environ["MEDTX_ACES"] = str(_tools_venv("eval") / "aces-cli")
    declare(list(SPECS))
    yield _tools_venv("eval")
    declare([])
    if before is None:
        os.environ.pop("MEDTX_ACES", None)
    else:
        os.environ["MEDTX_ACES"] = before


@pytest.fixture(scope="module")
def warehouse(aces_env, tmp_path_factory):
    """The demo and a 300-patient synthetic cohort, codes mapped, the built-in readmission and mortality tasks and
    the four ACES tasks built on both."""
    root = tmp_path_factory.mktemp("aces-tasks")
    db = root / "warehouse.duckdb"
    generate_mimic3(root / "synth", n_patients=300, seed=7)
    ingest_mimic3(db, DATA / "mimic3_demo", DEMO, root / "cache")
    ingest_mimic3(db, root / "synth", SYNTH, root / "cache")
    con = connect(db)
    try:
        map_codes(con, DATA, [DEMO, SYNTH])
        counts = build_samples(con, DATA, ["readmission", "mortality", *NAMES], [DEMO, SYNTH])
    finally:
        con.close()
    return db, counts, root


def test_declared_tasks_are_registered_binary_ehr_tasks(aces_env):
    assert set(NAMES) <= set(task_names()) and [s.name for s in declared()] == sorted(NAMES)
    task = get_task("medsdev_readmission")
    assert (task.kind, task.family, task.samples.table, task.samples.shared) == ("binary", "ehr",
                                                                             "samples.admission_outcome", True)
    assert task.applies_to("logreg") and task.applies_to("gru") and not task.applies_to("oracle")
    assert str(MEDS_DEV / "mimic_iv_predicates.yaml") in task.lineage.files  # a changed YAML invalidates the cache
    with pytest.raises(ValueError, match="a built-in task has that name"):
        declare([*SPECS, AcesSpec("mortality", FIXTURES / "discharged_within_7d.yaml")])
    declare(list(SPECS))
    with pytest.raises(ValueError, match="lower-case letters"):
        declare([AcesSpec("Bad-Name", FIXTURES / "x.yaml")])
    assert set(NAMES) <= set(task_names())


def _aces_cli_labels(bin_: Path, export: Path, spec: AcesSpec, out: Path) -> pl.DataFrame:
    """ACES's own extraction, run by hand as docs/MEDS.md shows: aces-cli on `medtx export meds`, every shard."""
    shards = _run([bin_ / "expand_shards", export / "data"]).strip().splitlines()[-1]
    cmd = [bin_ / "aces-cli", "--multirun", "data=sharded", "data.standard=meds", f"data.root={export / 'data'}",
           f"data.shard={shards}", f"config_path={spec.config}", f"output_filepath={out}/${{data.shard}}.parquet",
           f"log_dir={out / 'logs'}", f"hydra.sweep.dir={out / 'logs'}"]
    if spec.predicates:
        cmd.append(f"predicates_path={spec.predicates}")
    _run(cmd)
    return pl.read_parquet(out / "**" / "*.parquet").select("subject_id", "prediction_time", "boolean_value")


def test_aces_route_labels_equal_aces_own_extraction(aces_env, warehouse, tmp_path):
    """On both cohorts, every ACES task: the samples' (subject, prediction time, label) are exactly the rows aces-cli
    itself writes over `medtx export meds` - none missing, none extra, none with another label."""
    db, counts, _ = warehouse
    con = connect(db)
    try:
        exports = {d: export_meds(con, d, tmp_path / "meds" / d).out for d in (DEMO, SYNTH)}
        for dataset, export in exports.items():
            for spec in SPECS:
                ours = pl.DataFrame(con.execute(
                    "SELECT subject_id, prediction_time, label FROM samples.admission_outcome "
                    "WHERE dataset = ? AND task = ?", [dataset, spec.name]).fetchall(),
                    schema=["subject_id", "prediction_time", "label"], orient="row")
                theirs = _aces_cli_labels(aces_env, export, spec, tmp_path / "aces" / dataset / spec.name)
                both = ours.join(theirs, on=["subject_id", "prediction_time"], how="full", coalesce=True)
                missing = both.filter(pl.col("label").is_null()).height
                extra = both.filter(pl.col("boolean_value").is_null()).height
                differ = both.filter(pl.col("label") != pl.col("boolean_value")).height
                assert (missing, extra, differ) == (0, 0, 0), (dataset, spec.name, both.head(5))
                assert ours.height == theirs.height == counts[(spec.name, dataset)] > 40, (dataset, spec.name)
                assert 0 < ours["label"].sum() < ours.height, (dataset, spec.name)  # both classes present
                excluded = con.execute("SELECT value FROM samples.task_summary WHERE dataset = ? AND task = ? "
                                       "AND metric = 'excluded_no_stay'", [dataset, spec.name]).fetchall()
                assert excluded == [(0.0,)]
    finally:
        con.close()


def test_aces_route_equals_the_builtin_route(warehouse):
    """config/aces/readmission.yaml and mortality.yaml through ACES give exactly the built-in tasks' samples: the
    same stays, prediction times, labels and features (history lists in order; mortality's static tokens too)."""
    db, counts, _ = warehouse
    con = duckdb.connect(str(db), read_only=True)
    try:
        for dataset in (DEMO, SYNTH):
            for builtin, table, aces, columns in (
                    ("readmission", "samples.readmission", "aces_readmission", FEATURES),
                    ("mortality", "samples.admission_outcome", "aces_mortality", FEATURES + ", static")):
                where = "dataset = $d" + (" AND task = $b" if builtin == "mortality" else "")
                ours = f"SELECT {columns} FROM samples.admission_outcome WHERE dataset = $d AND task = $a"
                theirs = f"SELECT {columns} FROM {table} WHERE {where}"
                params = {"d": dataset, "a": aces, **({"b": builtin} if builtin == "mortality" else {})}
                diff = con.execute(f"({ours} EXCEPT ALL {theirs}) UNION ALL ({theirs} EXCEPT ALL {ours})",
                                   params).fetchall()
                assert diff == [], (dataset, builtin, diff[:3])
                assert counts[(aces, dataset)] == counts[(builtin, dataset)] > 50
                # the same patients in the same splits (the split is drawn by patient with the same seed)
                split_diff = con.execute(
                    "SELECT count(*) FROM samples.splits a JOIN samples.splits b USING (dataset, subject_id) "
                    "WHERE a.dataset = ? AND a.task = ? AND b.task = ? AND a.split <> b.split",
                    [dataset, aces, builtin]).fetchall()[0][0]
                assert split_diff == 0
    finally:
        con.close()


def test_gate_passes_and_checks_acess_prediction_times(warehouse, tmp_path):
    """Every ACES task passes the gate on both cohorts; moving one ACES prediction time before its stay's drugs
    were known makes the gate block the task (it reads ACES's times, not the sample rows' own)."""
    db, _, _ = warehouse
    con = duckdb.connect(str(db), read_only=True)
    try:
        for dataset in (DEMO, SYNTH):
            for name in NAMES:
                assert require_pass(con, get_task(name), dataset) == "pass", (dataset, name)
    finally:
        con.close()
    copy = tmp_path / "tampered.duckdb"
    shutil.copy(db, copy)
    con = connect(copy)
    try:
        hadm, pt = con.execute(
            "SELECT hadm_id, prediction_time FROM samples.admission_outcome WHERE dataset = ? AND task = "
            "'aces_mortality' AND len(drugs[-1]) > 0 ORDER BY hadm_id LIMIT 1", [DEMO]).fetchall()[0]
        con.execute("UPDATE samples.aces_labels SET prediction_time = prediction_time - INTERVAL 47 HOUR "
                    "WHERE dataset = ? AND task = 'aces_mortality' AND stay_hadm_id = ?", [DEMO, hadm])
        result = run_gate(con, get_task("aces_mortality"), DEMO)
        assert result.blocked and f"hadm_id {hadm}" in result.message, result.message
    finally:
        con.close()


def test_logreg_and_gru_train_on_aces_tasks(warehouse):
    """logreg and a GRU (1 epoch) train on the MEDS-DEV readmission task and on our own task, with test metrics
    and intervals recorded like any built-in task's runs, and the model card names ACES's clock."""
    from medtx.evaluation.card import build_card

    db, _, _ = warehouse
    runs = {(name, model): train_in_process(db, get_task(name), model, 0, {"epochs": 1} if model == "gru" else None,
                                            dataset=SYNTH if name == "medsdev_readmission" else DEMO)
            for name in ("medsdev_readmission", "discharged_within_7d") for model in ("logreg", "gru")}
    con = duckdb.connect(str(db), read_only=True)
    try:
        for (name, model), run_id in runs.items():
            status, n_test = con.execute("SELECT status, n_test_units FROM ml.runs WHERE run_id = ?",
                                         [run_id]).fetchall()[0]
            auroc = con.execute("SELECT value, ci_low, ci_high FROM ml.metrics WHERE run_id = ? AND split = 'test' "
                                "AND metric = 'auroc'", [run_id]).fetchall()
            assert status == "completed" and n_test > 5 and len(auroc) == 1 and None not in auroc[0], (name, model)
        card = build_card(con, runs[("discharged_within_7d", "logreg")]).html()
        assert "discharged_within_7d.yaml" in card and "samples.aces_labels" in card
    finally:
        con.close()


def test_what_medtx_refuses_or_cannot_build(aces_env, warehouse, tmp_path):
    """One clear line each: ACES not installed; a config giving several prediction times in one stay; a config
    ACES itself rejects; a cohort without a label; a task predicted before any stay (every row counted as
    excluded, none built); a MEDS-DEV task whose predicates this data cannot satisfy (ICU) builds nothing."""
    db, _, _ = warehouse
    copy = tmp_path / "w.duckdb"
    shutil.copy(db, copy)
    cases = {
        "every_medication": (AcesSpec("every_medication", FIXTURES / "every_medication.yaml"), AcesError,
                             "prediction times in one stay"),
        "not_aces": (AcesSpec("not_aces", MEDS_DEV / "mimic_iv_predicates.yaml"), AcesError, "aces failed"),
        "no_label": (AcesSpec("no_label", FIXTURES / "no_label.yaml"), AcesError, "wrote no label"),
        "at_birth": (AcesSpec("at_birth", FIXTURES / "at_birth.yaml"), EmptyCohortError, "before any admission"),
        "icu_mortality": (AcesSpec("icu_mortality", MEDS_DEV / "mortality_in_icu_first_24h.yaml",
                                   MEDS_DEV / "mimic_iv_predicates.yaml"), EmptyCohortError, "no sample"),
    }
    declare([*SPECS, *(spec for spec, _, _ in cases.values())])
    con = connect(copy)
    try:
        for name, (spec, error, words) in cases.items():
            with pytest.raises(error) as caught:
                build_samples(con, DATA, [name], [DEMO])
            message = str(caught.value)
            assert "\n" not in message and words in message.lower(), (name, message)
            assert con.execute("SELECT count(*) FROM samples.admission_outcome WHERE task = ?", [name]).fetchall() \
                == [(0,)]
        rows, no_stay = con.execute("SELECT count(*), count(*) FILTER (WHERE stay_hadm_id IS NULL) FROM "
                                    "samples.aces_labels WHERE task = 'at_birth'").fetchall()[0]
        assert rows == no_stay > 50  # ACES's rows are kept, each marked as having no stay
        os.environ["MEDTX_ACES"] = str(tmp_path / "no-such-aces-cli")
        with pytest.raises(AcesError, match="ACES not found .*MEDTX_ACES=.*es-aces==0.7.3"):
            build_samples(con, DATA, ["discharged_within_7d"], [DEMO])
    finally:
        os.environ["MEDTX_ACES"] = str(aces_env / "aces-cli")
        declare(list(SPECS))
        con.close()


def test_published_snapshot_carries_aces_tasks_to_the_dashboard(warehouse, tmp_path):
    """After training, the published snapshot's marts count the ACES tasks' samples and rank their runs; a dashboard
    process that never read the pipeline config knows them as tasks (from samples.aces_tasks in the snapshot)."""
    from dashboard import validate
    from dashboard.app import create_app
    from medtx.publish.snapshot import open_snapshot, publish_snapshot

    db, _, _ = warehouse
    copy = tmp_path / "w.duckdb"
    shutil.copy(db, copy)
    snapshot = tmp_path / "w.snapshot.duckdb"
    publish_snapshot(copy, snapshot)
    con = open_snapshot(snapshot)
    try:
        counted = {r[0] for r in con.execute("SELECT DISTINCT task FROM dash.sample_counts").fetchall()}
        ranked = {r[0] for r in con.execute("SELECT DISTINCT task FROM dash.leaderboard").fetchall()}
        recorded = con.execute("SELECT task, config, config_text FROM samples.aces_tasks ORDER BY task").fetchall()
    finally:
        con.close()
    assert set(NAMES) <= counted and {"medsdev_readmission", "discharged_within_7d"} <= ranked
    assert [r[0] for r in recorded] == sorted(NAMES)
    assert dict((r[0], r[2]) for r in recorded)["discharged_within_7d"] == (FIXTURES / "discharged_within_7d.yaml").read_text()
    declare([])
    try:
        with pytest.raises(Exception, match="is not one of"):
            validate.task("discharged_within_7d")
        create_app(snapshot)
        assert validate.task("discharged_within_7d") == "discharged_within_7d"
        assert set(NAMES) <= set(task_names())
    finally:
        declare(list(SPECS))


def test_medtx_train_knows_the_aces_tasks_the_warehouse_built(warehouse, tmp_path):
    """`medtx train --task <an ACES task>` in a process that never read the pipeline config: the warehouse's
    samples.aces_tasks declares it; a name no warehouse knows is still refused."""
    from typer.testing import CliRunner

    from flows.cli import app

    db, _, _ = warehouse
    copy = tmp_path / "w.duckdb"
    shutil.copy(db, copy)
    declare([])
    try:
        r = CliRunner().invoke(app, ["train", "--task", "discharged_within_7d", "--model", "logreg", "--dataset", DEMO,
                                     "--db", str(copy)])
        assert r.exit_code == 0, r.output
        assert "discharged_within_7d" in task_names()
        r = CliRunner().invoke(app, ["train", "--task", "no_such_task", "--model", "logreg", "--dataset", DEMO,
                                     "--db", str(copy)])
        assert r.exit_code == 1 and "unknown task 'no_such_task'" in r.output, r.output
    finally:
        declare(list(SPECS))
