-- Tasks with a clock (issue 33). Every EHR sample row stores its prediction time: the moment the task predicts
-- (medtx.tasks: Task.prediction_time over the index admission), after which no feature event may be timed
-- (event times: medtx/tasks/clock.py). Rows built before this migration have NULL until their task is rebuilt.
ALTER TABLE samples.drug_rec ADD COLUMN prediction_time TIMESTAMP;
ALTER TABLE samples.next_visit ADD COLUMN prediction_time TIMESTAMP;
ALTER TABLE samples.readmission ADD COLUMN prediction_time TIMESTAMP;
ALTER TABLE samples.admission_outcome ADD COLUMN prediction_time TIMESTAMP;
-- Tokens known at admission (age band, sex, admission type) as a one-visit history; NULL for tasks without them.
ALTER TABLE samples.admission_outcome ADD COLUMN static VARCHAR[][];

-- The leakage gate (medtx.tasks.leakage), one row per (dataset, task), rewritten each time it runs (after the
-- task's samples are built, and before its trainings with the config's acknowledgements):
-- (a) split_overlap: patients (text groups) whose samples sit in more than one split, the patient read from
--     raw.admissions by hadm_id, not from the sample row;
-- (b) late_codes: feature codes that no event of the patient, source and code explains at or before the
--     sample's prediction time, recomputed from raw.admissions and the task's clock (not the stored column),
--     plus rows whose stored prediction_time disagrees with it; NULL: not checked (a task without a clock);
-- (c) shortcuts: single features that alone reach validation AUROC >= 0.95 (binary) or reproduce the label
--     set (multi-label), listed in samples.leakage_shortcuts.
-- status: 'blocked' when (a) or (b) found anything (the task's trainings are refused), 'suspect' when (c)
-- flagged a feature that the config does not acknowledge, else 'pass'.
CREATE TABLE samples.leakage_gate (
    dataset       VARCHAR NOT NULL,
    task          VARCHAR NOT NULL,
    status        VARCHAR NOT NULL CHECK (status IN ('pass', 'suspect', 'blocked')),
    samples       BIGINT NOT NULL,
    split_overlap BIGINT NOT NULL,
    late_codes    BIGINT,
    shortcuts     INTEGER NOT NULL,
    acknowledged  INTEGER NOT NULL,   -- shortcuts the config acknowledges (leakage.acknowledge)
    message       VARCHAR NOT NULL,   -- one line: the verdict and the first offending row or feature
    created_at    TIMESTAMP NOT NULL,   -- when the gate ran (a volatile column: not part of the table's fingerprint)
    PRIMARY KEY (dataset, task)
);

CREATE TABLE samples.leakage_shortcuts (
    dataset      VARCHAR NOT NULL,
    task         VARCHAR NOT NULL,
    feature      VARCHAR NOT NULL,   -- the feature column
    token        VARCHAR NOT NULL,   -- the code (binary), or '*' for the whole column (multi-label)
    metric       VARCHAR NOT NULL,   -- 'val_auroc' (presence of the token; max of it and 1 - it) or 'val_exact_share'
    value        DOUBLE NOT NULL,
    acknowledged BOOLEAN NOT NULL,
    PRIMARY KEY (dataset, task, feature, token)
);

-- The synthetic cohort's ground truth of in-hospital death (ORACLE_MORTALITY.csv.gz, medtx/synth/death.py):
-- P(death in this admission | what is known 48 hours after admission), for every admission.
CREATE TABLE raw.synth_oracle_mortality (
    dataset VARCHAR NOT NULL,
    hadm_id BIGINT NOT NULL,
    prob    DOUBLE NOT NULL
);
