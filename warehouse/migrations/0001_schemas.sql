-- Layers of the warehouse. Versions are recorded in main.schema_migrations by medtx.db.migrate.
CREATE SCHEMA IF NOT EXISTS raw;
CREATE SCHEMA IF NOT EXISTS ref;
CREATE SCHEMA IF NOT EXISTS core;
CREATE SCHEMA IF NOT EXISTS samples;
CREATE SCHEMA IF NOT EXISTS ml;
