-- raw: source tables as ingested (owner: medtx.ingest). Lower-case MIMIC-III column names whatever the
-- source header case; ids BIGINT, times TIMESTAMP, codes (ICD-9, NDC, GSN) VARCHAR so leading zeros survive.
-- MIMIC tables carry `dataset` first: several cohorts live side by side, re-ingest replaces one dataset's rows.
-- No keys or constraints beyond `dataset`: raw keeps what the source holds, duplicates included.
-- medtx/ingest/schema.py declares the same columns (tests check they agree).

CREATE TABLE raw.patients (
    dataset     VARCHAR NOT NULL,
    row_id      BIGINT,
    subject_id  BIGINT,
    gender      VARCHAR,
    dob         TIMESTAMP,
    dod         TIMESTAMP,
    dod_hosp    TIMESTAMP,
    dod_ssn     TIMESTAMP,
    expire_flag INTEGER
);

CREATE TABLE raw.admissions (
    dataset              VARCHAR NOT NULL,
    row_id               BIGINT,
    subject_id           BIGINT,
    hadm_id              BIGINT,
    admittime            TIMESTAMP,
    dischtime            TIMESTAMP,
    deathtime            TIMESTAMP,
    admission_type       VARCHAR,
    admission_location   VARCHAR,
    discharge_location   VARCHAR,
    insurance            VARCHAR,
    language             VARCHAR,
    religion             VARCHAR,
    marital_status       VARCHAR,
    ethnicity            VARCHAR,
    edregtime            TIMESTAMP,
    edouttime            TIMESTAMP,
    diagnosis            VARCHAR,
    hospital_expire_flag INTEGER,
    has_chartevents_data INTEGER
);

CREATE TABLE raw.diagnoses_icd (
    dataset    VARCHAR NOT NULL,
    row_id     BIGINT,
    subject_id BIGINT,
    hadm_id    BIGINT,
    seq_num    INTEGER,
    icd9_code  VARCHAR
);

CREATE TABLE raw.procedures_icd (
    dataset    VARCHAR NOT NULL,
    row_id     BIGINT,
    subject_id BIGINT,
    hadm_id    BIGINT,
    seq_num    INTEGER,
    icd9_code  VARCHAR
);

-- ndc: 11-digit string; '0' or empty (NULL) means "no NDC" in MIMIC and is kept as-is here.
CREATE TABLE raw.prescriptions (
    dataset           VARCHAR NOT NULL,
    row_id            BIGINT,
    subject_id        BIGINT,
    hadm_id           BIGINT,
    icustay_id        BIGINT,
    startdate         TIMESTAMP,
    enddate           TIMESTAMP,
    drug_type         VARCHAR,
    drug              VARCHAR,
    drug_name_poe     VARCHAR,
    drug_name_generic VARCHAR,
    formulary_drug_cd VARCHAR,
    gsn               VARCHAR,
    ndc               VARCHAR,
    prod_strength     VARCHAR,
    dose_val_rx       VARCHAR,   -- MIMIC has ranges such as '1-2'
    dose_unit_rx      VARCHAR,
    form_val_disp     VARCHAR,
    form_unit_disp    VARCHAR,
    route             VARCHAR
);

CREATE TABLE raw.noteevents (
    dataset     VARCHAR NOT NULL,
    row_id      BIGINT,
    subject_id  BIGINT,
    hadm_id     BIGINT,
    chartdate   TIMESTAMP,
    charttime   TIMESTAMP,
    storetime   TIMESTAMP,
    category    VARCHAR,
    description VARCHAR,
    cgid        BIGINT,
    iserror     VARCHAR,   -- CHAR(1) in MIMIC: '1' or empty
    text        VARCHAR
);

-- MTSamples transcriptions (one corpus, no dataset column).
CREATE TABLE raw.mtsamples (
    note_id           BIGINT,
    description       VARCHAR,
    medical_specialty VARCHAR,
    sample_name       VARCHAR,
    transcription     VARCHAR,
    keywords          VARCHAR
);

-- Rows that failed to parse, straight from DuckDB's CSV rejects: one row per (line, column) error.
-- line = CSV record number with the header as line 1 (a quoted multi-line field counts once);
-- byte_position locates it exactly in the (uncompressed) file.
CREATE TABLE raw.ingest_rejects (
    dataset       VARCHAR NOT NULL,
    table_name    VARCHAR NOT NULL,
    file          VARCHAR NOT NULL,
    line          BIGINT,
    byte_position BIGINT,
    column_name   VARCHAR,
    error_type    VARCHAR,    -- CAST, MISSING COLUMNS, TOO MANY COLUMNS, UNQUOTED VALUE, INVALID UNICODE, ...
    error         VARCHAR,
    raw_line      VARCHAR,
    ingested_at   TIMESTAMP NOT NULL
);

-- One row per ingest of one table (append-only history). status: 'loaded', or 'absent' for an optional
-- table the source lacks (NOTEEVENTS). Failed ingests leave the warehouse untouched, so they log nothing here.
CREATE TABLE raw.ingest_log (
    ingest_id     VARCHAR PRIMARY KEY,
    dataset       VARCHAR NOT NULL,
    table_name    VARCHAR NOT NULL,
    source        VARCHAR NOT NULL,   -- what the user gave: folder, file or URL
    file          VARCHAR,            -- the local file read (the download cache for URLs)
    file_sha256   VARCHAR,
    file_bytes    BIGINT,
    rows_loaded   BIGINT NOT NULL,
    rows_rejected BIGINT NOT NULL,
    status        VARCHAR NOT NULL CHECK (status IN ('loaded', 'absent')),
    started_at    TIMESTAMP NOT NULL,
    finished_at   TIMESTAMP NOT NULL
);
