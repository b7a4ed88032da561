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
    -- The bounds of rate_per_sec, burst, max_multiplier, decay_after and
    -- cooldown are the "_bounds" constraints, added below.
    rate_per_sec   double precision NOT NULL,
    burst          integer          NOT NULL DEFAULT 1,
    max_multiplier double precision NOT NULL DEFAULT 16,
    decay_after    integer          NOT NULL DEFAULT 100,
    cooldown       interval         NOT NULL DEFAULT '15 minutes',
    created_at     timestamptz      NOT NULL DEFAULT now(),
    updated_at     timestamptz      NOT NULL DEFAULT now()
);

-- Added with adaptive pacing: how the shared multiplier moves. Pressure
-- multiplies it by backoff_factor (once per episode); every decay_after clean
-- responses, fleet-wide, divide it by recovery_factor; with probe, recovery
-- stops just short of the multiplier where the last pressure began and then
-- climbs in small steps. use_headers: pace by the destination's announced
-- rate-limit headers (RateLimit, X-RateLimit-*). respace: a slow-down
-- re-spaces the slots already granted, fleet-wide, at once (false: they
-- are used as granted, as before adaptive pacing; a benchmark baseline).
-- Bounds and defaults are sources' (sources.MinFactor, MaxFactor,
-- DefaultBackoffFactor, DefaultRecoveryFactor).
ALTER TABLE fleetpace_platform
    ADD COLUMN IF NOT EXISTS backoff_factor  double precision NOT NULL DEFAULT 1.5
        CONSTRAINT fleetpace_platform_backoff_factor_check CHECK (backoff_factor >= 1.01 AND backoff_factor <= 16),
    ADD COLUMN IF NOT EXISTS recovery_factor double precision NOT NULL DEFAULT 1.1
        CONSTRAINT fleetpace_platform_recovery_factor_check CHECK (recovery_factor >= 1.01 AND recovery_factor <= 16),
    ADD COLUMN IF NOT EXISTS probe           boolean          NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS use_headers     boolean          NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS respace         boolean          NOT NULL DEFAULT true;

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
-- Added with adaptive pacing (see docs/design.md, "Adaptive pacing"):
--   backoff_factor, recovery_factor, probe, use_headers, respace
--                   copies of the platform's adaptation settings (trigger below)
--   pressure_mult   the multiplier in force when the last pressure episode
--                   began (0: none remembered); probing recovery stops short
--                   of it and then climbs in small steps
--   announced_interval, announced_until
--                   the spacing a destination announced through its rate-limit
--                   headers (seconds between requests) and until when it
--                   holds (epoch seconds); the effective spacing is the larger
--                   of it and multiplier / rate
--   paused_until, pause_reason
--                   an operator's pause ('Infinity': until resumed)
--   hold_reason     why hold_until was last extended (Retry-After, quota)
--   event_seq, event_at, event_shift, last_respaced
--                   every slow-down (a larger spacing, a longer hold, a pause)
--                   is an event: its sequence number, database time and the
--                   shift it gave granted slots, and whether the last report
--                   made one. Processes re-space the slots they were granted
--                   but have not used yet alike.
--   event_horizon   slots the event moved later than this (database time) are
--                   given back by their holders, and the cursor ends after the
--                   ones kept
--   last_interval   the effective spacing of the last reservation or report
--   last_max_wait   the longest wait the last reservation accepted: the
--                   fleet's horizon for granted slots
--   announced_window, announced_window_at
--                   the longest quota window any process saw lately (a
--                   policy's, or the longest Reset: a token bucket's time
--                   to fill, a fixed window's length) and when: the fleet
--                   paces an announced quota at no more than its limit per
--                   this window
--   run_start       the first slot of the current run of reservations (a
--                   gap of more than one spacing starts a new one): an
--                   announced slow-down re-spaces what the run already sent
ALTER TABLE fleetpace_pace
    ADD COLUMN IF NOT EXISTS backoff_factor     double precision NOT NULL DEFAULT 2,
    ADD COLUMN IF NOT EXISTS recovery_factor    double precision NOT NULL DEFAULT 2,
    ADD COLUMN IF NOT EXISTS probe              boolean          NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS use_headers        boolean          NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS respace            boolean          NOT NULL DEFAULT true,
    ADD COLUMN IF NOT EXISTS pressure_mult      double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS announced_interval double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS announced_until    double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS paused_until       double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS pause_reason       text             NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS hold_reason        text             NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS event_seq          bigint           NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS event_at           double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS last_respaced      boolean          NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS last_interval      double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS event_shift        double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS event_horizon      double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS last_max_wait      double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS run_start          double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS announced_window   double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS announced_window_at double precision NOT NULL DEFAULT 0;

-- Every platform has a pace row whose configuration columns follow the
-- platform's: `platforms set` takes effect fleet-wide at the next reservation.
-- CREATE OR REPLACE, so `schema apply` brings an older definition up to date.
CREATE OR REPLACE FUNCTION fleetpace_platform_sync_pace() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fleetpace_pace (platform, rate, burst, max_multiplier, decay_after,
                                backoff_factor, recovery_factor, probe, use_headers, respace)
    VALUES (NEW.name, NEW.rate_per_sec, NEW.burst, NEW.max_multiplier, NEW.decay_after,
            NEW.backoff_factor, NEW.recovery_factor, NEW.probe, NEW.use_headers, NEW.respace)
    ON CONFLICT (platform) DO UPDATE SET
        rate            = EXCLUDED.rate,
        burst           = EXCLUDED.burst,
        max_multiplier  = EXCLUDED.max_multiplier,
        decay_after     = EXCLUDED.decay_after,
        backoff_factor  = EXCLUDED.backoff_factor,
        recovery_factor = EXCLUDED.recovery_factor,
        probe           = EXCLUDED.probe,
        use_headers     = EXCLUDED.use_headers,
        respace         = EXCLUDED.respace,
        -- turning headers off drops what they announced
        announced_until = CASE WHEN EXCLUDED.use_headers THEN fleetpace_pace.announced_until ELSE 0 END,
        -- a lower maximum caps the multiplier now (reservations trust it)
        multiplier     = LEAST(fleetpace_pace.multiplier, EXCLUDED.max_multiplier);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER fleetpace_platform_sync_pace
    AFTER INSERT OR UPDATE ON fleetpace_platform
    FOR EACH ROW EXECUTE FUNCTION fleetpace_platform_sync_pace();

-- Pace rows made before a configuration column existed take its value now
-- (a no-op once they agree).
UPDATE fleetpace_pace AS s SET
    backoff_factor = p.backoff_factor, recovery_factor = p.recovery_factor,
    probe = p.probe, use_headers = p.use_headers, respace = p.respace
FROM fleetpace_platform AS p
WHERE p.name = s.platform
  AND (s.backoff_factor, s.recovery_factor, s.probe, s.use_headers, s.respace)
      IS DISTINCT FROM (p.backoff_factor, p.recovery_factor, p.probe, p.use_headers, p.respace);

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
    check_interval       interval    NOT NULL DEFAULT '1 hour', -- bounds: fleetpace_source_interval_bounds, below
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

-- Fair order: never checked first (their key is -infinity), then longest
-- since checked, ties by id. The due query (package scan) walks this index
-- per platform from the platform's head; due_at is included so the walk can
-- tell due from not due in the index. Queued and disabled sources are not
-- in it. (It replaces fleetpace_source_due_idx, which ordered by
-- last_checked_at NULLS FIRST: a key with no NULLs can be bounded in an
-- index condition.)
CREATE INDEX IF NOT EXISTS fleetpace_source_fair_idx
    ON fleetpace_source (platform, COALESCE(last_checked_at, '-infinity'::timestamptz), id) INCLUDE (due_at)
    WHERE enabled AND queued_at IS NULL;
DROP INDEX IF EXISTS fleetpace_source_due_idx;

-- Bounds of the settings of platforms and sources: the numbers are package
-- sources' (sources/bounds.go: MinRate, MaxRate, MaxBurst,
-- MaxMultiplierLimit, MaxDecayAfter, MinCooldown, MaxCooldown, MinInterval,
-- MaxInterval), which validates them in Go before anything is written;
-- sources.TestSchemaAgreesWithBounds checks that these constraints draw
-- every limit exactly there. They replace the first release's looser checks
-- (*_check, which let a rate of 1e-300, an interval of 0 or a burst of 2^31
-- in, or failed with a raw error): once, in one ALTER per table, after
-- bringing rows outside the bounds to the nearest one. Later runs find the
-- bounds and do nothing.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'fleetpace_platform'::regclass AND conname = 'fleetpace_platform_rate_bounds') THEN
        UPDATE fleetpace_platform SET
            rate_per_sec   = LEAST(GREATEST(rate_per_sec, 1e-4), 1e9),
            burst          = LEAST(GREATEST(burst, 1), 1000000),
            max_multiplier = LEAST(GREATEST(max_multiplier, 1), 1024),
            decay_after    = LEAST(GREATEST(decay_after, 1), 1000000),
            cooldown       = LEAST(GREATEST(cooldown, interval '1 second'), interval '24 hours')
        WHERE NOT (rate_per_sec BETWEEN 1e-4 AND 1e9 AND burst BETWEEN 1 AND 1000000
                   AND max_multiplier BETWEEN 1 AND 1024 AND decay_after BETWEEN 1 AND 1000000
                   AND cooldown BETWEEN interval '1 second' AND interval '24 hours');
        ALTER TABLE fleetpace_platform
            DROP CONSTRAINT IF EXISTS fleetpace_platform_rate_check,
            DROP CONSTRAINT IF EXISTS fleetpace_platform_burst_check,
            DROP CONSTRAINT IF EXISTS fleetpace_platform_max_multiplier_check,
            DROP CONSTRAINT IF EXISTS fleetpace_platform_decay_after_check,
            DROP CONSTRAINT IF EXISTS fleetpace_platform_cooldown_check,
            ADD CONSTRAINT fleetpace_platform_rate_bounds
                CHECK (rate_per_sec >= 1e-4 AND rate_per_sec <= 1e9),
            ADD CONSTRAINT fleetpace_platform_burst_bounds
                CHECK (burst >= 1 AND burst <= 1000000),
            ADD CONSTRAINT fleetpace_platform_max_multiplier_bounds
                CHECK (max_multiplier >= 1 AND max_multiplier <= 1024),
            ADD CONSTRAINT fleetpace_platform_decay_after_bounds
                CHECK (decay_after >= 1 AND decay_after <= 1000000),
            ADD CONSTRAINT fleetpace_platform_cooldown_bounds
                CHECK (cooldown >= interval '1 second' AND cooldown <= interval '24 hours');
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'fleetpace_source'::regclass AND conname = 'fleetpace_source_interval_bounds') THEN
        UPDATE fleetpace_source
        SET check_interval = LEAST(GREATEST(check_interval, interval '1 second'), interval '8760 hours')
        WHERE check_interval NOT BETWEEN interval '1 second' AND interval '8760 hours';
        ALTER TABLE fleetpace_source
            DROP CONSTRAINT IF EXISTS fleetpace_source_interval_check,
            ADD CONSTRAINT fleetpace_source_interval_bounds
                CHECK (check_interval >= interval '1 second' AND check_interval <= interval '8760 hours');
    END IF;
END
$$;

-- platform_due: per platform, its head — the first due source in fair order
-- (head_key is its COALESCE(last_checked_at, '-infinity'), head_id its id;
-- NULL when nothing is due) — valid until valid_until, when a source that
-- would come before the head falls due. The scan keeps it (package scan,
-- refreshSQL): with thousands of platforms, the due query reads the heads
-- in order here instead of probing every platform. Changes to sources reach
-- it through fleetpace_due_change.
CREATE TABLE IF NOT EXISTS fleetpace_platform_due (
    platform    text        PRIMARY KEY REFERENCES fleetpace_platform (name) ON DELETE CASCADE,
    head_key    timestamptz,
    head_id     bigint,
    valid_until timestamptz NOT NULL DEFAULT '-infinity'
);
CREATE INDEX IF NOT EXISTS fleetpace_platform_due_head_idx
    ON fleetpace_platform_due (head_key, head_id) WHERE head_id IS NOT NULL;

-- due_change: an append-only log of platforms whose head may have moved,
-- written by the statement triggers below (no lock shared by writers) and
-- consumed by the next scan tick. due_at: the earliest due_at among the
-- statement's enabled, unqueued sources of the platform ('-infinity' when a
-- due source left: queued, disabled or deleted).
CREATE TABLE IF NOT EXISTS fleetpace_due_change (
    platform text        NOT NULL,
    due_at   timestamptz NOT NULL
);

CREATE OR REPLACE FUNCTION fleetpace_platform_due_init() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fleetpace_platform_due (platform) VALUES (NEW.name) ON CONFLICT (platform) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER fleetpace_platform_due_init
    AFTER INSERT ON fleetpace_platform
    FOR EACH ROW EXECUTE FUNCTION fleetpace_platform_due_init();

INSERT INTO fleetpace_platform_due (platform) SELECT name FROM fleetpace_platform
ON CONFLICT (platform) DO NOTHING;

-- One function for every statement trigger on fleetpace_source: inserted or
-- updated sources that are enabled and unqueued may become a head (now, or
-- at their due_at); a due source that leaves (queued, disabled, deleted)
-- may have been one. A truncation makes every head stale.
CREATE OR REPLACE FUNCTION fleetpace_source_due_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE fleetpace_platform_due SET valid_until = '-infinity';
        RETURN NULL;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO fleetpace_due_change (platform, due_at)
        SELECT platform, min(due_at) FROM fleetpace_new_sources
        WHERE enabled AND queued_at IS NULL GROUP BY platform;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO fleetpace_due_change (platform, due_at)
        SELECT DISTINCT platform, '-infinity'::timestamptz FROM fleetpace_old_sources
        WHERE enabled AND queued_at IS NULL AND due_at <= now();
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER fleetpace_source_due_insert
    AFTER INSERT ON fleetpace_source REFERENCING NEW TABLE AS fleetpace_new_sources
    FOR EACH STATEMENT EXECUTE FUNCTION fleetpace_source_due_change();
CREATE OR REPLACE TRIGGER fleetpace_source_due_update
    AFTER UPDATE ON fleetpace_source REFERENCING OLD TABLE AS fleetpace_old_sources NEW TABLE AS fleetpace_new_sources
    FOR EACH STATEMENT EXECUTE FUNCTION fleetpace_source_due_change();
CREATE OR REPLACE TRIGGER fleetpace_source_due_delete
    AFTER DELETE ON fleetpace_source REFERENCING OLD TABLE AS fleetpace_old_sources
    FOR EACH STATEMENT EXECUTE FUNCTION fleetpace_source_due_change();
CREATE OR REPLACE TRIGGER fleetpace_source_due_truncate
    AFTER TRUNCATE ON fleetpace_source
    FOR EACH STATEMENT EXECUTE FUNCTION fleetpace_source_due_change();

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

-- check: the fetch history, one row per fetch (every outcome, rate limited
-- included), written by package sources in the same statement that records
-- the check on its source (no extra round trip), pruned by the scan tick
-- beyond the retention (scan.Config.HistoryRetention, 7 days by default).
-- No foreign key: a key check per row would cost every write, and history
-- outlives nothing for long: removing a source or a platform deletes its
-- rows (package sources), the retention the rest.
--   checked_at   when the check was recorded (database time)
--   status       HTTP status, NULL when there was no response
--   duration_ms  how long the fetch took
--   bytes        body size of an ok fetch, else 0
--   reason       why a fetch failed or was rate limited, else NULL
--   worker       the worker process that fetched (fleetpace_worker.id)
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
-- Added later: the platform's shared backoff multiplier in force when the
-- fetch's slot was reserved (NULL: not known — rows from before, or a fetch
-- paced outside the pacer). The dashboard charts it per minute: the
-- multiplier over time.
ALTER TABLE fleetpace_check ADD COLUMN IF NOT EXISTS multiplier real;

-- One source's recent checks, newest first (`sources show`).
CREATE INDEX IF NOT EXISTS fleetpace_check_source_idx
    ON fleetpace_check (source_id, checked_at);

-- One platform's checks over a time window (status, charts of requests/s by
-- outcome), and pruning: every platform's rows older than the retention are
-- a range of this index, walked per platform.
CREATE INDEX IF NOT EXISTS fleetpace_check_platform_idx
    ON fleetpace_check (platform, checked_at);

-- The dashboard's per-platform figures, one index range per platform shown
-- (never a scan of every source): sources due and how late they are
-- (enabled, due_at <= now(); queued_at tells due from queued without the
-- heap), and the most overdue first.
CREATE INDEX IF NOT EXISTS fleetpace_source_platform_due_at_idx
    ON fleetpace_source (platform, due_at) INCLUDE (queued_at)
    WHERE enabled;

-- Failing sources (consecutive failures): counted per platform and listed,
-- latest check first (keyset pages), by the dashboard. Only failing sources
-- are in it.
CREATE INDEX IF NOT EXISTS fleetpace_source_failing_idx
    ON fleetpace_source (platform, last_checked_at DESC, id DESC)
    WHERE consecutive_failures > 0;

-- schema: which version of this file was applied last (its SHA-256), so a
-- process starting against a current schema runs none of the statements
-- above (each of which locks a table, even when it changes nothing) and
-- cannot deadlock with the workers already running. Written by Apply
-- (schema.go) in the transaction that applied the file.
CREATE TABLE IF NOT EXISTS fleetpace_schema (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    sql_sha256 text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
