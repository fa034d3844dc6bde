-- MEDS import (owner: medtx.meds). What `medtx ingest meds` kept beside the raw MIMIC-format tables.

-- Splits a MEDS dataset brought with it (metadata/subject_splits.parquet, mapped train/tuning/held_out ->
-- train/val/test). The sample builders use them instead of drawing their own split for that dataset.
-- task NULL: the dataset-wide MEDS split (every task); a task name: medtx's own per-task split, which a medtx
-- export also writes (metadata/medtx_task_splits.parquet) so a round trip keeps every task's split.
CREATE TABLE raw.meds_splits (
    dataset    VARCHAR NOT NULL,
    task       VARCHAR,
    subject_id BIGINT NOT NULL,
    split      VARCHAR NOT NULL CHECK (split IN ('train', 'val', 'test'))
);

-- Code accounting of one MEDS import: per code prefix (the mapping rule that matched, or the code's first
-- `//` segment when none did), the table it went to (NULL: not mapped), how many distinct codes and rows.
CREATE TABLE raw.meds_codes (
    dataset      VARCHAR NOT NULL,
    prefix       VARCHAR NOT NULL,
    target_table VARCHAR,
    n_codes      BIGINT NOT NULL,
    n_rows       BIGINT NOT NULL
);
