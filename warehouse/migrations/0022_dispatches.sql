-- Issue 44: results fill only the run that was asked for. Every training the flow hands out (a pipeline step, or
-- `medtx train`) is recorded here before any worker sees its package: which package (its content digest,
-- medtx.training.integrity.content_digest, computed from the files by the flow), for which step of which pipeline
-- run, task, dataset, model and seed, on which input fingerprints. A result package is recorded only against its
-- dispatch (medtx.pipeline.exchange.record_result_package): while it is `awaiting`, for exactly that task,
-- dataset, model, seed and pipeline run, trained on exactly that package, under a run id the warehouse does not
-- hold yet; recording it closes the dispatch (`recorded`, with the run ids) in the same transaction.
CREATE TABLE ml.dispatches (
    dispatch_id      VARCHAR PRIMARY KEY,           -- '<pipeline run id>/<step name>' or 'cli-<uuid>/<step name>'
    pipeline_run_id  VARCHAR,
    step             VARCHAR NOT NULL,
    task             VARCHAR NOT NULL,
    dataset          VARCHAR,
    model            VARCHAR NOT NULL,
    seed             INTEGER NOT NULL,
    package_key      VARCHAR NOT NULL,              -- <exchange>/packages/<key>
    package_digest   VARCHAR NOT NULL,              -- sha256 over the package's files, tables and scope
    data_fingerprint JSON,                          -- the step's input fingerprints (table -> fingerprint)
    status           VARCHAR NOT NULL CHECK (status IN ('awaiting', 'recorded')),
    run_ids          VARCHAR[],
    dispatched_at    TIMESTAMP NOT NULL,
    recorded_at      TIMESTAMP
);
