-- raw.synth_oracle_*: the ground truth of a synthetic cohort (owner: medtx.synth), loaded from the
-- ORACLE_*.csv.gz files the generator writes beside the MIMIC tables. The `oracle` baseline scores these
-- probabilities like a model's predictions. Rows with prob < 1e-3 are not stored: read missing as ~0.

-- P(ATC-3 label present in this admission's drug set | its diagnoses, procedures, previous drugs).
CREATE TABLE raw.synth_oracle_drug_rec (
    dataset VARCHAR NOT NULL,
    hadm_id BIGINT NOT NULL,
    atc3    VARCHAR NOT NULL,
    prob    DOUBLE NOT NULL
);

-- P(code among the NEXT admission's diagnoses | history up to this admission); hadm_id = this admission.
CREATE TABLE raw.synth_oracle_next_visit (
    dataset   VARCHAR NOT NULL,
    hadm_id   BIGINT NOT NULL,
    icd9_code VARCHAR NOT NULL,
    prob      DOUBLE NOT NULL
);

-- P(non-elective next admission within 30 days of discharge | history); 0 for in-hospital deaths.
CREATE TABLE raw.synth_oracle_readmission (
    dataset VARCHAR NOT NULL,
    hadm_id BIGINT NOT NULL,
    prob    DOUBLE NOT NULL
);
