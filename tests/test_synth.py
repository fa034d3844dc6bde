"""Synthetic cohort generator: determinism, MIMIC-III format, fitted shapes, exact and learnable ground truth.

One small cohort (1,500 patients, notes on) is generated once per module and ingested, with the bundled demo,
into a real DuckDB warehouse through the real ingest and NDC->ATC-3 mapping stages.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from typer.testing import CliRunner

from medtx.codes.mapping import map_prescriptions
from medtx.codes.reference import load_reference_tables
from medtx.store.db import connect
from medtx.ingest import ingest_mimic3
from medtx.synth import generate_mimic3, load_params
from medtx.synth.fit import calibrate_drug_bias, fit_params
from medtx.synth.generate import MIMIC_TABLES, ORACLE_TABLES
from medtx.synth.oracle import OracleFilesMissing, load_oracle

DATA = Path(__file__).resolve().parent.parent / "data"
DEMO = DATA / "mimic3_demo"
N_PATIENTS = 1_500
DATASET = "synth_test"


@pytest.fixture(scope="module")
def cohort(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("synth") / DATASET
    return generate_mimic3(out, N_PATIENTS, seed=7, notes=True)


@pytest.fixture(scope="module")
def warehouse(cohort, tmp_path_factory: pytest.TempPathFactory):
    """Demo + synthetic cohort ingested, drugs mapped to ATC-3, oracle loaded; yields (connection, ingest results)."""
    tmp = tmp_path_factory.mktemp("wh")
    db = tmp / "warehouse.duckdb"
    ingest_mimic3(db, DEMO, "mimic3_demo", tmp / "cache")
    results = ingest_mimic3(db, cohort.out_dir, DATASET, tmp / "cache")
    con = connect(db)
    load_reference_tables(con, DATA)
    map_prescriptions(con, DATASET)
    load_oracle(con, cohort.out_dir, DATASET)
    yield con, results
    con.close()


def _read(cohort, table: str) -> pl.DataFrame:
    df = pl.read_csv(cohort.out_dir / f"{table}.csv.gz", infer_schema=False)
    return df.rename({c: c.lower() for c in df.columns})


def _header(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        return f.readline().strip().lower().split(",")


def test_same_seed_writes_byte_identical_files(tmp_path: Path) -> None:
    a = generate_mimic3(tmp_path / "a", 120, seed=5)
    b = generate_mimic3(tmp_path / "b", 120, seed=5)
    c = generate_mimic3(tmp_path / "c", 120, seed=6)
    names = [f"{t}.csv.gz" for t in (*MIMIC_TABLES[:-1], *ORACLE_TABLES)]
    for name in names:
        assert (a.out_dir / name).read_bytes() == (b.out_dir / name).read_bytes(), name
    assert (a.out_dir / "PRESCRIPTIONS.csv.gz").read_bytes() != (c.out_dir / "PRESCRIPTIONS.csv.gz").read_bytes()
    assert not (a.out_dir / "NOTEEVENTS.csv.gz").exists()  # notes only on request
    assert "SYNTHETIC DATA" in (a.out_dir / "README.md").read_text()


def test_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_patients"):
        generate_mimic3(tmp_path, 0)
    with pytest.raises(ValueError, match="seed"):
        generate_mimic3(tmp_path, 10, seed=-1)


def test_columns_and_types_match_the_demo(cohort) -> None:
    """Same columns as the demo, and every column parses with the types DuckDB detects in the demo."""
    con = duckdb.connect()
    for table in MIMIC_TABLES:
        demo, synth = DEMO / f"{table}.csv.gz", cohort.out_dir / f"{table}.csv.gz"
        assert _header(synth) == _header(demo), table
        if table == "NOTEEVENTS":  # the demo's NOTEEVENTS is header only: nothing to detect types from
            continue
        types = con.sql(f"DESCRIBE SELECT * FROM read_csv('{demo}')").fetchall()
        columns = ", ".join(f"'{name.upper()}': '{typ}'" for name, typ, *_ in types)
        n = con.sql(f"SELECT count(*) FROM read_csv('{synth}', header=true, auto_detect=false, "
                    f"columns={{{columns}}})").fetchall()[0][0]
        assert n == cohort.rows[table], table


def test_ingest_loses_no_row(cohort, warehouse) -> None:
    con, results = warehouse
    by_table = {r.table: r for r in results}
    for table in MIMIC_TABLES:
        result = by_table[table.lower()]
        assert (result.rows_loaded, result.rows_rejected) == (cohort.rows[table], 0), table
    for table in ("synth_oracle_drug_rec", "synth_oracle_next_visit", "synth_oracle_readmission"):
        n = con.execute(f"SELECT count(*) FROM raw.{table} WHERE dataset = ?", [DATASET]).fetchall()[0][0]
        assert n == cohort.rows[table.replace("synth_", "").upper()]
    # Columns the demo always fills are filled in the synthetic cohort too.
    for table, column in [("admissions", "admittime"), ("patients", "dob"), ("prescriptions", "startdate"),
                          ("diagnoses_icd", "icd9_code"), ("admissions", "admission_type")]:
        nulls = con.execute(f"SELECT count(*) FILTER (WHERE {column} IS NULL) FROM raw.{table} WHERE dataset = ?",
                            [DATASET]).fetchall()[0][0]
        assert nulls == 0, (table, column)


def test_shapes_follow_the_fitted_parameters(cohort) -> None:
    params = load_params()
    adm = _read(cohort, "ADMISSIONS")
    visits = adm.group_by("subject_id").len()
    p_multi = 1 - params["visits"]["pmf"][0]
    sd = np.sqrt(p_multi * (1 - p_multi) / N_PATIENTS)
    assert abs((visits["len"] >= 2).mean() - p_multi) < 4 * sd
    patients = _read(cohort, "PATIENTS")
    assert abs((patients["gender"] == "F").mean() - params["patients"]["female_share"]) < 0.06

    # First admissions: diagnoses per visit and the most frequent codes' shares follow the fitted shares.
    first = adm.sort("admittime").group_by("subject_id").first()["hadm_id"]
    dx = _read(cohort, "DIAGNOSES_ICD").filter(pl.col("hadm_id").is_in(first.implode()))
    share = dict(zip(params["diagnoses"]["codes"], params["diagnoses"]["share"], strict=True))
    assert dx.height / N_PATIENTS == pytest.approx(sum(share.values()), rel=0.1)
    observed = dx.group_by("icd9_code").len()
    for code, n in observed.sort("len", descending=True).head(5).iter_rows():
        p = share[code]
        assert abs(n / N_PATIENTS - p) < 4 * np.sqrt(p * (1 - p) / N_PATIENTS) + 0.01, code
    assert set(dx["icd9_code"]) <= set(share)  # only real ICD-9 codes from the fitted vocabulary

    rx = _read(cohort, "PRESCRIPTIONS")
    assert 60 < rx.height / adm.height < 120  # demo: 85 rows per admission
    no_ndc = (rx["ndc"].is_null() | (rx["ndc"] == "0")).mean()
    assert 0.08 < no_ndc < 0.2  # demo: 14 %
    repeated = rx.group_by("hadm_id", "ndc").len()
    assert (repeated["len"] > 1).mean() > 0.2  # the same drug prescribed again within a visit


def test_drug_labels_are_exact_and_the_oracle_is_calibrated(warehouse) -> None:
    con, _ = warehouse
    routes = dict(con.execute("SELECT route, count(*) FROM core.prescriptions_atc3 WHERE dataset = ? GROUP BY 1",
                              [DATASET]).fetchall())
    assert "name" not in routes  # noise rows never reach a label through the drug-name fallback
    labels, missing, expected = con.execute("""
        WITH lab AS (SELECT DISTINCT hadm_id, atc3 FROM core.prescriptions_atc3 WHERE dataset = $d)
        SELECT (SELECT count(*) FROM lab),
               (SELECT count(*) FROM lab LEFT JOIN raw.synth_oracle_drug_rec o
                    ON o.dataset = $d AND o.hadm_id = lab.hadm_id AND o.atc3 = lab.atc3 WHERE o.prob IS NULL),
               (SELECT sum(prob) FROM raw.synth_oracle_drug_rec WHERE dataset = $d)""", {"d": DATASET}).fetchall()[0]
    assert missing == 0  # every label is one the generator drew (mapping gives exactly the drawn ATC-3)
    assert abs(labels - expected) < 4 * np.sqrt(expected)


def test_planted_drug_dependence_is_learnable(cohort, warehouse) -> None:
    """Logistic regression on the visit's codes beats a constant predictor; the oracle beats both."""
    con, _ = warehouse
    drugs = load_params()["drugs"]
    planted = sorted({drugs["atc3"][a] for _, a in drugs["dx_effects"]})  # drugs with indicator diagnoses
    atc3 = con.execute("SELECT atc3 FROM core.prescriptions_atc3 WHERE dataset = ? AND list_contains(?, atc3) "
                       "GROUP BY 1 ORDER BY abs(count(DISTINCT hadm_id) - ?), atc3 LIMIT 1",
                       [DATASET, planted, cohort.rows["ADMISSIONS"] // 3]).fetchall()[0][0]
    frame = con.sql(f"""
        SELECT a.hadm_id, list(DISTINCT d.icd9_code) AS dx,
               bool_or(l.atc3 IS NOT NULL) AS y, any_value(o.prob) AS oracle
        FROM raw.admissions a
        JOIN raw.diagnoses_icd d ON d.dataset = a.dataset AND d.hadm_id = a.hadm_id
        LEFT JOIN core.prescriptions_atc3 l ON l.dataset = a.dataset AND l.hadm_id = a.hadm_id AND l.atc3 = '{atc3}'
        LEFT JOIN raw.synth_oracle_drug_rec o ON o.dataset = a.dataset AND o.hadm_id = a.hadm_id AND o.atc3 = '{atc3}'
        WHERE a.dataset = '{DATASET}' GROUP BY a.hadm_id ORDER BY a.hadm_id""").pl()
    vocab = {c: i for i, c in enumerate(sorted({c for codes in frame["dx"] for c in codes}))}
    x = np.zeros((frame.height, len(vocab)))
    for row, codes in enumerate(frame["dx"]):
        x[row, [vocab[c] for c in codes]] = 1
    y = frame["y"].to_numpy()
    cut = int(0.7 * len(y))
    model = LogisticRegression(C=0.3, max_iter=500).fit(x[:cut], y[:cut])
    lr_auc = roc_auc_score(y[cut:], model.predict_proba(x[cut:])[:, 1])
    oracle_auc = roc_auc_score(y[cut:], frame["oracle"].fill_null(0.0).to_numpy()[cut:])
    assert lr_auc > 0.6, (atc3, lr_auc)  # a constant predictor has AUROC 0.5
    assert oracle_auc > lr_auc - 0.02, (atc3, oracle_auc, lr_auc)


def _readmission_labels(adm: pl.DataFrame) -> pl.DataFrame:
    """MISSION.md task 4 from ADMISSIONS alone: a later non-elective admission < 30 days after discharge."""
    adm = adm.with_columns(pl.col("admittime", "dischtime").str.to_datetime()).sort("subject_id", "admittime")
    later = adm.join(adm.select("subject_id", pl.col("admittime").alias("next_admit"),
                                pl.col("admission_type").alias("next_type")), on="subject_id")
    later = later.filter((pl.col("next_admit") > pl.col("admittime")) & (pl.col("next_type") != "ELECTIVE"))
    first_next = later.group_by("hadm_id").agg(pl.col("next_admit").min())
    out = adm.filter(pl.col("hospital_expire_flag") == "0").join(first_next, on="hadm_id", how="left")
    return out.select("hadm_id", ((pl.col("next_admit") - pl.col("dischtime")).dt.total_seconds() < 30 * 86400)
                      .fill_null(False).alias("label"))


def test_readmission_oracle_is_calibrated_and_informative(cohort) -> None:
    labels = _readmission_labels(_read(cohort, "ADMISSIONS")).with_columns(pl.col("hadm_id").cast(pl.Int64))
    oracle = pl.read_csv(cohort.out_dir / "ORACLE_READMISSION.csv.gz")
    both = labels.join(oracle, on="hadm_id")
    assert both.height == labels.height
    expected, observed = both["prob"].sum(), both["label"].sum()
    assert observed > 30
    assert abs(observed - expected) < 4 * np.sqrt(expected)
    assert roc_auc_score(both["label"].to_numpy(), both["prob"].to_numpy()) > 0.6


def test_death_depends_on_what_is_known_at_48h_and_its_oracle_is_calibrated(cohort) -> None:
    """Issue 33: in-hospital death is no longer a coin flip. Its oracle (P(death | age, admission type, earlier
    stays' diagnoses, admission number)) matches the observed deaths and ranks them well above chance."""
    adm = _read(cohort, "ADMISSIONS").select(pl.col("hadm_id").cast(pl.Int64),
                                              pl.col("hospital_expire_flag").cast(pl.Int64).alias("died"))
    oracle = pl.read_csv(cohort.out_dir / "ORACLE_MORTALITY.csv.gz")
    both = adm.join(oracle, on="hadm_id")
    assert both.height == adm.height  # one probability per admission
    expected, observed = both["prob"].sum(), both["died"].sum()
    assert observed > 100 and abs(observed - expected) < 4 * np.sqrt(expected)
    assert roc_auc_score(both["died"].to_numpy(), both["prob"].to_numpy()) > 0.7


def test_the_planted_death_code_changes_only_the_diagnoses(cohort, tmp_path: Path) -> None:
    """--plant-death-code adds V667 at discharge of most dying stays, from its own random stream: every other file
    is byte-identical to the cohort without it, and the code sits on dying stays far more than on the others."""
    from medtx.synth.death import LEAK_CODE

    planted = generate_mimic3(tmp_path / DATASET, N_PATIENTS, seed=7, notes=True, plant_death_code=True)
    for path in sorted(cohort.out_dir.glob("*.csv.gz")):
        same = path.read_bytes() == (planted.out_dir / path.name).read_bytes()
        assert same == (path.name != "DIAGNOSES_ICD.csv.gz"), path.name
    dx = pl.read_csv(planted.out_dir / "DIAGNOSES_ICD.csv.gz", infer_schema=False)
    adm = _read(cohort, "ADMISSIONS")
    leak = set(dx.filter(pl.col("ICD9_CODE") == LEAK_CODE)["HADM_ID"]) - set(
        _read(cohort, "DIAGNOSES_ICD").filter(pl.col("icd9_code") == LEAK_CODE)["hadm_id"])
    died = set(adm.filter(pl.col("hospital_expire_flag") == "1")["hadm_id"])
    assert len(leak & died) / len(died) > 0.8 and len(leak - died) / (adm.height - len(died)) < 0.02
    assert "planted leak: diagnosis V667" in (planted.out_dir / "README.md").read_text()


def test_next_visit_oracle_is_calibrated(cohort) -> None:
    adm = _read(cohort, "ADMISSIONS").sort("subject_id", "admittime")
    pairs = adm.select("hadm_id", pl.col("hadm_id").shift(-1).over("subject_id").alias("next_hadm")).drop_nulls()
    dx = _read(cohort, "DIAGNOSES_ICD").select(pl.col("hadm_id").alias("next_hadm"), "icd9_code")
    labels = pairs.join(dx, on="next_hadm").select(pl.col("hadm_id").cast(pl.Int64), "icd9_code")
    oracle = pl.read_csv(cohort.out_dir / "ORACLE_NEXT_VISIT.csv.gz", schema_overrides={"icd9_code": pl.String})
    assert set(oracle["hadm_id"]) == set(pairs["hadm_id"].cast(pl.Int64))
    covered = labels.join(oracle, on=["hadm_id", "icd9_code"], how="left")
    assert covered["prob"].null_count() / labels.height < 0.08  # labels whose prob < 1e-3 (left out)
    expected = oracle["prob"].sum()
    observed = covered["prob"].is_not_null().sum()
    assert abs(observed - expected) < 4 * np.sqrt(expected)


def test_discharge_notes_name_the_visit_diagnoses(cohort) -> None:
    params = load_params()
    titles = dict(zip(params["diagnoses"]["codes"], params["diagnoses"]["titles"], strict=True))
    notes = _read(cohort, "NOTEEVENTS")
    assert notes.height == cohort.rows["ADMISSIONS"]
    assert set(notes["category"]) == {"Discharge summary"}
    primary = _read(cohort, "DIAGNOSES_ICD").filter(pl.col("seq_num") == "1").select("hadm_id", "icd9_code")
    joined = notes.join(primary, on="hadm_id").head(200)
    for text, code in joined.select("text", "icd9_code").iter_rows():
        assert titles[code] in text


def test_load_oracle_is_idempotent_and_checks_files(cohort, tmp_path: Path) -> None:
    con = connect(tmp_path / "w.duckdb")
    try:
        first = load_oracle(con, cohort.out_dir, "a")
        assert load_oracle(con, cohort.out_dir, "a") == first  # replaced, not appended
        load_oracle(con, cohort.out_dir, "b")
        empty = tmp_path / "not_synth"
        empty.mkdir()
        with pytest.raises(OracleFilesMissing, match="ORACLE_DRUG_REC"):
            load_oracle(con, empty, "a")
        counts = dict(con.sql("SELECT dataset, count(*) FROM raw.synth_oracle_readmission GROUP BY 1").fetchall())
        assert counts == {"a": cohort.rows["ORACLE_READMISSION"], "b": cohort.rows["ORACLE_READMISSION"]}
    finally:
        con.close()


def test_cli_writes_a_folder_that_ingest_reads(tmp_path: Path) -> None:
    from flows.cli import app

    out = tmp_path / "synth_25"
    result = CliRunner().invoke(app, ["synth", "mimic3", "--patients", "25", "--seed", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {f"{t}.csv.gz" for t in ("PATIENTS", "ADMISSIONS", "PRESCRIPTIONS")} <= {p.name for p in out.iterdir()}
    results = ingest_mimic3(tmp_path / "w.duckdb", out, None, tmp_path / "cache")
    assert {r.dataset for r in results} == {"synth_25"}


def test_fit_reproduces_the_committed_parameters() -> None:
    params = fit_params(DATA)
    params["drugs"]["bias"] = calibrate_drug_bias(params)
    committed = load_params()
    assert params.keys() == committed.keys()
    for key in ("patients", "visits", "diagnoses", "procedures"):
        assert params[key] == committed[key], key
    assert params["drugs"] == committed["drugs"]


def test_no_synthetic_death_is_implausible() -> None:
    """Issue 34: a 46,520-patient cohort (seed 0) had subject 1031105 discharged at 18 and dead 238 years later
    (dod 2409-11-15, the ingest's implausible_year rule). Chunks are seeded by (seed, chunk), so simulating the
    chunk that holds it (31) and the first three (3,000 patients, synth_2000's among them) is what that cohort
    holds: every dod is on or after the last stay's discharge day, inside the plausible years, and at a real age
    (a MIMIC-shifted dob counts as 90 at the first admission) of at most MAX_DEATH_AGE."""
    from medtx.ingest.plausibility import YEARS
    from medtx.synth.generate import (CHUNK_PATIENTS, MAX_DEATH_AGE, PARAMS_PATH, SHIFTED_AGE, SUBJECT_ID_START,
                                      Generator)

    gen = Generator(load_params(PARAMS_PATH))
    for chunk in (0, 1, 2, 31):
        subjects = SUBJECT_ID_START + np.arange(chunk * CHUNK_PATIENTS, (chunk + 1) * CHUNK_PATIENTS)
        frames = gen.simulate_chunk(np.random.default_rng([0, chunk]), subjects, 0)
        stays = frames["ADMISSIONS"].group_by("subject_id").agg(first=pl.col("admittime").min(),
                                                                 last=pl.col("dischtime").max())
        dead = frames["PATIENTS"].join(stays, on="subject_id").filter(pl.col("dod").is_not_null()).with_columns(
            age_first=(pl.col("first") - pl.col("dob")).dt.total_seconds() / (365.25 * 86_400))
        dead = dead.with_columns(real_age_death=pl.col("age_first").clip(upper_bound=SHIFTED_AGE)
                                 + (pl.col("dod") - pl.col("first")).dt.total_seconds() / (365.25 * 86_400))
        assert dead.height > 200, chunk
        assert dead.filter(pl.col("dod") < pl.col("last").dt.truncate("1d")).height == 0, chunk
        assert dead.filter(~pl.col("dod").dt.year().is_between(*YEARS)).height == 0, chunk
        assert dead["real_age_death"].max() <= MAX_DEATH_AGE + 1 / 365, chunk
        if chunk == 31:
            [(dob, dod)] = dead.filter(pl.col("subject_id") == 1_031_105).select("dob", "dod").rows()
            assert str(dob.date()) == "2153-07-09" and dod.year <= 2153 + MAX_DEATH_AGE, dod


def test_the_cohort_passes_the_ingest_plausibility_checks(warehouse) -> None:
    con, _ = warehouse
    assert con.execute("SELECT rule, table_name, n_rows, example FROM raw.ingest_checks WHERE dataset = ?",
                       [DATASET]).fetchall() == []
