-- run owners (issue 12, crash recovery): every pipeline run and model run records the process that owns it
-- (pid + host + that process's start time, so a reused pid is not mistaken for it) and a heartbeat the owner
-- refreshes while it works. On start, `medtx pipeline` / `medtx train` mark `running` rows whose owner is gone
-- as `interrupted` (finished_at = when it was noticed, error = why), so a kill -9 never leaves a zombie run.
-- DuckDB cannot alter a CHECK constraint in place, so both tables are rebuilt with the new status value.

CREATE TABLE ml.pipeline_runs_0010 (
    pipeline_run_id VARCHAR PRIMARY KEY,
    config          JSON,
    status          VARCHAR NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'interrupted')),
    started_at      TIMESTAMP NOT NULL,
    finished_at     TIMESTAMP,
    error           VARCHAR,
    owner_pid       INTEGER,                   -- the process that runs the flow
    owner_host      VARCHAR,
    owner_started   DOUBLE,                    -- that process's create time (epoch s): pid reuse check
    heartbeat_at    TIMESTAMP                  -- naive UTC; refreshed at every step end
);
INSERT INTO ml.pipeline_runs_0010 (pipeline_run_id, config, status, started_at, finished_at, error)
    SELECT pipeline_run_id, config, status, started_at, finished_at, error FROM ml.pipeline_runs;
DROP TABLE ml.pipeline_runs;
ALTER TABLE ml.pipeline_runs_0010 RENAME TO pipeline_runs;

CREATE TABLE ml.runs_0010 (
    run_id           VARCHAR PRIMARY KEY,
    task             VARCHAR NOT NULL,
    model            VARCHAR NOT NULL,
    status           VARCHAR NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'interrupted')),
    config           JSON,
    seed             INTEGER,
    device           VARCHAR,
    data_fingerprint VARCHAR,
    code_version     VARCHAR,
    dataset          VARCHAR,
    is_synthetic     BOOLEAN NOT NULL DEFAULT false,
    threshold        DOUBLE,
    threshold_source VARCHAR,
    collapsed        BOOLEAN NOT NULL DEFAULT false,
    collapse_reason  VARCHAR,
    n_params         BIGINT,
    best_epoch       INTEGER,
    train_seconds    DOUBLE,
    started_at       TIMESTAMP NOT NULL,
    finished_at      TIMESTAMP,
    error            VARCHAR,                   -- error text when status = 'failed' / why when 'interrupted'
    pipeline_run_id  VARCHAR,
    owner_pid        INTEGER,                   -- the process that trains (a Dask worker's, under Dask)
    owner_host       VARCHAR,
    owner_started    DOUBLE,
    heartbeat_at     TIMESTAMP                  -- naive UTC; refreshed at every epoch end
);
INSERT INTO ml.runs_0010 BY NAME SELECT * FROM ml.runs;
DROP TABLE ml.runs;
ALTER TABLE ml.runs_0010 RENAME TO runs;
