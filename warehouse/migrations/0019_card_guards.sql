-- Issue 42: floors, recalibration guards and multiplicity of the model card (medtx.evaluation.floors, trust).

-- Per subgroup row: why its figures are withheld (NULL: shown; 'fewer than 30 test patients (n)', 'too few events
-- (n)', 'too few non-events (n)'; too_small is true for every withheld row), the two-sided p-value of the paired
-- verdict (bootstrap normal approximation) and the Holm-adjusted verdict over the run's group verdicts.
-- attribute 'overall' (group 'all'): every test patient, the overall verdict of each per-group metric.
ALTER TABLE ml.subgroups ADD COLUMN withheld VARCHAR;
ALTER TABLE ml.subgroups ADD COLUMN p_value DOUBLE;
ALTER TABLE ml.subgroups ADD COLUMN verdict_adjusted VARCHAR;

-- One row per (run, recalibration method): recommended (lowers the out-of-fold validation log-loss, the most of
-- the methods that do), not_recommended (fitted, shown, keep the original probabilities), refused (a Platt slope
-- <= 0 reverses the ranking: no test figures), not_fitted (below the event floor, a single class, no convergence).
-- distinct_risks: distinct test probabilities after the map (isotonic collapses them into steps).
CREATE TABLE ml.recalibration (
    run_id           VARCHAR NOT NULL,
    method           VARCHAR NOT NULL,
    status           VARCHAR NOT NULL CHECK (status IN ('recommended', 'not_recommended', 'refused', 'not_fitted')),
    reason           VARCHAR NOT NULL,
    n_fit            INTEGER,            -- validation samples
    n_events         INTEGER,            -- validation events (positive samples / label cells)
    oof_logloss_original DOUBLE,
    oof_logloss_mapped   DOUBLE,
    distinct_risks   BIGINT,
    PRIMARY KEY (run_id, method)
);

-- One row per (run, named operating-point target): chosen (threshold set on validation with >= 10 validation
-- alerts; its figures are in ml.operating_points) or unreachable (reason says why; no threshold).
CREATE TABLE ml.operating_targets (
    run_id      VARCHAR NOT NULL,
    target      VARCHAR NOT NULL,
    status      VARCHAR NOT NULL CHECK (status IN ('chosen', 'unreachable')),
    reason      VARCHAR NOT NULL,
    threshold   DOUBLE,
    val_alerts  INTEGER NOT NULL,
    val_events  INTEGER NOT NULL,
    val_samples INTEGER NOT NULL,
    PRIMARY KEY (run_id, target)
);
