-- pipeline: one row per (pipeline run, step). Owned by medtx.pipeline_runs (flows/pipeline.py writes it).
-- The dashboard shows it as the last run's step table; the pipeline uses the latest completed row of a step
-- to decide whether a cached Prefect result still matches the warehouse (output_fingerprint unchanged).
CREATE TABLE ml.pipeline_steps (
    pipeline_run_id    VARCHAR NOT NULL,
    step               VARCHAR NOT NULL,   -- e.g. ingest.mimic3_demo, samples.drug_rec.synth_2000, train.drug_rec.mimic3_demo.logreg.s42
    kind               VARCHAR NOT NULL,   -- ingest, synth, codes, samples, train, publish
    dataset            VARCHAR,
    task               VARCHAR,
    model              VARCHAR,
    state              VARCHAR NOT NULL CHECK (state IN ('completed', 'cached', 'failed', 'skipped')),
    input_key          VARCHAR,            -- hash of the step's cache inputs (sources, upstream tables, config, code)
    output_scope       JSON,               -- what the output fingerprint covers (e.g. the run ids a train step wrote)
    output_fingerprint VARCHAR,            -- fingerprint of the step's output rows right after it finished
    error              VARCHAR,
    seconds            DOUBLE,
    finished_at        TIMESTAMP NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (pipeline_run_id, step)
);
