-- Issue 11's fetch history table (fleetpace_check), exactly as its branch
-- (operate) defines it in migrations-free-schema.sql, for TestHistory until
-- main has it: every statement is IF NOT EXISTS, so with main's schema it
-- does nothing. Delete this file once main has the table.
CREATE TABLE IF NOT EXISTS fleetpace_check (
    source_id   bigint      NOT NULL,
    platform    text        NOT NULL,
    checked_at  timestamptz NOT NULL DEFAULT now(),
    outcome     text        NOT NULL,
    status      smallint,
    duration_ms real        NOT NULL DEFAULT 0,
    bytes       bigint      NOT NULL DEFAULT 0,
    reason      text,
    worker      text        NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS fleetpace_check_source_idx ON fleetpace_check (source_id, checked_at);
CREATE INDEX IF NOT EXISTS fleetpace_check_platform_idx ON fleetpace_check (platform, checked_at);
