-- Issue 14: patient-bootstrap confidence intervals on every test metric, and paired comparisons against the
-- reference baseline. Written by medtx.uncertainty after each run (see docs/ARCHITECTURE.md).

-- The 95% interval of a test metric: percentile bootstrap WITH replacement over test units (patients; text
-- groups for MTSamples; pairs for the FAQ), n_boot resamples. ci_method names it. The older `sd` column keeps
-- the SafeDrug convention (sd over 10 subsamples of 80% of test units, about half as wide); sd_method names it.
ALTER TABLE ml.metrics ADD COLUMN ci_low DOUBLE;
ALTER TABLE ml.metrics ADD COLUMN ci_high DOUBLE;
ALTER TABLE ml.metrics ADD COLUMN ci_method VARCHAR;
ALTER TABLE ml.metrics ADD COLUMN sd_method VARCHAR;

-- How many units the test bootstrap resampled (the small-sample guard's n) and what they are.
ALTER TABLE ml.runs ADD COLUMN n_test_units INTEGER;
ALTER TABLE ml.runs ADD COLUMN test_unit VARCHAR;             -- 'patients', 'text groups' or 'pairs'

-- Paired patient bootstrap of a run against the reference baseline of its (task, dataset): the best
-- non-neural baseline on VALIDATION. diff = run - reference on the test split; ci_* its percentile interval;
-- p_better = share of resamples where the run is ahead. Fewer than 30 test units: verdict 'too_small'.
CREATE TABLE ml.comparisons (
    run_id           VARCHAR NOT NULL,
    reference_run_id VARCHAR NOT NULL,
    metric           VARCHAR NOT NULL,
    averaging        VARCHAR NOT NULL,
    diff             DOUBLE,
    ci_low           DOUBLE,
    ci_high          DOUBLE,
    p_better         DOUBLE,
    verdict          VARCHAR NOT NULL CHECK (verdict IN ('better', 'worse', 'no_detectable_difference', 'too_small')),
    n_units          INTEGER NOT NULL,
    n_boot           INTEGER NOT NULL,
    diffs            DOUBLE[],          -- the resampled differences, for the run-detail histogram
    PRIMARY KEY (run_id, metric, averaging)
);
