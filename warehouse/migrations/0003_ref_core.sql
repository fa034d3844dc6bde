-- ref: code dictionaries and drug mappings (dataset-independent, rebuilt from data/ by medtx.codes.reference).
-- core: cleaned, mapped facts per dataset (medtx.codes.mapping). Owned by the samples stage.

CREATE TABLE ref.icd9_diagnoses (
    icd9_code   VARCHAR PRIMARY KEY,   -- undotted ICD-9-CM, as MIMIC stores it
    short_title VARCHAR,
    long_title  VARCHAR
);

CREATE TABLE ref.icd9_procedures (
    icd9_code   VARCHAR PRIMARY KEY,
    short_title VARCHAR,
    long_title  VARCHAR
);

-- WHO ATC names, levels 1-5 (level from code length 1/3/4/5/7). "ATC-3" in medtx = level 3 = 4 characters.
CREATE TABLE ref.atc (
    atc_code VARCHAR PRIMARY KEY,
    atc_name VARCHAR NOT NULL,
    level    INTEGER NOT NULL CHECK (level BETWEEN 1 AND 5)
);

-- The raw mapping files, NDCs normalised to 11 digits.
CREATE TABLE ref.ndc_rxcui (           -- GAMENet ndc2rxnorm
    ndc   VARCHAR NOT NULL,
    rxcui VARCHAR NOT NULL
);
CREATE TABLE ref.rxcui_atc (           -- Kury 2020, RxCUI -> ATC
    rxcui VARCHAR NOT NULL,
    atc3  VARCHAR NOT NULL,
    atc4  VARCHAR,
    atc5  VARCHAR
);
CREATE TABLE ref.ndc_atc (             -- Kury 2020, direct NDC11 -> ATC
    ndc  VARCHAR NOT NULL,
    atc3 VARCHAR NOT NULL,
    atc4 VARCHAR,
    atc5 VARCHAR
);

-- The resolved NDC -> ATC-3 map. Precedence per NDC: route 'rxcui' (NDC->RxCUI->ATC) if it yields any ATC-3,
-- else 'ndc' (direct NDC->ATC). An NDC keeps every ATC-3 of its winning route (combination products belong
-- to several classes), so one NDC can give several rows.
CREATE TABLE ref.ndc_atc3 (
    ndc   VARCHAR NOT NULL,
    atc3  VARCHAR NOT NULL,
    route VARCHAR NOT NULL CHECK (route IN ('rxcui', 'ndc')),
    PRIMARY KEY (ndc, atc3)
);

-- Drug-name fallback: normalised WHO ATC level-5 substance name -> ATC-3. Names shared by more than
-- 3 ATC-3 classes ('combinations', 'various', ...) are left out as uninformative.
CREATE TABLE ref.drug_name_atc3 (
    drug_name VARCHAR NOT NULL,
    atc3      VARCHAR NOT NULL,
    PRIMARY KEY (drug_name, atc3)
);

-- Drug-drug interactions at ATC-3: TOP-40 STITCH CID pairs -> ATC-5 -> first 4 characters.
-- Stored once per unordered pair with atc3_a < atc3_b; look a pair up as (least(x, y), greatest(x, y)).
CREATE TABLE ref.ddi_atc3 (
    atc3_a VARCHAR NOT NULL,
    atc3_b VARCHAR NOT NULL,
    PRIMARY KEY (atc3_a, atc3_b),
    CHECK (atc3_a < atc3_b)
);

-- One row per (prescription row, ATC-3); prescription rows that map to nothing are absent here and
-- counted in core.mapping_coverage.
CREATE TABLE core.prescriptions_atc3 (
    dataset    VARCHAR NOT NULL,
    subject_id BIGINT NOT NULL,
    hadm_id    BIGINT NOT NULL,
    startdate  TIMESTAMP,
    ndc        VARCHAR,               -- normalised 11-digit NDC (NULL when the row has none)
    drug       VARCHAR,
    atc3       VARCHAR NOT NULL,
    route      VARCHAR NOT NULL CHECK (route IN ('rxcui', 'ndc', 'name'))
);

-- What the mapping kept and lost, per dataset.
-- kind 'route': one row per route ('rxcui', 'ndc', 'name', 'unmapped', 'mapped' = all routes, 'no_ndc');
--   n_ndc = distinct NDCs, n_rows = prescription rows, pct_rows = n_rows / rows carrying an NDC
--   ('no_ndc': rows without an NDC / all rows).
-- kind 'unmapped_ndc': one row per NDC that no route mapped, ranked by row count, with its drug names.
CREATE TABLE core.mapping_coverage (
    dataset  VARCHAR NOT NULL,
    kind     VARCHAR NOT NULL CHECK (kind IN ('route', 'unmapped_ndc')),
    route    VARCHAR,
    ndc      VARCHAR,
    drug     VARCHAR,
    n_ndc    BIGINT,
    n_rows   BIGINT NOT NULL,
    pct_rows DOUBLE,
    rank     INTEGER
);
