-- ml: everything a user needs to trust a result. Owned by medtx.training (writes) and read by the dashboard.

-- One row per pipeline (flow) run, for the dashboard's "last pipeline run".
CREATE TABLE ml.pipeline_runs (
    pipeline_run_id VARCHAR PRIMARY KEY,
    config          JSON,
    status          VARCHAR NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    started_at      TIMESTAMP NOT NULL,
    finished_at     TIMESTAMP,
    error           VARCHAR
);

-- One row per (task, model, seed) training/evaluation run; baselines and the oracle are runs too.
CREATE TABLE ml.runs (
    run_id           VARCHAR PRIMARY KEY,
    task             VARCHAR NOT NULL,          -- drug_rec, next_visit, readmission, specialty, readmission_notes, faq
    model            VARCHAR NOT NULL,          -- transformer, behrt, logreg, oracle, bert, ...
    status           VARCHAR NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    config           JSON,                      -- full model + trainer config
    seed             INTEGER,
    device           VARCHAR,                   -- cpu, cuda, cuda:0 ...
    data_fingerprint VARCHAR,                   -- hash of the sample table + split the run saw
    code_version     VARCHAR,                   -- medtx version + git sha when known
    dataset          VARCHAR,                   -- e.g. 'mimic3_demo', 'synth:10000'
    is_synthetic     BOOLEAN NOT NULL DEFAULT false,
    threshold        DOUBLE,                    -- decision threshold used for set metrics
    threshold_source VARCHAR,                   -- 'fixed' or 'tuned_on_val'
    collapsed        BOOLEAN NOT NULL DEFAULT false, -- predictions (nearly) one class / constant
    collapse_reason  VARCHAR,
    n_params         BIGINT,
    best_epoch       INTEGER,
    train_seconds    DOUBLE,
    started_at       TIMESTAMP NOT NULL,
    finished_at      TIMESTAMP,
    error            VARCHAR,                   -- error text when status = 'failed'
    pipeline_run_id  VARCHAR
);

-- Checkpoint folders (config + model.safetensors + vocab) of a run.
CREATE TABLE ml.models (
    run_id     VARCHAR NOT NULL,
    kind       VARCHAR NOT NULL CHECK (kind IN ('best', 'last', 'pretrained')),
    path       VARCHAR NOT NULL,
    epoch      INTEGER,
    metric     VARCHAR,
    value      DOUBLE,
    created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
    PRIMARY KEY (run_id, kind)
);

-- Per-epoch curves, long form: (run, epoch, split, metric) -> value. split: train / val; metric includes loss.
CREATE TABLE ml.epochs (
    run_id  VARCHAR NOT NULL,
    epoch   INTEGER NOT NULL,
    split   VARCHAR NOT NULL,
    metric  VARCHAR NOT NULL,
    value   DOUBLE,
    seconds DOUBLE,
    PRIMARY KEY (run_id, epoch, split, metric)
);

-- Final metrics. On test: mean and sd over bootstrap resamples (n_boot, 80% of test patients).
-- averaging: 'visit' (sklearn samples-average, PyHealth), 'patient' (SafeDrug), or 'none'.
CREATE TABLE ml.metrics (
    run_id    VARCHAR NOT NULL,
    split     VARCHAR NOT NULL,
    metric    VARCHAR NOT NULL,
    averaging VARCHAR NOT NULL DEFAULT 'none',
    value     DOUBLE,
    sd        DOUBLE,
    n_boot    INTEGER,
    PRIMARY KEY (run_id, split, metric, averaging)
);

-- Per-label (multi-label) or per-class (multi-class) scores on a split.
CREATE TABLE ml.label_metrics (
    run_id  VARCHAR NOT NULL,
    split   VARCHAR NOT NULL,
    label   VARCHAR NOT NULL,
    metric  VARCHAR NOT NULL,
    value   DOUBLE,
    support INTEGER,
    PRIMARY KEY (run_id, split, label, metric)
);

-- Confusion matrix for classification runs.
CREATE TABLE ml.confusion (
    run_id     VARCHAR NOT NULL,
    split      VARCHAR NOT NULL,
    true_label VARCHAR NOT NULL,
    pred_label VARCHAR NOT NULL,
    n          INTEGER NOT NULL,
    PRIMARY KEY (run_id, split, true_label, pred_label)
);

-- Test predictions, long form: one row per (sample, label) with the model's probability.
-- sample_id: hadm_id (as text) for visit tasks, note_id for notes, faq pair id for FAQ.
CREATE TABLE ml.predictions (
    run_id     VARCHAR NOT NULL,
    sample_id  VARCHAR NOT NULL,
    subject_id BIGINT,
    hadm_id    BIGINT,
    label      VARCHAR NOT NULL,
    prob       DOUBLE,
    y_true     BOOLEAN,
    predicted  BOOLEAN,            -- prob >= threshold (multi-label) or argmax (multi-class)
    text       VARCHAR             -- generated text (seq2seq / QA), else NULL
);

-- Attention weights for a bounded set of showcase test samples (long form).
-- module: which attention stack ('conditions', 'procedures', 'encoder', 'decoder_self', 'decoder_cross', 'bert', ...)
CREATE TABLE ml.attention (
    run_id      VARCHAR NOT NULL,
    sample_id   VARCHAR NOT NULL,
    module      VARCHAR NOT NULL,
    layer       INTEGER NOT NULL,
    head        INTEGER NOT NULL,
    query_pos   INTEGER NOT NULL,
    key_pos     INTEGER NOT NULL,
    weight      REAL NOT NULL,
    query_token VARCHAR,
    key_token   VARCHAR
);
