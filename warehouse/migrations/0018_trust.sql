-- Issue 36: "would a clinician trust it?" — subgroups, calibration, operating points of every binary and
-- multi-label EHR run, written by medtx.evaluation.trust right after the run's intervals and comparisons
-- (records.finish_run -> medtx.evaluation.comparisons.analyse_run). Every interval is a 95% percentile bootstrap
-- WITH replacement over test patients, 1,000 resamples, the same resamples as the run's ml.metrics intervals.

-- Validation predictions (long form, as ml.predictions holds test): what recalibration and operating-point
-- thresholds are fitted on. Never test.
CREATE TABLE ml.val_predictions (
    run_id     VARCHAR NOT NULL,
    sample_id  VARCHAR NOT NULL,
    subject_id BIGINT,
    hadm_id    BIGINT,
    label      VARCHAR NOT NULL,
    prob       DOUBLE,
    y_true     BOOLEAN
);

-- One row per (run, attribute, group, metric): the group's test figures. attribute/group names and groupings:
-- medtx/evaluation/groups.py. too_small (< 30 test patients): counts only; value, interval and verdict NULL
-- ('too_small'). The paired verdict is against reference_run_id (the reference baseline of the run's task and
-- dataset, chosen on validation) on the same patients and resamples; NULL for the reference run itself.
CREATE TABLE ml.subgroups (
    run_id           VARCHAR NOT NULL,
    attribute        VARCHAR NOT NULL,   -- sex, age_band, ethnicity, insurance, admission_type
    grp              VARCHAR NOT NULL,   -- e.g. female, 65-79, medicare, unknown
    metric           VARCHAR NOT NULL,
    averaging        VARCHAR NOT NULL,
    n_patients       INTEGER NOT NULL,
    n_samples        INTEGER NOT NULL,
    n_positives      INTEGER NOT NULL,   -- positive samples (binary) or positive label cells (multi-label)
    too_small        BOOLEAN NOT NULL,
    value            DOUBLE,
    ci_low           DOUBLE,
    ci_high          DOUBLE,
    reference_run_id VARCHAR,
    diff             DOUBLE,             -- run minus reference in this group
    diff_ci_low      DOUBLE,
    diff_ci_high     DOUBLE,
    verdict          VARCHAR CHECK (verdict IN ('better', 'worse', 'no_detectable_difference', 'too_small')),
    n_boot           INTEGER NOT NULL,
    PRIMARY KEY (run_id, attribute, grp, metric, averaging)
);

-- Per (run, attribute, metric): the largest difference between two groups (high minus low; groups not too small
-- and not 'unknown') with an interval simultaneous over every pair of groups of every attribute (ci_method);
-- detected = the interval excludes 0; largest = the run's largest gap for that metric.
CREATE TABLE ml.subgroup_gaps (
    run_id     VARCHAR NOT NULL,
    attribute  VARCHAR NOT NULL,
    metric     VARCHAR NOT NULL,
    averaging  VARCHAR NOT NULL,
    group_high VARCHAR NOT NULL,
    group_low  VARCHAR NOT NULL,
    gap        DOUBLE NOT NULL,
    ci_low     DOUBLE,
    ci_high    DOUBLE,
    ci_method  VARCHAR NOT NULL,
    detected   BOOLEAN NOT NULL,
    largest    BOOLEAN NOT NULL,
    n_groups   INTEGER NOT NULL,
    PRIMARY KEY (run_id, attribute, metric, averaging)
);

-- Calibration before (method 'none') and after post-hoc recalibration ('platt', 'isotonic' for binary runs,
-- 'temperature' for multi-label), each recalibrator fitted on ml.val_predictions only and applied to test.
-- metric: citl (observed - expected rate), slope (logistic calibration slope), brier, ece (no interval: biased
-- bootstrap), plus the task's headline ranking metric after the map (auroc / pr_auc_samples).
-- params: the fitted map (JSON), n_fit: validation samples it was fitted on.
CREATE TABLE ml.calibration (
    run_id    VARCHAR NOT NULL,
    method    VARCHAR NOT NULL,
    metric    VARCHAR NOT NULL,
    value     DOUBLE,
    ci_low    DOUBLE,
    ci_high   DOUBLE,
    ci_method VARCHAR,
    params    VARCHAR,
    n_fit     INTEGER,
    PRIMARY KEY (run_id, method, metric)
);

-- Reliability curve per method: 10 quantile bins of the test predictions (label cells pooled for multi-label),
-- mean prediction, observed rate and its patient-bootstrap band.
CREATE TABLE ml.reliability (
    run_id    VARCHAR NOT NULL,
    method    VARCHAR NOT NULL,
    bin       INTEGER NOT NULL,
    p_low     DOUBLE,
    p_high    DOUBLE,
    n         BIGINT NOT NULL,
    mean_pred DOUBLE,
    observed  DOUBLE,
    ci_low    DOUBLE,
    ci_high   DOUBLE,
    PRIMARY KEY (run_id, method, bin)
);

-- Operating points of binary runs: target 'sensitivity_0.80', 'sensitivity_0.90', 'ppv_0.50', 'top_10pct'
-- (threshold chosen on validation; val_value = the figure on validation) or 'grid' (thresholds 0.01..0.99, the
-- dashboard's control). metric: sensitivity, specificity, ppv, npv, alerts_per_100, nne; on test with intervals.
CREATE TABLE ml.operating_points (
    run_id    VARCHAR NOT NULL,
    target    VARCHAR NOT NULL,
    threshold DOUBLE NOT NULL,
    metric    VARCHAR NOT NULL,
    value     DOUBLE,
    ci_low    DOUBLE,
    ci_high   DOUBLE,
    val_value DOUBLE,
    PRIMARY KEY (run_id, target, threshold, metric)
);

-- Decision curve of binary runs on test: net benefit per threshold probability with its interval, and treat-all
-- (treat-none is 0).
CREATE TABLE ml.decision_curve (
    run_id      VARCHAR NOT NULL,
    threshold   DOUBLE NOT NULL,
    net_benefit DOUBLE,
    ci_low      DOUBLE,
    ci_high     DOUBLE,
    treat_all   DOUBLE,
    PRIMARY KEY (run_id, threshold)
);
