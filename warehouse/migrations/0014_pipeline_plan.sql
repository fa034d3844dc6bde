-- pipeline plan: every step a pipeline run will walk, written at its start (medtx.progress), so that while it
-- runs the queued steps are known too, not only the finished ones in ml.pipeline_steps. The dashboard's
-- overview shows done / running / queued / failed from it, and an ETA from expected_seconds.
CREATE TABLE ml.pipeline_plan (
    pipeline_run_id  VARCHAR NOT NULL,
    step             VARCHAR NOT NULL,
    kind             VARCHAR NOT NULL,   -- synth, ingest, reference, codes, samples, train
    position         INTEGER NOT NULL,   -- order of execution within the run
    expected_seconds DOUBLE,             -- the step's duration in the latest earlier run that finished it (NULL: never ran)
    started_at       TIMESTAMP,          -- NULL while queued
    PRIMARY KEY (pipeline_run_id, step)
);
