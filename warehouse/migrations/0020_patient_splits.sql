-- One patient split per EHR dataset (issue 43). Drawn once over every patient of the dataset (raw.patients and
-- raw.admissions) from the samples stage's seed, or taken from raw.meds_splits for a dataset imported from MEDS
-- (medtx/samples/splits.py). Every EHR task's samples.splits rows are this split restricted to its patients, and
-- the MEDS export's subject_splits.parquet is this table, so a patient is train, val or test for every task.
-- Written by every EHR task's samples step (the same rows each time). Warehouses built before this migration have
-- per-task splits in samples.splits until their samples are rebuilt (the samples steps' code changed, so the
-- pipeline rebuilds them; `medtx build-samples` does too).
CREATE TABLE samples.patient_splits (
    dataset    VARCHAR NOT NULL,
    subject_id BIGINT NOT NULL,
    split      VARCHAR NOT NULL CHECK (split IN ('train', 'val', 'test')),
    seed       INTEGER NOT NULL,
    PRIMARY KEY (dataset, subject_id)
);
