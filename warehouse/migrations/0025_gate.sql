-- Issue 43: the gate checks that each task's split is the dataset's one patient split (samples.patient_splits;
-- medtx.tasks.leakage.split_off). split_off: the task's patients (read from raw.admissions) whose task split is
-- another (a split drawn per admission, per task or from another seed); any blocks the task. NULL: a record made
-- before this check.
ALTER TABLE samples.leakage_gate ADD COLUMN split_off BIGINT;
