-- Issue 43: the leakage gate without side doors (medtx.tasks.leakage, docs/TASKS.md).
-- (d) clock_bound: samples whose prediction time is at or after their outcome is known (Task.outcome_known);
--     NULL: the task declares no outcome time.
-- (c) audit: the shortcut audit in words (cross-validated AUROC per feature family and on all features over
--     train + validation, and the cut-off with its reference); a flagged family blocks the task unless the
--     config acknowledges it with a reason (samples.leakage_shortcuts.reason). 'suspect' is no longer written.
ALTER TABLE samples.leakage_gate ADD COLUMN clock_bound BIGINT;
ALTER TABLE samples.leakage_gate ADD COLUMN audit VARCHAR;
ALTER TABLE samples.leakage_shortcuts ADD COLUMN reason VARCHAR;   -- the config's reason, when acknowledged

-- Notes follow the clock: readmission's `text` holds only the discharge summaries charted before the patient's
-- next admission began (and within the 30-day window), and text_time is the last one's chart time, the
-- prediction time of the note-text view readmission_notes (medtx.samples.clock.summary_time_sql).
ALTER TABLE samples.readmission ADD COLUMN text_time TIMESTAMP;

-- The fingerprint of the samples the gate judged (medtx.tasks.verdict.samples_fingerprint: the task's sample rows
-- and its split); training refuses samples whose fingerprint differs (issue 44). NULL: a record made before.
ALTER TABLE samples.leakage_gate ADD COLUMN fingerprint VARCHAR;
