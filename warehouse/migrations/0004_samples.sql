-- samples: one table per task, built set-based from raw/core by medtx.samples. Owned by the samples stage.
-- Every row traces back to subject_id/hadm_id (EHR tasks), note_id (specialty) or pair_id (FAQ).

-- Patient-level splits, shared by every model of a task. For specialty the unit is the text group:
-- subject_id holds samples.specialty.group_id there.
CREATE TABLE samples.splits (
    dataset    VARCHAR NOT NULL,
    task       VARCHAR NOT NULL,
    subject_id BIGINT NOT NULL,
    split      VARCHAR NOT NULL CHECK (split IN ('train', 'val', 'test')),
    seed       INTEGER NOT NULL,
    PRIMARY KEY (dataset, task, subject_id)
);

-- PyHealth drug_recommendation_mimic3_fn: history lists include the current visit, drugs_hist[-1] = [].
CREATE TABLE samples.drug_rec (
    dataset     VARCHAR NOT NULL,
    subject_id  BIGINT NOT NULL,
    hadm_id     BIGINT NOT NULL,
    visit_index INTEGER NOT NULL,      -- 0-based among the patient's kept visits, by admittime
    admittime   TIMESTAMP,
    conditions  VARCHAR[][] NOT NULL,
    procedures  VARCHAR[][] NOT NULL,
    drugs_hist  VARCHAR[][] NOT NULL,
    drugs       VARCHAR[] NOT NULL,    -- ATC-3 label set, sorted
    PRIMARY KEY (dataset, hadm_id)
);

-- BEHRT-style next-visit diagnosis prediction.
CREATE TABLE samples.next_visit (
    dataset      VARCHAR NOT NULL,
    subject_id   BIGINT NOT NULL,
    hadm_id      BIGINT NOT NULL,      -- the last visit of the history
    next_hadm_id BIGINT NOT NULL,      -- the visit whose diagnoses are the label
    visits       VARCHAR[][] NOT NULL,
    ages         INTEGER[] NOT NULL,   -- age in whole years at each visit, capped at 90
    codes        VARCHAR[] NOT NULL,   -- [CLS] v1 [SEP] v2 [SEP] ...
    segments     INTEGER[] NOT NULL,
    ages_flat    INTEGER[] NOT NULL,
    positions    INTEGER[] NOT NULL,
    label        VARCHAR[] NOT NULL,
    PRIMARY KEY (dataset, hadm_id)
);

-- 30-day readmission per admission (rule in medtx/samples/readmission.py).
CREATE TABLE samples.readmission (
    dataset    VARCHAR NOT NULL,
    subject_id BIGINT NOT NULL,
    hadm_id    BIGINT NOT NULL,
    admittime  TIMESTAMP,
    dischtime  TIMESTAMP,
    conditions VARCHAR[][] NOT NULL,
    procedures VARCHAR[][] NOT NULL,
    drugs      VARCHAR[][] NOT NULL,
    text       VARCHAR,               -- discharge summary (NULL when NOTEEVENTS has none)
    label      BOOLEAN NOT NULL,
    PRIMARY KEY (dataset, hadm_id)
);

-- MTSamples, one row per non-empty note; identical normalised texts share group_id (= smallest note_id).
CREATE TABLE samples.specialty (
    note_id     BIGINT PRIMARY KEY,
    text        VARCHAR NOT NULL,
    label       VARCHAR NOT NULL,
    group_id    BIGINT NOT NULL,
    split       VARCHAR NOT NULL CHECK (split IN ('train', 'val', 'test')),
    conflicting BOOLEAN NOT NULL       -- the group holds more than one label
);

-- Mental Health FAQ, mojibake fixed; paraphrase = a held-out rewording of the question.
CREATE TABLE samples.faq (
    pair_id    BIGINT PRIMARY KEY,
    question   VARCHAR NOT NULL,
    answer     VARCHAR NOT NULL,
    paraphrase VARCHAR,
    fold       INTEGER NOT NULL
);

-- Vocabularies from the training split only. idx 0 = <pad>, 1 = <unk>.
CREATE TABLE samples.vocab (
    dataset VARCHAR NOT NULL,
    task    VARCHAR NOT NULL,
    feature VARCHAR NOT NULL,
    token   VARCHAR NOT NULL,
    idx     INTEGER NOT NULL,
    count   BIGINT NOT NULL,
    PRIMARY KEY (dataset, task, feature, idx)
);

-- Figures per task for reports and the dashboard (sample counts, label stats, label-noise ceiling, ...).
CREATE TABLE samples.task_summary (
    dataset VARCHAR NOT NULL,
    task    VARCHAR NOT NULL,
    metric  VARCHAR NOT NULL,
    value   DOUBLE,
    PRIMARY KEY (dataset, task, metric)
);
