-- Issue 45: an ACES task is a medtx task (medtx/aces/task.py). ACES's own extraction, every row it wrote, per
-- (dataset, task): the subject, the prediction time and the label exactly as ACES gave them, and the stay medtx
-- hangs the sample's history on (the admission holding the prediction time; NULL: the subject has no admission at
-- or before it, so the row is counted as excluded in samples.task_summary, never dropped unseen). The sample
-- builder and the leakage gate read each sample's prediction time from here (the task's clock).
CREATE TABLE samples.aces_labels (
    dataset         VARCHAR NOT NULL,
    task            VARCHAR NOT NULL,
    subject_id      BIGINT NOT NULL,
    prediction_time TIMESTAMP NOT NULL,
    label           BOOLEAN NOT NULL,
    stay_hadm_id    BIGINT,
    PRIMARY KEY (dataset, task, subject_id, prediction_time)
);

-- The ACES tasks this warehouse has built (one row per task, rewritten by each build): where their configs were
-- and their text at that build, so a process that never read the pipeline config (the dashboard over a published
-- snapshot) knows them as tasks (medtx.aces.task.declare_recorded), and a card can show what ACES ran.
CREATE TABLE samples.aces_tasks (
    task            VARCHAR PRIMARY KEY,
    config          VARCHAR NOT NULL,
    predicates      VARCHAR,
    config_text     VARCHAR NOT NULL,
    predicates_text VARCHAR,
    built_at        TIMESTAMP NOT NULL
);
