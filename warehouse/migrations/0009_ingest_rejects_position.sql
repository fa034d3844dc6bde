-- Honest reject accounting (issue 12): where each rejected record starts, so the whole raw record can be
-- found again even when DuckDB's csv_line (cut at 10,000 characters) is not enough, and the physical line
-- it starts on (DuckDB's `line` counts records, which differs once a quoted field spans lines).
-- raw_line now holds the whole first physical line of the record (not cut).
ALTER TABLE raw.ingest_rejects ADD COLUMN record_byte_position BIGINT;
ALTER TABLE raw.ingest_rejects ADD COLUMN physical_line BIGINT;
