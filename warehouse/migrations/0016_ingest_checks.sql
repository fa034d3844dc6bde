-- Issue 34 (case 17): plausibility checks at ingest (medtx/ingest/plausibility.py). One row per rule that found
-- rows in a dataset at its latest ingest (replaced per dataset): the raw table, the rule, how many rows, the
-- policy applied (warn: kept; reject: moved to raw.ingest_rejects; fail never commits) and one example.
CREATE TABLE raw.ingest_checks (
    dataset     VARCHAR NOT NULL,
    table_name  VARCHAR NOT NULL,
    rule        VARCHAR NOT NULL,
    n_rows      BIGINT NOT NULL,
    policy      VARCHAR NOT NULL,
    example     VARCHAR,
    checked_at  TIMESTAMP NOT NULL
);
