-- fleetpace schema: every table and index fleetpace owns.
--
-- There is no migration framework and no numbered migration: every statement
-- is idempotent (IF NOT EXISTS) and the whole file is applied under one
-- advisory lock by `fleetpace schema apply` (see schema.go), so it is safe to
-- run any number of times, from any number of processes at once. River's own
-- tables are created by rivermigrate in the same locked step.

-- platform: one row per destination. Configuration only; the hot pacer state
-- lives in fleetpace_pace.
CREATE TABLE IF NOT EXISTS fleetpace_platform (
    name           text             PRIMARY KEY
                                    CONSTRAINT fleetpace_platform_name_check
                                    CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    rate_per_sec   double precision NOT NULL
                                    CONSTRAINT fleetpace_platform_rate_check
                                    CHECK (rate_per_sec > 0 AND rate_per_sec < 'Infinity'::double precision),
    burst          integer          NOT NULL DEFAULT 1
                                    CONSTRAINT fleetpace_platform_burst_check CHECK (burst >= 1),
    max_multiplier double precision NOT NULL DEFAULT 16
                                    CONSTRAINT fleetpace_platform_max_multiplier_check
                                    CHECK (max_multiplier >= 1 AND max_multiplier < 'Infinity'::double precision),
    decay_after    integer          NOT NULL DEFAULT 100
                                    CONSTRAINT fleetpace_platform_decay_after_check CHECK (decay_after >= 1),
    cooldown       interval         NOT NULL DEFAULT '15 minutes'
                                    CONSTRAINT fleetpace_platform_cooldown_check CHECK (cooldown > interval '0'),
    created_at     timestamptz      NOT NULL DEFAULT now(),
    updated_at     timestamptz      NOT NULL DEFAULT now()
);

-- pace: the shared pacer state, one narrow row per platform, updated on every
-- reservation by a single INSERT ... ON CONFLICT DO UPDATE. No index beyond the
-- primary key and a low fillfactor keep those updates HOT. Times are epoch
-- seconds of the database clock (clock_timestamp()). rate, burst,
-- max_multiplier and decay_after are copies of the platform's configuration,
-- kept in step by the trigger below, so a reservation reads one row only.
-- last_slot and last_count describe the last reservation (the base of its
-- slots, how many were granted) and last_effect the last report (doubled or
-- not, halved or not), so that RETURNING tells the caller what was decided
-- without a second round trip.
CREATE TABLE IF NOT EXISTS fleetpace_pace (
    platform       text             PRIMARY KEY REFERENCES fleetpace_platform (name) ON DELETE CASCADE,
    rate           double precision NOT NULL DEFAULT 0,  -- = fleetpace_platform.rate_per_sec (0: not copied yet)
    burst          integer          NOT NULL DEFAULT 1,  -- = fleetpace_platform.burst
    max_multiplier double precision NOT NULL DEFAULT 1,  -- = fleetpace_platform.max_multiplier
    decay_after    integer          NOT NULL DEFAULT 1,  -- = fleetpace_platform.decay_after
    cursor_at      double precision NOT NULL DEFAULT 0,  -- GCRA theoretical arrival time
    multiplier     double precision NOT NULL DEFAULT 1,  -- shared backoff, 1..max_multiplier
    clean_streak   integer          NOT NULL DEFAULT 0,  -- fleet-wide consecutive clean responses
    doubled_at     double precision NOT NULL DEFAULT 0,  -- when the multiplier last doubled
    hold_until     double precision NOT NULL DEFAULT 0,  -- Retry-After hold, fleet-wide
    last_slot      double precision NOT NULL DEFAULT 0,  -- base slot computed by the last reservation
    last_count     integer          NOT NULL DEFAULT 0,  -- slots granted by the last reservation (0: denied)
    last_effect    smallint         NOT NULL DEFAULT 0   -- what the last report did (pacer package codes)
) WITH (fillfactor = 50);
-- Added after the first release: reservations in blocks.
ALTER TABLE fleetpace_pace ADD COLUMN IF NOT EXISTS last_count integer NOT NULL DEFAULT 0;

-- Every platform has a pace row whose configuration columns follow the
-- platform's: `platforms set` takes effect fleet-wide at the next reservation.
-- CREATE OR REPLACE, so `schema apply` brings an older definition up to date.
CREATE OR REPLACE FUNCTION fleetpace_platform_sync_pace() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fleetpace_pace (platform, rate, burst, max_multiplier, decay_after)
    VALUES (NEW.name, NEW.rate_per_sec, NEW.burst, NEW.max_multiplier, NEW.decay_after)
    ON CONFLICT (platform) DO UPDATE SET
        rate           = EXCLUDED.rate,
        burst          = EXCLUDED.burst,
        max_multiplier = EXCLUDED.max_multiplier,
        decay_after    = EXCLUDED.decay_after,
        -- a lower maximum caps the multiplier now (reservations trust it)
        multiplier     = LEAST(fleetpace_pace.multiplier, EXCLUDED.max_multiplier);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER fleetpace_platform_sync_pace
    AFTER INSERT OR UPDATE ON fleetpace_platform
    FOR EACH ROW EXECUTE FUNCTION fleetpace_platform_sync_pace();

-- cooldown: one row per platform that was told to stop (rate limited).
-- Rows whose until has passed no longer filter anything; count drives
-- escalation of repeated cooldowns.
CREATE TABLE IF NOT EXISTS fleetpace_cooldown (
    platform   text        PRIMARY KEY REFERENCES fleetpace_platform (name) ON DELETE CASCADE,
    until      timestamptz NOT NULL,
    reason     text        NOT NULL DEFAULT '',
    count      integer     NOT NULL DEFAULT 1,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- source: one thing fetched on a schedule.
--   due_at     when the source is next due: created_at for a new source, then
--              last_checked_at + check_interval, pushed back exponentially
--              while consecutive_failures > 0.
--   queued_at  non-NULL while a fetch job for the source is queued or running;
--              set in the same transaction that inserts the job, so a source
--              is never queued twice.
CREATE TABLE IF NOT EXISTS fleetpace_source (
    id                   bigint      GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    platform             text        NOT NULL REFERENCES fleetpace_platform (name),
    url                  text        NOT NULL,
    check_interval       interval    NOT NULL DEFAULT '1 hour'
                                     CONSTRAINT fleetpace_source_interval_check CHECK (check_interval > interval '0'),
    enabled              boolean     NOT NULL DEFAULT true,
    due_at               timestamptz NOT NULL DEFAULT now(),
    last_checked_at      timestamptz,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    last_status          integer,
    last_outcome         text,
    last_error           text,
    etag                 text,
    last_modified        text,
    content_hash         text,
    queued_at            timestamptz,
    queued_job_id        bigint,
    created_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT fleetpace_source_platform_url_key UNIQUE (platform, url)
);

-- The due query walks this index once per platform in fair order
-- (never-checked first, then longest since checked, ties by id) and merges
-- the per-platform streams; queued and disabled sources are not in it.
CREATE INDEX IF NOT EXISTS fleetpace_source_due_idx
    ON fleetpace_source (platform, last_checked_at ASC NULLS FIRST, id)
    WHERE enabled AND queued_at IS NULL;

-- Queued sources: counted per platform by every tick (index-only scan), and
-- the oldest checked against River by the reconciliation of finished jobs.
CREATE INDEX IF NOT EXISTS fleetpace_source_queued_at_idx
    ON fleetpace_source (queued_at) INCLUDE (platform, queued_job_id)
    WHERE queued_at IS NOT NULL;

-- worker: one row per live worker process, refreshed every few seconds; the
-- number of rows seen recently is the fleet size the pacer divides by when
-- the database is unreachable.
CREATE TABLE IF NOT EXISTS fleetpace_worker (
    id         text        PRIMARY KEY,
    hostname   text        NOT NULL DEFAULT '',
    pid        integer     NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at    timestamptz NOT NULL DEFAULT now()
);
-- Added later: each worker's fleetpace version, from its binary's build
-- information ("dev" when unknown).
ALTER TABLE fleetpace_worker ADD COLUMN IF NOT EXISTS version text NOT NULL DEFAULT '';
