"""Deterministic train/val/test splits by unit (patient, or MTSamples text group), stored in `samples.splits`.

The unit ids are sorted, shuffled by a numpy Generator seeded with `seed`, and cut at the cumulative
fractions, so the same ids and seed always give the same split (and the stored table lets a rerun check it).
With at least 3 units, val and test each get at least one.

EHR datasets have ONE patient split: drawn once over every patient of the dataset (raw.patients and
raw.admissions), stored in `samples.patient_splits`, and every EHR task's `samples.splits` rows are that split
restricted to the task's patients (`write_task_splits`), so a patient is train, val or test for every task, every
training seed and the MEDS export alike. A dataset imported from MEDS keeps the splits it came with
(`raw.meds_splits`). Text corpora keep their own unit (text group, FAQ pair): `write_splits`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import duckdb
import numpy as np

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)
DEFAULT_SEED = 42
# The patient split is drawn per number of admissions (1, 2, ADMISSION_STRATA or more; 0: none) and death.
ADMISSION_STRATA = 3


def split_sizes(n: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> tuple[int, int, int]:
    """How many units go to train, val and test (rounded half up; val/test >= 1 when n >= 3)."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
        raise ValueError(f"split fractions must be three non-negative numbers summing to 1, got {fractions}")
    n_val = int(n * fractions[1] + 0.5)
    n_test = int(n * fractions[2] + 0.5)
    if n >= 3:
        n_val, n_test = max(n_val, 1 if fractions[1] > 0 else 0), max(n_test, 1 if fractions[2] > 0 else 0)
    n_val = min(n_val, n)
    n_test = min(n_test, n - n_val)
    return n - n_val - n_test, n_val, n_test


def assign_splits(units: Iterable[int], seed: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[int, str]:
    """unit id -> 'train' | 'val' | 'test'."""
    return _cut(sorted(set(units)), np.random.default_rng(seed), fractions)


def assign_stratified(strata: Mapping[int, int], seed: int,
                      fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[int, str]:
    """unit id -> split, drawn within each stratum (`strata`: unit id -> stratum), strata in sorted order from one
    Generator seeded with `seed`: each stratum of 3 or more units gets a val and a test unit."""
    by_stratum: dict[int, list[int]] = {}
    for unit, stratum in strata.items():
        by_stratum.setdefault(stratum, []).append(unit)
    rng = np.random.default_rng(seed)
    out: dict[int, str] = {}
    for stratum in sorted(by_stratum):
        out.update(_cut(sorted(by_stratum[stratum]), rng, fractions))
    return out


def _cut(ordered: list[int], rng: np.random.Generator, fractions: Sequence[float]) -> dict[int, str]:
    """Shuffle the sorted units with `rng` and cut them at split_sizes."""
    n_train, n_val, _ = split_sizes(len(ordered), fractions)
    out = {}
    for rank, pos in enumerate(rng.permutation(len(ordered))):
        out[ordered[pos]] = "train" if rank < n_train else "val" if rank < n_train + n_val else "test"
    return out


def assign_folds(units: Iterable[int], seed: int, k: int) -> dict[int, int]:
    """unit id -> fold in [0, k), balanced, deterministic from the seed."""
    ordered = sorted(set(units))
    perm = np.random.default_rng(seed).permutation(len(ordered))
    return {ordered[pos]: rank % k for rank, pos in enumerate(perm)}


def write_splits(
    con: duckdb.DuckDBPyConnection, dataset: str, task: str, units: Iterable[int], seed: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> dict[int, str]:
    """Draw the units' split and replace the (dataset, task) rows of `samples.splits`; call inside the builder's
    transaction. For a task whose unit is not the patient (MTSamples text groups); EHR tasks: `write_task_splits`.

    A dataset imported from MEDS keeps the splits it came with (`raw.meds_splits`: the task's own rows, else
    the dataset-wide ones); only units those do not cover are drawn from the seed."""
    assignment = assign_splits(units, seed, fractions)
    assignment.update(given_splits(con, dataset, task, assignment))
    _replace_task_rows(con, dataset, task, assignment, seed)
    return assignment


def dataset_patients(con: duckdb.DuckDBPyConnection, dataset: str) -> dict[int, int]:
    """Every patient of an EHR dataset (the subject ids of its raw.patients and raw.admissions rows) -> its
    stratum: 2 x its number of admissions (capped at ADMISSION_STRATA; 0: none) + 1 if one of its stays ended in
    an in-hospital death (hospital_expire_flag = 1 or a deathtime)."""
    return dict(con.execute(
        f"""SELECT subject_id, 2 * least(count(DISTINCT hadm_id), {ADMISSION_STRATA})
                               + CAST(bool_or(coalesce(died, false)) AS INTEGER) FROM (
                SELECT subject_id, NULL::BIGINT AS hadm_id, NULL::BOOLEAN AS died FROM raw.patients WHERE dataset = $d
                UNION ALL SELECT subject_id, hadm_id, hospital_expire_flag = 1 OR deathtime IS NOT NULL
                FROM raw.admissions WHERE dataset = $d
            ) WHERE subject_id IS NOT NULL GROUP BY 1""", {"d": dataset}).fetchall())


def draw_patient_splits(con: duckdb.DuckDBPyConnection, dataset: str, seed: int,
                        fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[int, str]:
    """patient id -> split for every patient of the dataset: one seeded draw over all of them, stratified by the
    number of admissions and by in-hospital death (`dataset_patients`), the dataset-wide rows of `raw.meds_splits`
    (a dataset imported from MEDS) winning. Reads, writes nothing.

    Why stratified: a task over visit histories holds only patients with 2 or more admissions, a small share of a
    small cohort (14 of the demo's 100), and a task predicting in-hospital death needs deaths in its validation
    split to select a model; drawn per stratum, each stratum of 3 or more patients gets val and test patients, so those
    tasks keep validation and test patients (and deaths) instead of depending on chance. Stratifying on an outcome
    only balances it across the splits (as a stratified split does); no feature sees it. It reads raw admissions
    only, never a task's cohort, so every task's builder draws the same split."""
    assignment = assign_stratified(dataset_patients(con, dataset), seed, fractions)
    assignment.update(given_splits(con, dataset, None, assignment))
    return assignment


def write_patient_splits(con: duckdb.DuckDBPyConnection, dataset: str, seed: int,
                         fractions: Sequence[float] = DEFAULT_FRACTIONS) -> dict[int, str]:
    """Draw the dataset's patient split (`draw_patient_splits`) and replace its rows of `samples.patient_splits`.
    The same raw patients, seed and fractions always give the same rows, so every EHR task's builder may rewrite
    it; call inside the builder's transaction."""
    assignment = draw_patient_splits(con, dataset, seed, fractions)
    con.execute("DELETE FROM samples.patient_splits WHERE dataset = $d", {"d": dataset})
    if assignment:
        con.execute("INSERT INTO samples.patient_splits SELECT $d, unnest($ids), unnest($splits), $seed",
                    {"d": dataset, "ids": list(assignment), "splits": list(assignment.values()), "seed": seed})
    return assignment


def write_task_splits(
    con: duckdb.DuckDBPyConnection, dataset: str, task: str, patients: Iterable[int], seed: int,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
) -> dict[int, str]:
    """An EHR task's split: each of its patients takes the dataset's patient split (`write_patient_splits`,
    rewritten here), a task row of `raw.meds_splits` (a medtx MEDS export's per-task split) winning. Replaces the
    (dataset, task) rows of `samples.splits`; call inside the builder's transaction."""
    everyone = write_patient_splits(con, dataset, seed, fractions)
    wanted = set(patients)
    missing = sorted(wanted - everyone.keys())
    if missing:  # the samples are built from raw.admissions, which the draw covers: a bug, never data
        raise ValueError(f"{task} [{dataset}]: {len(missing)} sample patient(s) have no patient split "
                         f"(first: subject {missing[0]})")
    assignment = {p: everyone[p] for p in sorted(wanted)}
    assignment.update(given_splits(con, dataset, task, assignment))
    _replace_task_rows(con, dataset, task, assignment, seed)
    return assignment


def _replace_task_rows(con: duckdb.DuckDBPyConnection, dataset: str, task: str, assignment: dict[int, str],
                       seed: int) -> None:
    con.execute("DELETE FROM samples.splits WHERE dataset = $d AND task = $t", {"d": dataset, "t": task})
    if assignment:
        con.execute(
            "INSERT INTO samples.splits SELECT $d, $t, unnest($ids), unnest($splits), $seed",
            {"d": dataset, "t": task, "ids": list(assignment), "splits": list(assignment.values()), "seed": seed},
        )


def given_splits(con: duckdb.DuckDBPyConnection, dataset: str, task: str | None,
                 units: Iterable[int]) -> dict[int, str]:
    """unit id -> split for the units `raw.meds_splits` assigns (task rows win over dataset-wide rows; task None:
    the dataset-wide rows only)."""
    rows = con.execute(
        """SELECT subject_id, arg_min(split, task IS NULL) FROM raw.meds_splits
           WHERE dataset = $d AND (task = $t OR task IS NULL) AND subject_id IN (SELECT unnest($ids))
           GROUP BY subject_id""",
        {"d": dataset, "t": task, "ids": list(units)},
    ).fetchall()
    return dict(rows)


def split_counts(assignment: dict[int, str]) -> dict[str, int]:
    """Units per split, for the task summary."""
    return {f"{s}_units": sum(1 for v in assignment.values() if v == s) for s in SPLITS}


def tasks_off_patient_split(con: duckdb.DuckDBPyConnection, dataset: str) -> dict[str, int]:
    """task -> how many of its patients sit in another split than the dataset's patient split
    (`samples.patient_splits`), for the tasks with any: samples built by an older medtx (per-task splits) or with
    another seed than the dataset's last build; a dataset imported from MEDS with per-task splits also shows here."""
    return dict(con.execute(
        """SELECT s.task, count(*) FROM samples.splits s JOIN samples.patient_splits p USING (dataset, subject_id)
           WHERE s.dataset = $d AND s.split <> p.split GROUP BY 1 ORDER BY 1""", {"d": dataset}).fetchall())
