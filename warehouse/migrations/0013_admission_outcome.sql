-- samples.admission_outcome: one generic table for binary outcomes of a single admission, so that a new
-- admission-level task (medtx/tasks/<name>.py) needs no migration. Rows are told apart by `task`; features
-- are that admission's own codes, stored as one-visit histories [[codes]] so the EHR models read them like
-- samples.readmission.
CREATE TABLE samples.admission_outcome (
    dataset    VARCHAR NOT NULL,
    task       VARCHAR NOT NULL,
    subject_id BIGINT NOT NULL,
    hadm_id    BIGINT NOT NULL,
    admittime  TIMESTAMP,
    conditions VARCHAR[][] NOT NULL,
    procedures VARCHAR[][] NOT NULL,
    drugs      VARCHAR[][] NOT NULL,
    label      BOOLEAN NOT NULL,
    PRIMARY KEY (dataset, task, hadm_id)
);
