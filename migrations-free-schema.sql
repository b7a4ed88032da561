-- fleetpace schema: every table and index fleetpace owns.
--
-- There is no migration framework and no numbered migration: every statement
-- is idempotent (IF NOT EXISTS) and the whole file is applied under one
-- advisory lock by `fleetpace schema apply` (see schema.go), so it is safe to
-- run any number of times, from any number of processes at once. River's own
-- tables are created by rivermigrate in the same locked step.
--
-- A column that is not in its table's CREATE TABLE is added by an ALTER
-- TABLE … ADD COLUMN IF NOT EXISTS after it, so that a database made by an
-- older fleetpace gains it when the schema is applied.

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

-- Adaptive pacing's settings: how the shared multiplier moves. Pressure
-- multiplies it by backoff_factor (once per episode); every decay_after clean
-- responses, fleet-wide, divide it by recovery_factor; with probe, recovery
-- stops just short of the multiplier where the last pressure began and then
-- climbs in small steps. use_headers: pace by the destination's announced
-- rate-limit headers (RateLimit, X-RateLimit-*). respace: a slow-down
-- re-spaces the slots already granted, fleet-wide, at once (false: they
-- are used as granted; a benchmark's baseline). The three switches are
-- named alike everywhere: flags --probe, --use-headers, --respace;
-- sources.Platform's NoProbe, NoUseHeaders, NoRespace (their negation, so
-- that the zero value is the default). Bounds and defaults are sources'
-- (sources.MinFactor, MaxFactor, DefaultBackoffFactor,
-- DefaultRecoveryFactor).
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
-- Reservations in blocks: how many slots the last reservation granted.
ALTER TABLE fleetpace_pace ADD COLUMN IF NOT EXISTS last_count integer NOT NULL DEFAULT 0;
-- Adaptive pacing's state (see docs/design.md, "Adaptive pacing"):
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

-- Estimating adaptation (see docs/design.md, "Adaptive pacing"):
--   adapt           how the platform adapts to pressure: 'estimate' (the
--                   default) measures what the destination accepts and paces
--                   just under it, recovering in time; 'multiplier' is the
--                   shared backoff multiplier (backoff_factor,
--                   recovery_factor, decay_after, probe)
--   est, est_at     the destination's limit as last measured, requests/s (0:
--                   none: the ceiling rules), and when it was set: the pace's
--                   curve starts there (doubled_at stays the latest slow-down
--                   of any kind, which makes older pressure stale)
--   est_max         the rate the refusal that set est came at: the limit is
--                   at least est (what the destination accepted, holds
--                   included) and about est_max; the pace climbs from just
--                   under est back to just under est_max, then past it
--   acc_rate, ref_rate, acc_at, acc_from
--                   the fleet's answers without pressure (accepted) and with
--                   it (refused), exponentially weighted averages
--                   (requests/s) as of acc_at, measured since acc_from
--   acc_cut, ref_cut
--                   the answers accepted and refused to requests reserved
--                   since the last decrease (est_at): the share the
--                   destination accepts at the pace in force
--   acc_cycle       the answers accepted to requests sent (by their slot)
--                   since the end of the latest hold or slow-down: what the
--                   destination accepted in the cycle a refusal ends
--   meas_window, meas_window_at
--                   the time constant of that average: the longest hold a
--                   destination asked for lately (a window's length), and
--                   when it was seen
--   jitter_at       the last lone refusal below the estimate (jitter): a
--                   second one soon after is a real lower limit
--   held_at         the last Retry-After the destination answered: while
--                   recent, what it accepted per unit of time, holds
--                   included, bounds the estimate
--   event_interval  the effective spacing right after the last event (the
--                   pace keeps changing after it): what a process that
--                   missed the event's notification re-spaces by
--   cut_below       the latest decrease began an episode at a pace below the
--                   estimate then in force (a refusal taken for jitter does
--                   too): a limit that dropped refuses what a reading said
--                   was accepted, a probe refuses a pace past the reading
--   est_guess       est and est_max are a guess (the limit moved down), not
--                   a reading: a refusal below them is no jitter, and the
--                   next cut reads the limit again
--   est_plateau     seconds (on the climb's clock) the pace stays at the
--                   reading beyond the approach before it climbs past it
--                   (probes the limit again): t[28] once a probe confirmed
--                   the reading, else 0
--   est_prev        a level the destination accepted under est: the reading
--                   a refusal last raised est from (0: none). A refusal
--                   under a young reading, above est_prev, bisects from it
ALTER TABLE fleetpace_platform
    ADD COLUMN IF NOT EXISTS adapt text NOT NULL DEFAULT 'estimate'
        CONSTRAINT fleetpace_platform_adapt_check CHECK (adapt IN ('estimate', 'multiplier'));
ALTER TABLE fleetpace_pace
    ADD COLUMN IF NOT EXISTS adapt          text             NOT NULL DEFAULT 'estimate',
    ADD COLUMN IF NOT EXISTS est            double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS est_at         double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS est_max        double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS acc_rate       double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS ref_rate       double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS acc_cut        integer          NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS acc_cycle      integer          NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS ref_cut        integer          NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS acc_at         double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS acc_from       double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS meas_window    double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS meas_window_at double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS jitter_at      double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS held_at        double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS event_interval double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS cut_below      boolean          NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS est_guess      boolean          NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS est_plateau    double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS est_prev       double precision NOT NULL DEFAULT 0;

-- A learned window (see docs/design.md, "A learned window"): a destination
-- that holds the fleet until resets on a fixed grid is a fixed window, and
-- the fleet then takes its quota per window at the ceiling and holds at its
-- end, instead of pacing under it.
--   win_resets      the reset bounds of the latest refusals (now + their
--                   Retry-After: no earlier than the destination's reset,
--                   by less than t[41] later), one per window, oldest first
--   win_ra          the longest Retry-After among them (seconds)
--   win_len, win_phase
--                   the window learned from them (seconds; 0: none) and a
--                   reset on its grid (epoch seconds)
--   win_quota       the requests the fleet sends per window
--   win_at, win_count
--                   the window (its start) the reservations counted last,
--                   and the slots they granted in it
--   win_acc, win_acc_prev
--                   answers accepted to requests sent in that window, and
--                   in the one before it (reservations run ahead of the
--                   answers by up to the longest wait)
--   win_clean       windows filled to the quota without a refusal since the
--                   quota last changed: at t[42] the quota grows by one
--                   (-1: the quota is the estimate's guess, not yet read
--                   from a refusal or a window filled)
--   win_try         the first long hold (a Retry-After of 2 s or more) of
--                   a window not learned yet: from its end the fleet sends
--                   at the ceiling until the next refusal, which falls in
--                   the next window and finds its length
--   win_fix         a request was refused in the window the reservations
--                   count: when the next one starts, the quota becomes what
--                   that window accepted (a first guess), or one less
--   win_off         no window is learned before this (epoch seconds): a
--                   window refused before half its quota was no window
ALTER TABLE fleetpace_pace
    ADD COLUMN IF NOT EXISTS win_resets double precision[] NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS win_ra     double precision   NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_len    double precision   NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_phase  double precision   NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_quota  integer            NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_at     double precision   NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_count  integer            NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_acc    integer            NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_acc_prev integer          NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_clean  integer            NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS win_try    boolean            NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS win_fix    boolean            NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS win_off    double precision   NOT NULL DEFAULT 0;

-- Keys and in-flight caps (nested limits). A platform may limit each key —
-- an account, a token's name, a tenant; never a secret — separately as well
-- as the whole (key_rate, key_burst; 0: no per-key rate), and cap the
-- requests open at once, fleet-wide, for the whole (max_in_flight) and per
-- key (key_max_in_flight; 0: no cap). fleetpace_key_limit overrides the
-- per-key settings of single keys (NULL: the platform's).
ALTER TABLE fleetpace_platform
    ADD COLUMN IF NOT EXISTS key_rate          double precision NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS key_burst         integer          NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS max_in_flight     integer          NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS key_max_in_flight integer          NOT NULL DEFAULT 0;
CREATE TABLE IF NOT EXISTS fleetpace_key_limit (
    platform      text             NOT NULL REFERENCES fleetpace_platform (name) ON DELETE CASCADE,
    key           text             NOT NULL,
    rate          double precision,
    burst         integer,
    max_in_flight integer,
    PRIMARY KEY (platform, key)
);
-- A pace row per key in use, beside its platform's (key ''): the same state
-- (cursor, adaptation, hold), created on first use and removed when idle
-- (package pacer). max_in_flight caps the row's open requests; leases are
-- their expiries (epoch seconds): a request's report gives its lease back,
-- a crashed worker's expires.
ALTER TABLE fleetpace_pace
    ADD COLUMN IF NOT EXISTS key           text             NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS max_in_flight integer          NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS leases        double precision[] NOT NULL DEFAULT '{}';
DO $$
BEGIN
    IF (SELECT array_length(conkey, 1) FROM pg_constraint
        WHERE conrelid = 'fleetpace_pace'::regclass AND contype = 'p') = 1 THEN
        ALTER TABLE fleetpace_pace DROP CONSTRAINT fleetpace_pace_pkey, ADD PRIMARY KEY (platform, key);
    END IF;
END
$$;

-- Every platform has a pace row whose configuration columns follow the
-- platform's: `platforms set` takes effect fleet-wide at the next reservation.
-- CREATE OR REPLACE, so `schema apply` brings an older definition up to date.
CREATE OR REPLACE FUNCTION fleetpace_platform_sync_pace() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fleetpace_pace (platform, rate, burst, max_multiplier, decay_after,
                                backoff_factor, recovery_factor, probe, use_headers, respace, adapt, max_in_flight)
    VALUES (NEW.name, NEW.rate_per_sec, NEW.burst, NEW.max_multiplier, NEW.decay_after,
            NEW.backoff_factor, NEW.recovery_factor, NEW.probe, NEW.use_headers, NEW.respace, NEW.adapt, NEW.max_in_flight)
    ON CONFLICT (platform, key) DO UPDATE SET
        max_in_flight   = EXCLUDED.max_in_flight,
        adapt           = EXCLUDED.adapt,
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
    -- The platform's keys in use follow too (fleetpace_pace_key_settings).
    UPDATE fleetpace_pace AS k SET
        (rate, burst, max_in_flight, max_multiplier, decay_after, backoff_factor, recovery_factor,
         probe, use_headers, respace, adapt) =
        (SELECT c.rate, c.burst, c.max_in_flight, NEW.max_multiplier, NEW.decay_after, NEW.backoff_factor,
                NEW.recovery_factor, NEW.probe, NEW.use_headers, NEW.respace, NEW.adapt
         FROM fleetpace_pace_key_settings(NEW.name, k.key) AS c)
    WHERE k.platform = NEW.name AND k.key <> '';
    RETURN NULL;
END
$$;

-- fleetpace_pace_key_settings is a key's rate, burst and in-flight cap: its
-- fleetpace_key_limit row's, else its platform's per-key settings. Without
-- a per-key rate the key runs at its platform's rate (only the platform
-- limits it).
CREATE OR REPLACE FUNCTION fleetpace_pace_key_settings(p_platform text, p_key text)
RETURNS TABLE (rate double precision, burst integer, max_in_flight integer)
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(l.rate, NULLIF(p.key_rate, 0), p.rate_per_sec),
           COALESCE(l.burst, CASE WHEN COALESCE(l.rate, p.key_rate) > 0 THEN p.key_burst ELSE p.burst END),
           COALESCE(l.max_in_flight, p.key_max_in_flight)
    FROM fleetpace_platform AS p
    LEFT JOIN fleetpace_key_limit AS l ON l.platform = p.name AND l.key = p_key
    WHERE p.name = p_platform
$$;

-- A key's override changes its pace row, if the key is in use.
CREATE OR REPLACE FUNCTION fleetpace_key_limit_sync_pace() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r fleetpace_key_limit%ROWTYPE;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    UPDATE fleetpace_pace AS k SET (rate, burst, max_in_flight) =
        (SELECT c.rate, c.burst, c.max_in_flight FROM fleetpace_pace_key_settings(r.platform, r.key) AS c)
    WHERE k.platform = r.platform AND k.key = r.key;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER fleetpace_key_limit_sync_pace
    AFTER INSERT OR UPDATE OR DELETE ON fleetpace_key_limit
    FOR EACH ROW EXECUTE FUNCTION fleetpace_key_limit_sync_pace();

CREATE OR REPLACE TRIGGER fleetpace_platform_sync_pace
    AFTER INSERT OR UPDATE ON fleetpace_platform
    FOR EACH ROW EXECUTE FUNCTION fleetpace_platform_sync_pace();

-- Pace rows made before a configuration column existed take its value now
-- (a no-op once they agree).
UPDATE fleetpace_pace AS s SET
    backoff_factor = p.backoff_factor, recovery_factor = p.recovery_factor,
    probe = p.probe, use_headers = p.use_headers, respace = p.respace, adapt = p.adapt
FROM fleetpace_platform AS p
WHERE p.name = s.platform
  AND s.key = ''
  AND (s.backoff_factor, s.recovery_factor, s.probe, s.use_headers, s.respace, s.adapt)
      IS DISTINCT FROM (p.backoff_factor, p.recovery_factor, p.probe, p.use_headers, p.respace, p.adapt);

-- The pacer's arithmetic (package pacer owns fleetpace_pace and calls these;
-- see docs/design.md, "Pacer" and "Adaptive pacing"). Times are epoch
-- seconds; t is the pacer's tuning, passed by every call so that one set of
-- numbers (pacer/tuning.go) decides everything:
--   t[1] approach: seconds the pace takes to climb from just under the
--        estimate to just under the rate of the refusal (concave: fast at
--        first, flat at the end; flat all along when they are one)
--   t[2] climb: the coefficient of the cubic climb past it
--   t[3] margin: how far under the estimate the fleet settles
--   t[4] late budget: how late after its slot a request may leave
--   t[5] send slack: how long after that it may take to reach the destination
--   t[6] beta: the cut when refusals go on right after a decrease
--   t[7] held floor: the deepest cut a short hold's measurement can make,
--        as a share of the upper reading
--   t[8] calm: seconds after a decrease before a refusal starts a new episode
--   t[9] jitter memory: a second lone refusal within it is a real limit
--   t[10], t[11] the measurement window's bounds, seconds
--   t[12] respace lead, t[13] respace ratio, t[14] announced share (a
--   report that announces a quota passes its own: see pacer.shareOf),
--   t[15] longest hold, t[16] reset memory, t[17] probe margin, t[18] probe
--   steps ('multiplier' mode)
--   t[19] climb rate: under this estimate (requests/s) the plateau at a
--        reading and the climb past it take longer in proportion (not the
--        approach to a bound)
--   t[20] 1: a limit refused below a reading twice is taken for moved down
--        (0: not, a test's control)
--   t[21] restart: with no reading (a start, a limit that moved down), the
--        pace restarts from this share of the refused rate
--   t[22] 1: a refused rate that only bounds the limit is bisected (0: not,
--        a test's control)
--   t[23] steep: once the cubic climb is this share past the reading
--        without a refusal, the limit has moved up: the climb doubles the
--        pace every t[24] seconds from there (0: the cubic all along)
--   t[25] guard: within t[8] of the estimate's setting (a refusal's hold
--        and the calm after it) the fleet settles t[25] × t[3] under the
--        curve instead of t[3] (1: no guard)
--   t[26] bound approach: seconds the approach takes when it aims at a
--        bound's bisection (est_max above est) instead of t[1]
--   t[27] 1: a probe's refusal (a pace at most t[23] past the level last
--        accepted) reads the geometric mean of that level and the refused
--        pace, and a refusal below a reading younger than t[1] is no
--        jitter (0 or NULL, from a process that predates it: not)
--   t[28] confirmed plateau: seconds (on the climb's clock) the plateau at
--        a reading lasts longer once a probe's refusal confirmed it (read
--        within 2 × t[3] of it): each probe costs a refusal and its hold
--        (0 or NULL: not)
--   t[29] 1: a refusal under a reading younger than t[1] confirms the
--        reading it leads to as a probe's does (0 or NULL: not)
--   t[30] 1: a refusal under a reading younger than t[1], above the
--        reading before it (est_prev) and at most 2 × t[23] over it, reads
--        their geometric mean, even within t[8] of the decrease (0 or
--        NULL: not)
--   t[31] 1: with t[30], a refusal under est_prev too (above the pace at
--        it, est_prev × (1 − t[3])) reads the geometric mean of that pace
--        and the refused one, and a probe refused past a bound's target
--        remembers the target as est_prev (0 or NULL: not)
--   t[32] 1: when the measurement window changes, the accepted and
--        refused rates averaged over the old one are carried to the new
--        one (0 or NULL: read as if averaged over the new one)
--   t[33] 1: a reading is younger than an approach (t[1]) on the climb's
--        clock, which runs slower in proportion under t[19] (0 or NULL:
--        in seconds)
--   t[34] 1: a probe refused past the steep turn (over est × (1 + t[23]))
--        with a Retry-After reads the geometric mean of the refused pace
--        and the pace one hold (at most t[10]) before (0 or NULL: the
--        refused pace)
--   t[35] where holds longer than t[10] were asked for lately (a
--        window or a log), a refusal under a reading younger than t[1]
--        held for longer than t[35] seconds reads at most the accepted
--        count since the hold before over the time from its end to this
--        hold's end (0 or NULL: not)
--   t[36] 1: a refusal under a reading younger than t[1], at a pace
--        under it, reads at most the refused pace × N/(N+1), N the
--        requests accepted since the hold before, at most t[3] under
--        it and not under est_prev when est_prev is under it (0 or NULL:
--        not)
--   t[37] a refusal with no reading (a start's, or within t[8] of a
--        cut on a bound's approach) held for at most t[10], at least 2
--        accepted to requests sent since the hold before (acc_cycle),
--        reads at most the largest of t[37] × the upper reading, the
--        count accepted over the hold's whole seconds, and the geometric
--        mean of the upper reading and the count over the cycle (0 or
--        NULL: not)
--   t[38] t[37] reads a cycle only where the fleet sent (accepted, and
--        this refusal) at least this share of the slots the refused pace
--        offered since the hold before (0 or NULL: whatever it sent)
--   t[39] 1: where an event's hold (or pause) reaches its horizon (every
--        granted slot after the pivot is given back), the cursor goes to
--        the hold's end (0 or NULL: a spacing past the horizon)
--   t[40] the shortest window learned from refusals' resets, seconds (0
--        or NULL: none is learned)
--   t[41] how much later than the destination's reset a refusal's reset
--        bound (now + Retry-After) may be: Retry-After in whole seconds
--        rounds up by up to one, and the report comes after the answer
--   t[42] windows filled to the learned quota without a refusal before
--        the quota grows by one (a probe)

-- fleetpace_pace_tau is the burst tolerance (seconds) a platform's GCRA
-- uses: (burst - 1) / rate, less what lateness needs beyond one spacing
-- (late budget + send slack - 1 / rate): the burst pays for lateness first.
CREATE OR REPLACE FUNCTION fleetpace_pace_tau(rate float8, burst int, t float8[])
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT GREATEST((burst - 1) / NULLIF(rate, 0) - GREATEST(t[4] + t[5] - 1.0 / NULLIF(rate, 0), 0), 0)
$$;

-- fleetpace_pace_ceiling is the shortest spacing the ceiling allows: 1 /
-- rate, stretched when the burst cannot pay for lateness, so that requests
-- leaving up to t[4] late and arriving up to t[5] after that still make at
-- most floor(rate + burst) in any 1-s window at the destination:
-- ceil((1 + t[4] + t[5] + tau) / spacing) <= floor(rate + burst).
CREATE OR REPLACE FUNCTION fleetpace_pace_ceiling(rate float8, burst int, t float8[])
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT GREATEST(1.0 / NULLIF(rate, 0),
                    (1 + t[4] + t[5] + fleetpace_pace_tau(rate, burst, t)) / GREATEST(floor(rate + burst), 1))
$$;

-- fleetpace_pace_climb is the spacing adaptation asks for: the
-- multiplier's (multiplier / rate), or, estimating, the pace `since`
-- (seconds, on the climb's clock) after the estimate was set: from just
-- under est (1 - t[3]) it climbs to just under est_max, fast at first and
-- flat at the end (a cubic over t[1] seconds), then past it ever faster
-- (× 1 + t[2]·x³, and once that is × 1 + t[23], doubling every t[24]
-- seconds); never faster than the ceiling. No estimate: the ceiling.
CREATE OR REPLACE FUNCTION fleetpace_pace_climb(adapt text, rate float8, multiplier float8, est float8,
                                                est_max float8, since float8, t float8[])
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN adapt = 'multiplier' THEN GREATEST(multiplier, 1.0) / NULLIF(rate, 0)
                WHEN est <= 0 THEN 1.0 / NULLIF(rate, 0)
                WHEN since < t[1]
                THEN 1.0 / LEAST(NULLIF(rate, 0), (1 - t[3]) * (GREATEST(est_max, est)
                                 - (GREATEST(est_max, est) - est) * power(1 - GREATEST(since, 0) / t[1], 3)))
                WHEN t[23] > 0 AND t[2] * power(since - t[1], 3) > t[23]
                THEN 1.0 / LEAST(NULLIF(rate, 0), (1 - t[3]) * GREATEST(est_max, est) * (1 + t[23])
                                 * power(2, (since - t[1] - cbrt(t[23] / t[2])) / t[24]))
                ELSE 1.0 / LEAST(NULLIF(rate, 0), (1 - t[3]) * GREATEST(est_max, est) * (1 + t[2] * power(since - t[1], 3)))
           END
$$;

-- fleetpace_pace_adaptive is fleetpace_pace_climb `since` seconds after
-- the estimate was set. Under an estimate of t[19] requests/s the climb's
-- clock runs slower in proportion, so a slow destination is probed past
-- its limit after as many requests as one at t[19], not after as many
-- seconds: each probe costs a refusal (a fixed window of 2/s, climbing on
-- the clock of 8/s, refused 5 %). The approach to a bound (est_max above
-- est: a start's bisection, a cut right after a decrease) runs on the
-- clock, and takes t[26] seconds instead of t[1] (mapped onto the climb's
-- t[1]; NULL from a process that predates it: t[1]): it climbs to what is
-- likely accepted, and slowed, a start at 2/s took 48 s to reach its
-- limit; the bisection is a guess, found wrong sooner the sooner the fleet
-- is there. The plateau at a reading and every climb past the target are
-- the probes; the plateau at a reading lasts `plateau` seconds longer (on
-- the climb's clock: est_plateau, a reading a probe confirmed). Where the
-- estimate is a reading (not a
-- bound: est_max no higher), within t[8] of its setting (the refusal's
-- hold and the calm after it, seconds on the real clock) the margin is
-- t[25] times wider: a refusal in that time is read as the decrease not
-- being enough (a deeper cut, or a limit that dropped), and on a loaded
-- machine a request 5–10 ms late at a strict limiter's 4 % edge made that
-- reading of plain jitter. (This and fleetpace_pace_interval took no
-- plateau before est_plateau; those signatures stay in a database an older
-- fleetpace made, for its processes until they are upgraded: they pace
-- without the confirmed plateau.)
CREATE OR REPLACE FUNCTION fleetpace_pace_adaptive(adapt text, rate float8, multiplier float8, est float8,
                                                   est_max float8, plateau float8, since float8, t float8[])
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN adapt <> 'multiplier' AND est > 0 AND est >= est_max * 0.99 AND since < t[8] AND COALESCE(t[25], 1) > 1
                THEN GREATEST(c * (1 - t[3]) / GREATEST(1 - t[3] * t[25], 0.5), 1.0 / NULLIF(rate, 0))
                ELSE c END
    FROM fleetpace_pace_climb(adapt, rate, multiplier, est, est_max,
                              CASE WHEN est_max > est * 1.0001
                                   THEN LEAST(since * t[1] / COALESCE(t[26], t[1]), t[1]) + GREATEST(since - COALESCE(t[26], t[1]), 0) * LEAST(1.0, est_max / NULLIF(t[19], 0))
                                   ELSE GREATEST(LEAST(since * LEAST(1.0, est / NULLIF(t[19], 0)), t[1]),
                                                 since * LEAST(1.0, est / NULLIF(t[19], 0)) - GREATEST(plateau, 0)) END, t) AS c
$$;

-- fleetpace_pace_interval is a platform's effective spacing at now: the
-- largest of adaptation's, the ceiling's and, while it holds, the
-- destination's announced one.
CREATE OR REPLACE FUNCTION fleetpace_pace_interval(adapt text, rate float8, burst int, multiplier float8, est float8,
                                                   est_max float8, plateau float8, est_at float8, announced_interval float8,
                                                   announced_until float8, now float8, t float8[])
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT GREATEST(fleetpace_pace_adaptive(adapt, rate, multiplier, est, est_max, plateau, now - est_at, t),
                    fleetpace_pace_ceiling(rate, burst, t),
                    CASE WHEN now < announced_until THEN announced_interval ELSE 0 END)
$$;

-- fleetpace_pace_window finds a fixed window in the reset bounds of
-- refusals (now + Retry-After, each no earlier than the destination's
-- reset and less than t[41] later): the longest whole number of seconds,
-- from t[40] (and the longest Retry-After among them, which a window's
-- refusal never exceeds) to t[11], that puts every bound within t[41]
-- after a point of one grid (phase + n × length), and that phase: the
-- bound all the others lie just after. None with fewer than three bounds,
-- but two of consecutive windows (less than twice the longest Retry-After
-- apart: a window is at least that long), whose length is then the whole
-- seconds nearest their distance (any length within t[41] of it would
-- fit both).
-- A window's length is a whole number of seconds everywhere we know of,
-- and a longer grid fits fewer bounds by chance.
CREATE OR REPLACE FUNCTION fleetpace_pace_window(resets float8[], ra float8, t float8[])
RETURNS TABLE (len float8, phase float8) LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT l::float8, r.x
    FROM generate_series(GREATEST(ceil(ra), ceil(t[40]))::int,
                         LEAST(t[11], (SELECT max(y) - min(y) FROM unnest(resets) AS y) + t[41])::int) AS l,
         unnest(resets) AS r(x)
    WHERE COALESCE(t[40], 0) > 0
      AND (cardinality(resets) >= 3
           OR cardinality(resets) = 2 AND resets[2] - resets[1] < 2 * ra AND l = round(resets[2] - resets[1]))
      AND NOT EXISTS (SELECT 1 FROM unnest(resets) AS o(y)
                      WHERE (o.y - r.x) - l * floor((o.y - r.x) / l) >= t[41])
    ORDER BY l DESC, r.x DESC
    LIMIT 1
$$;

-- fleetpace_pace_channel_name is how a pace row is named in notifications:
-- "platform", or "platform/hex of the key" (a platform name has no '/'; a
-- key may hold any character, the payload's separator included).
CREATE OR REPLACE FUNCTION fleetpace_pace_channel_name(p_platform text, p_key text)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_key = '' THEN p_platform ELSE p_platform || '/' || encode(convert_to(p_key, 'UTF8'), 'hex') END
$$;

-- fleetpace_pace_report applies what p_answered answers without pressure
-- (p_clean of them clean, p_fresh of them to requests reserved since the
-- latest slow-down the caller knew of, p_sent_from the earliest slot they
-- went at), or one answer with pressure, told the caller,
-- and what the destination announced, to a platform's pace row; see
-- pacer's reportSQL for the parameters and docs/design.md ("Adaptive
-- pacing") for the rules. It returns the row's state after it; a report
-- that slows the platform down is an event, announced on channel
-- fleetpace_pace by pg_notify (delivered at commit). No row: nothing.
-- It takes every parameter (no defaults); the form without p_sent_from
-- (below, the form an older process calls and would create again) calls
-- it. Had this one defaults too, a call of 17 arguments would match both
-- and be ambiguous.
DROP FUNCTION IF EXISTS fleetpace_pace_report(text, float8, boolean, float8, float8, float8, integer, integer, integer,
                                              float8, float8, float8, text, float8, float8, float8[], text, float8);
CREATE FUNCTION fleetpace_pace_report(
    p_platform text, p_now float8, p_pressure boolean, p_reserved_at float8, p_sent_interval float8,
    p_retry float8, p_answered integer, p_clean integer, p_fresh integer,
    p_announced float8, p_announced_ttl float8, p_quota_hold float8, p_reason text,
    p_window float8, p_limit float8, t float8[], p_key text, p_sent_from float8)
RETURNS TABLE (r_multiplier float8, r_max_multiplier float8, r_streak integer, r_effect smallint, r_hold_left float8,
               r_event_seq bigint, r_event_at float8, r_interval float8, r_shift float8, r_horizon float8,
               r_hold_at float8, r_respaced boolean, r_window float8, r_estimate float8)
LANGUAGE plpgsql AS $$
DECLARE
    s           fleetpace_pace%ROWTYPE;
    v_now       float8;
    v_stale     boolean;
    v_m0        float8;           -- the multiplier before
    v_m         float8;           -- after (estimating: the ceiling over the pace, for humans)
    v_mp        float8;
    v_streak    integer;
    v_steps     integer := 0;
    v_effect    smallint := 0;    -- 3 slowed, 4 at the slowest, 5 stale, 6 relaxed, 7 jitter, 8 quota (pacer's effect* codes)
    v_est       float8;
    v_est_at    float8;
    v_est_max   float8;
    v_plateau   float8;           -- est_plateau after
    v_prev      float8;           -- est_prev after
    v_under     boolean := false; -- a refusal under a young reading bisected from est_prev
    v_held      boolean;          -- the destination held the fleet lately (a Retry-After)
    v_slowed    float8;           -- doubled_at after: the latest slow-down of any kind
    v_tau       float8;           -- the measurement's time constant
    v_tau0      float8;           -- v_tau before this report's hold changed it
    v_decay     float8;           -- the rates' decay since the last report
    v_carry     float8;           -- the rates' scale when the window changes (t[32])
    v_share     float8;           -- the share of answers accepted lately
    v_acc       float8;           -- the accepted rate, corrected while the measurement is young
    v_sent      float8;           -- the rate the refused request was sent at
    v_reading   boolean;          -- est is a reading: not none, not the ceiling's, not a guess
    v_young     boolean;          -- est is younger than an approach, on the climb's clock (t[33])
    v_then      float8;           -- the pace a hold before a probe's refusal (t[34])
    v_cycle     float8;           -- from the end of the hold before to this hold's end (t[35])
    v_cycle_from float8;          -- where a start's cycle began: the end of the hold before (t[37])
    v_excess    float8;           -- the refused pace less one request in N + 1 (t[36])
    v_floor     float8;           -- the lowest estimate allowed
    v_hurried   boolean;          -- refusals go on within calm of a decrease
    v_guess     boolean := false; -- the limit moved down: est_max is a guess
    v_hold      float8;
    v_win       float8;
    v_win_kept  boolean;
    v_win_new   boolean;
    v_ann       float8;           -- the spacing announced now (NULL: none)
    v_ann_i     float8;           -- the announced spacing in force after
    v_ann_until float8;
    v_quota_paced boolean;        -- the fleet paced the announced quota already
    v_quota_refused boolean;      -- a refusal the exhausted quota explains
    v_i_old     float8;
    v_i_new     float8;
    v_ratio     float8;
    v_pivot     float8;
    v_first     float8;
    v_retro     float8 := 0;
    v_event     boolean;
    v_shift     float8;
    v_doubled   float8;           -- doubled_at after
    v_wres      float8[];         -- win_resets after
    v_wra       float8;           -- win_ra after
    v_wlen      float8;           -- win_len after
    v_wphase    float8;           -- win_phase after
    v_wq        integer;          -- win_quota after
    v_wacc      integer;          -- win_acc after
    v_wclean    integer;          -- win_clean after
    v_wr        float8;           -- this refusal's reset bound
    v_wfit      record;           -- fleetpace_pace_window's answer
    v_wprev     integer;          -- win_acc_prev after
    v_wgot      integer;          -- what the refused request's window accepted
    v_wtry      boolean;          -- win_try after
    v_wfix      boolean;          -- win_fix after
    v_woff      float8;           -- win_off after
BEGIN
    SELECT * INTO s FROM fleetpace_pace WHERE platform = p_platform AND key = p_key AND rate > 0 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_now := COALESCE(p_now, date_part('epoch', clock_timestamp()));
    v_stale := p_pressure AND COALESCE(p_reserved_at, v_now) < s.doubled_at;
    v_slowed := s.doubled_at;
    v_est := s.est;
    v_est_at := s.est_at;
    v_est_max := s.est_max;
    v_plateau := s.est_plateau;
    v_prev := s.est_prev;
    v_m0 := GREATEST(1.0, LEAST(s.multiplier, s.max_multiplier));
    v_m := v_m0;
    v_mp := s.pressure_mult;
    v_streak := CASE WHEN p_pressure THEN 0 ELSE s.clean_streak + p_clean END;

    -- The quota window: the longest any process saw lately.
    v_win_kept := v_now - s.announced_window_at < t[16];
    v_win := GREATEST(COALESCE(p_window, 0), CASE WHEN v_win_kept THEN s.announced_window ELSE 0 END);
    v_win_new := s.use_headers AND p_window > 0 AND (p_window >= s.announced_window OR NOT v_win_kept);
    IF s.use_headers AND p_announced IS NOT NULL THEN
        -- The quota's limit per the longest window any process saw (the
        -- long-run rate), when the limit is known.
        -- Paced at t[14] of it: the share the reporting process passes
        -- for this quota (by the slack the destination showed it).
        v_ann := LEAST(CASE WHEN p_limit > 0 AND v_win > 0 THEN v_win / (p_limit * t[14]) ELSE p_announced END, t[15]);
    END IF;
    v_ann_i := COALESCE(v_ann, CASE WHEN v_now < s.announced_until THEN s.announced_interval ELSE 0 END);
    v_ann_until := CASE WHEN v_ann IS NOT NULL THEN v_now + p_announced_ttl ELSE s.announced_until END;

    -- An exhausted quota holds the fleet until its reset. When the fleet
    -- already paced the quota before this report (spaced at least w / q,
    -- the announced spacing in force, and ceil(w / spacing) + burst - 1
    -- <= q: no window of the destination gets more than q of its
    -- requests, but for jitter), the answer that exhausted the window was
    -- close to its end, and a reset sent in whole seconds (IETF t=,
    -- RateLimit-Reset, an epoch X-RateLimit-Reset) is rounded up by up to
    -- a second: the hold is then a second shorter (the true reset is no
    -- earlier). Held by the rounded reset, a fleet paced at a 1-s
    -- window's quota lost most of the next window every other second
    -- (0.59 of the quota; 0.97 without). A fractional reset is exact, and
    -- holds as it is.
    v_quota_paced := p_limit > 0 AND v_win > 0 AND v_now < s.announced_until AND s.announced_interval > 0
                     AND ceil(v_win / s.announced_interval - 1e-9) + s.burst - 1 <= p_limit;
    v_hold := GREATEST(s.hold_until,
                       CASE WHEN p_pressure THEN v_now + p_retry END,
                       CASE WHEN s.use_headers THEN v_now + CASE WHEN v_quota_paced AND p_quota_hold = trunc(p_quota_hold)
                                                                 THEN GREATEST(p_quota_hold - 1, 0) ELSE p_quota_hold END END);
    v_i_old := fleetpace_pace_interval(s.adapt, s.rate, s.burst, v_m0, s.est, s.est_max, s.est_plateau, s.est_at,
                                       s.announced_interval, s.announced_until, v_now, t);
    IF (s.win_len > 0 AND s.win_quota > 0 OR s.win_try) AND s.announced_until <= v_now THEN
        -- A learned window, or one tried: the reservations went at the
        -- ceiling (reserveSQL).
        v_i_old := fleetpace_pace_ceiling(s.rate, s.burst, t);
    END IF;

    IF s.adapt = 'multiplier' THEN
        IF p_pressure AND v_stale THEN
            v_effect := 5;
        ELSIF p_pressure AND v_m0 < s.max_multiplier THEN
            v_m := LEAST(v_m0 * s.backoff_factor, s.max_multiplier);
            v_mp := v_m0;
            v_slowed := v_now;
            v_effect := 3;
        ELSIF p_pressure THEN
            v_effect := 4;
        ELSE
            v_steps := LEAST(v_streak / GREATEST(s.decay_after, 1), 64);
            IF v_steps > 0 THEN
                IF v_ann_i > 0 THEN
                    -- The destination says what it allows; the streak confirms it.
                    v_m := GREATEST(LEAST(v_m0 / power(s.recovery_factor, v_steps), v_ann_i * s.rate), 1.0);
                ELSIF NOT s.probe OR s.pressure_mult <= 0 THEN
                    v_m := GREATEST(v_m0 / power(s.recovery_factor, v_steps), 1.0);
                ELSIF v_m0 > s.pressure_mult * (1 + t[17]) THEN
                    v_m := GREATEST(v_m0 / power(s.recovery_factor, v_steps), s.pressure_mult * (1 + t[17]));
                ELSE
                    v_m := GREATEST(v_m0 / power(s.recovery_factor, v_steps / t[18]), 1.0);
                END IF;
                IF v_m < s.pressure_mult / (1 + t[17]) THEN
                    v_mp := 0;
                END IF;
                IF v_m0 > 1 THEN
                    v_effect := 6;
                END IF;
            END IF;
            v_streak := v_streak % GREATEST(s.decay_after, 1);
        END IF;
    ELSE
        -- Measure what the destination accepts: the fleet's answers without
        -- pressure and with it, averaged over the measurement window (the
        -- longest hold a destination asked for lately — a fixed window's
        -- length —, at least t[10]), restarted after a silence of three
        -- windows.
        v_tau := LEAST(GREATEST(CASE WHEN v_now - s.meas_window_at < t[16] THEN s.meas_window ELSE 0 END, t[10]), t[11]);
        -- Held lately: the destination's holds are part of what it allows.
        v_held := v_now - s.held_at < 2 * v_tau;
        IF p_pressure AND p_retry > 0 THEN
            s.held_at := v_now;
        END IF;
        IF p_pressure AND p_retry > 0 AND (p_retry >= s.meas_window OR v_now - s.meas_window_at >= t[16]) THEN
            -- The longest hold asked for lately: a window's length.
            s.meas_window := LEAST(p_retry, t[11]);
            s.meas_window_at := v_now;
            v_tau0 := v_tau;
            v_tau := LEAST(GREATEST(s.meas_window, t[10]), t[11]);
            -- The rates so far were averaged over the old window: carried
            -- to the new one (t[32]) they read the same rate since
            -- acc_from. Read as if averaged over the new one, a 10-s
            -- window of 20 refused 2.2 s into a run (Retry-After 8) read
            -- 6.9/s, four times what it accepts, and the fleet walked
            -- down from there for 40 s.
            IF COALESCE(t[32], 0) > 0 AND v_tau <> v_tau0 AND s.acc_at > 0 AND v_now > s.acc_from THEN
                v_carry := (1 - exp(-(v_now - s.acc_from) / v_tau)) / GREATEST(1 - exp(-(v_now - s.acc_from) / v_tau0), 1e-9);
                s.acc_rate := s.acc_rate * v_carry;
                s.ref_rate := s.ref_rate * v_carry;
            END IF;
        END IF;
        IF s.acc_at = 0 OR v_now - s.acc_at > 3 * v_tau THEN
            s.acc_rate := 0;
            s.ref_rate := 0;
            s.acc_from := v_now;
        ELSE
            v_decay := exp(-(v_now - s.acc_at) / v_tau);
            s.acc_rate := s.acc_rate * v_decay;
            s.ref_rate := s.ref_rate * v_decay;
        END IF;
        s.acc_rate := s.acc_rate + GREATEST(p_answered, 0) / v_tau;
        s.ref_rate := s.ref_rate + p_pressure::int / v_tau;
        -- The share accepted at the pace in force: of the answers to
        -- requests reserved since the last decrease, before this one (a
        -- refusal does not count against itself).
        s.acc_cut := s.acc_cut + GREATEST(p_fresh, 0);
        -- The cycle's: answers to requests that went (by their slot) since
        -- the end of the latest hold or slow-down. Not by the process's
        -- knowledge (acc_cut's): answers to requests sent before a hold
        -- reach the row after it when their process heard of it late, and
        -- a strict bucket of 8/s whose cycle holds one request counted
        -- several. A batch whose earliest answer went before counts
        -- nothing (its answers are not told apart): the count errs low,
        -- and the rule then reads nothing.
        IF NOT p_pressure AND p_sent_from >= GREATEST(s.hold_until, s.doubled_at) THEN
            s.acc_cycle := s.acc_cycle + GREATEST(p_answered, 0);
        END IF;
        v_share := COALESCE(s.acc_cut::float8 / NULLIF(s.acc_cut + s.ref_cut, 0), 1);
        -- A refusal whose answer says the announced quota ran out (a
        -- request in flight when it did, one more than the quota in a
        -- window by jitter, the start's requests before the first
        -- announcement) is the quota's: its hold until the reset answers
        -- it, and the announcement paces the fleet. It reads nothing of
        -- the limit. Cut like an unexplained refusal, the estimate held
        -- the fleet under the announced quota for half a minute (0.54 of
        -- an announced 1-s window of 7 after one refusal at the start).
        v_quota_refused := p_pressure AND s.use_headers AND p_quota_hold IS NOT NULL;
        -- A tried window's refusal (win_try) with a short Retry-After is
        -- no window's reset: the burst ran into a log that still held the
        -- requests of the hold before, or a bucket. It reads nothing
        -- either: cut by it, the estimate paced a sliding log of 67 per
        -- 10 s at 0.82 of it, the burst's own requests refused again
        -- a log's length later. (Its reset bound is kept all the same.)
        v_quota_refused := v_quota_refused OR p_pressure AND s.win_try AND COALESCE(p_retry, 0) < 2;
        IF p_pressure AND NOT v_stale AND NOT v_quota_refused THEN
            s.ref_cut := s.ref_cut + 1;
        END IF;
        s.acc_at := v_now;
        v_acc := s.acc_rate / GREATEST(1 - exp(-(v_now - s.acc_from) / v_tau), 0.05);

        IF p_pressure AND v_stale THEN
            v_effect := 5;
        ELSIF v_quota_refused THEN
            v_effect := 8;
        ELSIF p_pressure THEN
            v_sent := 1.0 / COALESCE(NULLIF(p_sent_interval, 0), v_i_old);
            v_hurried := s.est > 0 AND v_now - s.est_at < t[8];
            v_reading := s.est > 0 AND s.est < s.rate * 0.999 AND NOT s.est_guess;
            -- Younger than an approach: on the climb's clock (t[33]), which
            -- runs slower under climbRate, as the plateau at the reading
            -- does. In seconds, a window of 2/s read 6 % over its quota by
            -- a probe and refused 17 s later, at the pace under it, took
            -- that refusal for jitter, kept the reading, and was refused
            -- again every half minute.
            v_young := v_now - s.est_at < t[1] / CASE WHEN COALESCE(t[33], 0) > 0
                                                      THEN GREATEST(LEAST(1.0, s.est / NULLIF(t[19], 0)), 0.05) ELSE 1 END;
            -- (The ceiling is no reading: a refusal under it is no jitter.)
            IF v_reading AND NOT v_hurried AND v_sent < s.est * 0.999 AND v_share >= 1 - t[3] / 2
               AND v_now - s.jitter_at >= t[9]
               AND (COALESCE(t[27], 0) = 0 OR NOT v_young) THEN
                -- A lone refusal below the estimate while nearly everything
                -- is accepted: jitter (a request that left late, one that
                -- arrived early). Keep the estimate; start the plateau again.
                -- Not below a reading younger than an approach (t[27]): the
                -- reading is then what is wrong (a fixed window let a probe
                -- run over its quota), and each refusal it is kept for costs
                -- a hold.
                v_effect := 7;
                v_est_max := s.est;
                v_est_at := v_now;
                s.jitter_at := v_now;
            ELSE
                -- The refusal came at v_sent. What the destination accepted
                -- of what the fleet sent there is the limit's upper reading
                -- (est_max: v_sent when nearly everything was accepted until
                -- now — a probe found it —, less under refusal). Its lower
                -- reading (est, where the pace restarts from) is the same,
                -- cut deeper when refusals go on right after a decrease, and
                -- no more than what a destination that holds the fleet
                -- accepted per unit of time, holds included. A destination
                -- that holds the fleet for longer than the shortest
                -- measurement resets by windows: that is all it allows.
                v_floor := s.rate / s.max_multiplier / (1 - t[3]);
                v_est_max := GREATEST(v_sent * v_share, v_floor);
                v_est := v_est_max;
                -- A probe's refusal (t[27]): the pace climbed from a level
                -- the destination accepted (the reading, or a bound's
                -- target once passed) to the refused one, at most t[23]
                -- past it (further, the limit moved up: the refused pace is
                -- the reading). The limit lies between the two: a token
                -- bucket refuses right where the pace crosses it, but a
                -- fixed window lets a pace over its quota run until one of
                -- its windows gets one too many (a window of 2/s was
                -- refused at 2.3/s, and each refusal walking the reading
                -- down 4 % cost a hold). The reading is their geometric
                -- mean.
                IF COALESCE(t[27], 0) > 0 AND NOT v_hurried AND v_reading
                   AND v_est_max > s.est AND v_sent <= GREATEST(s.est, s.est_max) * (1 + t[23]) THEN
                    v_est_max := sqrt(CASE WHEN s.est_max > s.est * 1.0001 AND v_sent > s.est_max * (1 - t[3])
                                           THEN s.est_max ELSE s.est END * v_est_max);
                    v_est := v_est_max;
                ELSIF COALESCE(t[30], 0) > 0 AND s.est_prev > 0 AND v_reading
                      AND s.est_max <= s.est * 1.0001 AND v_sent < s.est * 0.999 AND v_young
                      AND v_est_max > s.est_prev * (CASE WHEN COALESCE(t[31], 0) > 0 THEN 1 - t[3] ELSE 1 END) * 1.0001
                      AND v_est_max <= s.est_prev * (1 + 2 * t[23]) THEN
                    -- Refused under a young reading, above the level
                    -- accepted before it (est_prev): the limit lies
                    -- between the two. A fixed window lets a probe run over
                    -- its quota until one of its windows fills, and a climb
                    -- turned steep meanwhile was refused 20–30 % over the
                    -- quota and read as a limit that moved up (a 1-s window
                    -- of 10/s: 10.3/s, then 12.0/s). The pace at that
                    -- reading is refused within seconds: cut × t[6] within
                    -- calm, it fell to 7.4/s; read as the refused pace, the
                    -- reading walked down by the margin, a refusal and a
                    -- hold a step. The reading is their geometric mean,
                    -- when they are close (2 × t[23]): a limit that doubled
                    -- is refused at the guard's pace too (a bucket drained
                    -- by the overshoot), and the mean of the old and the new
                    -- limit is no reading of either. Refused under
                    -- est_prev itself (t[31]: a probe read 10.29 → 11.62/s,
                    -- the guard's pace refused at 10.22/s), the level
                    -- accepted is the pace at est_prev, a margin under it.
                    v_est_max := sqrt(CASE WHEN v_est_max > s.est_prev * 1.0001 THEN s.est_prev ELSE s.est_prev * (1 - t[3]) END
                                      * v_est_max);
                    v_est := v_est_max;
                    v_under := true;
                ELSIF COALESCE(t[34], 0) > 0 AND NOT v_hurried AND v_reading AND s.est_max <= s.est * 1.0001 AND p_retry > 0
                      AND v_sent > s.est * (1 + t[23]) THEN
                    -- A probe refused past the steep turn (t[34]): the limit
                    -- moved up, or the reading was low. The refusal is the
                    -- destination's answer to a pace it saw a while ago — a
                    -- fixed window's refusal comes when one of its windows
                    -- fills, up to a window after the pace crossed its
                    -- quota, and the climb doubles every t[24] seconds
                    -- meanwhile — so the refused pace reads the limit
                    -- high (a bucket of 8/s that doubled read 18.3/s, and
                    -- the guard's pace under it was refused and cut to
                    -- 11.3/s; a 1-s window of 7 read 8.3/s and walked down
                    -- a margin a refusal). The pace the fleet sent one
                    -- hold earlier (the destination's window, at most
                    -- t[10]) was accepted: the reading is the geometric
                    -- mean of the two.
                    v_then := LEAST(1.0 / fleetpace_pace_adaptive(s.adapt, s.rate, v_m0, s.est, s.est_max, s.est_plateau,
                                                                  v_now - LEAST(p_retry, t[10]) - s.est_at, t), s.rate);
                    IF v_then < v_est_max THEN
                        v_est_max := sqrt(GREATEST(v_then, s.est) * v_est_max);
                        v_est := v_est_max;
                    END IF;
                END IF;
                -- Refused right after a decrease, or with no reading yet (a
                -- start: the ceiling's pace), the refused rate is only a
                -- bound: the limit lies between the restart (t[6] of it, or
                -- t[21] at a start) and it. The approach then aims at their
                -- geometric mean, a bisection, instead of the bound, where
                -- it would be refused again (and held) within seconds; if
                -- the mean is accepted, the climb past it goes on.
                IF v_hurried AND NOT v_under THEN
                    v_est := LEAST(v_est, v_sent * t[6]);
                END IF;
                IF s.est <= 0 OR s.est >= s.rate * 0.999 THEN
                    v_est := LEAST(v_est, v_est_max * t[21]);
                END IF;
                IF t[22] > 0 AND v_est < v_est_max THEN
                    v_est_max := sqrt(v_est * v_est_max);
                END IF;
                IF s.acc_rate <= 0 THEN
                    -- Nothing accepted was measured: a key's row, which
                    -- hears of its answers only through the platform's.
                    -- What it "accepted" over the hold is no reading.
                    NULL;
                ELSIF v_held AND (s.meas_window > t[10] OR v_share < 1 - t[3] / 2) THEN
                    -- Short holds (at most t[10]: a strict limiter's or a
                    -- bucket's penalty, a 1-s window's rest) cut at most to
                    -- t[7] of the upper reading: after a burst at the
                    -- ceiling the holds themselves pull the accepted rate
                    -- far under what the destination allows. A lone refusal
                    -- after a short hold (nearly everything accepted since
                    -- the last decrease: a second jitter) cuts to what was
                    -- accepted, not to the rate the hold itself pulled down.
                    v_est := LEAST(v_est, CASE WHEN s.meas_window > t[10] THEN v_acc ELSE GREATEST(v_acc, v_est_max * t[7]) END);
                    IF s.meas_window > t[10] THEN
                        v_est_max := v_est;
                    END IF;
                ELSIF p_retry > t[10] THEN
                    -- The first long hold: a window (or a log) that will
                    -- not take more until it resets. What was accepted
                    -- since the measurement began, over that time and the
                    -- hold, is its quota per window.
                    v_est := LEAST(v_est, v_acc * (v_now - s.acc_from) / (v_now - s.acc_from + p_retry));
                    v_est_max := v_est;
                END IF;
                -- Refused with no reading to stand on (a start's, or within
                -- calm of a cut that aimed at a bound's bisection: t[37];
                -- not a cut from a reading, where a strict limiter's
                -- jitter refuses after a few requests and the cycle is
                -- mostly its hold) and held a short while (a 1-s
                -- window's rest, a bucket's penalty), with at least two
                -- requests sent since the hold before accepted (acc_cycle;
                -- a strict limiter refuses the second one over its rate):
                -- what was accepted over the cycle, from the end of the hold before
                -- to the end of this one, is a lower reading (a window's
                -- quota over its length and the hold's rounding; a small
                -- bucket's burst), and the refused pace the upper one. The
                -- limit is read at their geometric mean, a bisection, at
                -- least the count over the hold's whole seconds (a window
                -- of that length) and t[37] of the upper reading (a
                -- bucket with a burst of 2 looks like a 1-s window of 2 in
                -- one cycle). Cut by t[6] a refusal, a 1-s window of 2
                -- under a ceiling of 20/s walked down from 10/s in five
                -- refusals and holds, over 8–11 s.
                -- The count is a reading only where the fleet sent at its
                -- pace through the cycle (t[38]: at least that share of
                -- the slots the refused pace offered since the hold
                -- before): a start whose sources come due over its first
                -- seconds sent two in a second at 9.6/s, and the rule read
                -- a strict bucket of 8/s at 3.6/s (a window of 2).
                v_cycle_from := GREATEST(s.hold_until, s.doubled_at, s.acc_from);
                IF COALESCE(t[37], 0) > 0 AND s.acc_rate > 0 AND v_tau <= t[10] AND s.acc_cycle >= 2 AND p_retry > 0
                   AND (NOT v_reading OR v_hurried AND s.est_max > s.est * 1.0001)
                   AND (COALESCE(t[38], 0) <= 0 OR s.acc_cycle + 1 >= t[38] * v_sent * (v_now - v_cycle_from)) THEN
                    v_est := LEAST(v_est, GREATEST(v_est_max * t[37], s.acc_cycle / ceil(p_retry),
                                                   sqrt(v_est_max * s.acc_cycle / (v_now + p_retry - v_cycle_from))));
                END IF;
                -- Refused under a young reading where the destination holds
                -- the fleet for longer than the shortest measurement (a
                -- window or a log: t[35]): the fleet paced the reading from
                -- the end of the hold before (a window's reset) and the
                -- window filled; this hold ends at the next reset. What was
                -- accepted from the one end to the other is the window's
                -- quota, over its length: the limit is no more than that.
                -- Read as the refused pace, a 10-s window of 20 read 2.77/s
                -- and walked down by the margin, a refusal and a hold a
                -- step. A hold of a second (Retry-After: 1) is no window's
                -- rest: a strict limiter's next slot or a sliding log's next
                -- expiry, rounded up (read, a log of 66 per 10 s read
                -- 6.0/s); nor is a cycle shorter than half the longest hold.
                v_cycle := v_now + p_retry - GREATEST(s.hold_until, s.doubled_at);
                IF COALESCE(t[35], 0) > 0 AND v_tau > t[10] AND p_retry > t[35] AND v_reading AND NOT v_hurried AND v_young
                   AND v_sent < s.est * 0.999 AND s.acc_cut > 0 AND v_cycle >= s.meas_window / 2 THEN
                    v_est := LEAST(v_est, s.acc_cut / v_cycle);
                    v_est_max := LEAST(v_est_max, GREATEST(v_est, s.acc_cut / v_cycle));
                END IF;
                -- Refused on the plateau under a young reading (t[36]): the
                -- destination let the pace through since the hold before
                -- until it had one request too many, so the limit is at
                -- least one request in N + 1 under the pace (N accepted
                -- since): a limiter refuses once the excess over its rate
                -- passes its tolerance, a request at least. A fixed window
                -- refuses the first of its windows that gets one too many,
                -- sooner or later by its phase: the step is at most a
                -- margin, and not under a reading a refusal raised this
                -- one from (est_prev) if the refused pace is above it: its
                -- pace was accepted (a probe's cycle over ten minutes
                -- landed 4 % under it otherwise). Read as the refused
                -- pace, a 1-s window of 2 read 2.41/s and walked down by
                -- the margin, a refusal and a hold a step: five refusals
                -- in a minute.
                IF COALESCE(t[36], 0) > 0 AND v_reading AND NOT v_hurried AND v_young AND v_sent < s.est * 0.999
                   AND s.acc_cut > 0 THEN
                    v_excess := GREATEST(v_sent * GREATEST(s.acc_cut::float8 / (s.acc_cut + 1), 1 - t[3]),
                                         CASE WHEN s.est_prev < v_sent THEN s.est_prev ELSE 0 END);
                    v_est := LEAST(v_est, v_excess);
                    v_est_max := LEAST(v_est_max, v_excess);
                END IF;
                IF t[20] > 0 AND v_hurried AND v_reading AND v_sent < s.est * 0.999 AND v_sent >= t[19] AND p_retry > 0
                   AND (s.cut_below OR s.jitter_at > 0 AND s.jitter_at >= s.est_at) THEN
                    -- A destination that holds the fleet refused a pace below
                    -- the estimate, the pace a reading said was accepted (a
                    -- refusal taken for jitter, or one that began an
                    -- episode), and refuses again right after, below the
                    -- estimate again: the limit moved down, by at least
                    -- that much, and what was read before is gone (what was
                    -- accepted lately too: it lags). Restart from no more
                    -- than half the refused rate (or climb_rate: slower,
                    -- the climb would be slowed too). That is a guess, not
                    -- a reading: the climb past it starts after half an
                    -- approach, not a whole one. (A probe's refusal comes
                    -- past the reading; at a start there is no reading, or
                    -- the ceiling's. Under t[19] the climb back from a
                    -- wrong guess is slowed too, by a minute: a fixed
                    -- window of 2/s, paced just over its quota, is refused
                    -- in pairs and was taken for a drop.)
                    v_est := LEAST(v_est, GREATEST(v_sent * t[21], LEAST(t[19], v_est_max)));
                    v_est_max := v_est;
                    v_guess := true;
                END IF;
                v_est := GREATEST(v_est, v_floor);
                v_est_max := GREATEST(v_est_max, v_est);
                -- A probe's refusal (past the plateau at a reading: not a
                -- bound's approach, not right after a decrease) that reads
                -- what the reading did, within two margins, confirms it:
                -- the plateau at it lasts t[28] longer before the next
                -- probe. Each probe costs a refusal and its hold (a strict
                -- limiter's Retry-After: 1, a 1-s window's rest): a probe
                -- every 19 s and the margin
                -- were 0.894 of a strict bucket of 8/s over 10 minutes. A
                -- limit that rose is still found by the next probe, t[28]
                -- later. So does a refusal under a reading younger than
                -- t[1] (t[29]): the probe read the limit a little high (a
                -- fixed window lets a pace over its quota run until one
                -- of its windows fills), and the two refusals bracket it.
                -- Anything else is a new reading: the plateau is t[1]'s.
                v_plateau := CASE WHEN NOT v_hurried AND v_reading AND NOT v_guess
                                       AND s.est_max <= s.est * 1.0001
                                       AND (v_sent >= s.est * (1 - t[3] / 2) OR COALESCE(t[29], 0) > 0 AND v_young)
                                       AND v_est >= v_est_max * 0.999999 AND abs(v_est / s.est - 1) <= 2 * t[3]
                                  THEN GREATEST(COALESCE(t[28], 0), 0) ELSE 0 END;
                -- At the slowest (a cooldown follows): the estimate stays at
                -- its floor, and the pace was at the floor already (its
                -- plateau after an earlier refusal, or a ceiling the floor
                -- reaches: max_multiplier 1).
                v_effect := CASE WHEN v_est <= v_floor * 1.000001
                                      AND (s.est > 0 AND s.est <= v_floor * 1.000001
                                           OR 1.0 / v_i_old <= s.rate / s.max_multiplier * 1.000001)
                                 THEN 4 ELSE 3 END;
                -- The approach starts when the hold ends (climbing during the
                -- hold, a fleet came back at the bound it was refused at);
                -- a guess holds for half an approach, then climbs past.
                v_est_at := GREATEST(v_now, LEAST(v_hold, v_now + t[11]))
                            - CASE WHEN v_guess AND v_est >= v_est_max * 0.999999
                                   THEN t[1] / 2 / LEAST(1.0, v_est_max / NULLIF(t[19], 0)) ELSE 0 END;
                v_slowed := v_now;
                s.cut_below := NOT v_hurried AND v_sent < s.est * 0.999 AND NOT s.est_guess;
                -- The level accepted under the new reading: the reading a
                -- refusal raised it from, or a bound's target the pace
                -- passed before its refusal (t[31]: a bound's approach, then
                -- a rise read at 13.62/s, and the guard's pace refused
                -- within calm was cut to 8.39/s), or, under it, the one
                -- before (still under).
                v_prev := CASE WHEN v_reading AND s.est_max <= s.est * 1.0001
                                    AND v_est > s.est * 1.0001 AND v_est >= v_est_max * 0.999999 AND NOT v_guess
                               THEN s.est
                               WHEN COALESCE(t[31], 0) > 0 AND v_reading
                                    AND s.est_max > s.est * 1.0001 AND v_sent > s.est_max * (1 - t[3])
                                    AND v_est > s.est_max * 1.0001 AND v_est >= v_est_max * 0.999999 AND NOT v_guess
                               THEN s.est_max
                               WHEN s.est_prev > 0 AND v_est < s.est AND v_est > s.est_prev * 1.0001 AND v_est >= v_est_max * 0.999999
                                    AND NOT v_guess
                               THEN s.est_prev
                               ELSE 0 END;
                s.est_guess := v_guess;
                s.acc_cut := 0;
                s.ref_cut := 0;
            END IF;
        END IF;
        v_m := s.rate * fleetpace_pace_adaptive(s.adapt, s.rate, v_m0, v_est, v_est_max, v_plateau, v_now - v_est_at, t);
    END IF;

    -- A learned window (t[40]; docs/design.md, "A learned window"). Each
    -- refusal's reset bound (now + Retry-After) is kept, one per window of
    -- the destination; where the latest ones lie on one grid of whole
    -- seconds, with a Retry-After of 2 s or more among them (a strict
    -- limiter's or a bucket's next slot is under a second away, rounded
    -- up to one), the destination is a fixed window: the fleet takes its
    -- quota per window at the ceiling (reserveSQL counts the slots) and
    -- holds at the window's end, where pacing under the quota left a
    -- share of every window unused and each probe past it cost a hold.
    v_wres := s.win_resets;
    v_wra := s.win_ra;
    v_wlen := s.win_len;
    v_wphase := s.win_phase;
    v_wq := s.win_quota;
    v_wacc := s.win_acc;
    v_wclean := s.win_clean;
    v_wprev := s.win_acc_prev;
    -- A tried window ends at the next refusal, whatever it reads.
    v_wtry := s.win_try AND NOT p_pressure;
    v_wfix := s.win_fix;
    v_woff := s.win_off;
    IF NOT p_pressure AND s.win_len > 0 AND p_sent_from >= s.win_at THEN
        v_wacc := v_wacc + GREATEST(p_answered, 0);
    ELSIF NOT p_pressure AND s.win_len > 0 AND p_sent_from >= s.win_at - s.win_len THEN
        v_wprev := v_wprev + GREATEST(p_answered, 0);
    END IF;
    IF COALESCE(t[40], 0) > 0 AND p_key = '' AND s.adapt = 'estimate' AND p_pressure AND NOT v_stale AND p_retry > 0
       AND NOT (v_quota_refused AND NOT s.win_try) THEN
        v_wr := v_now + p_retry;
    END IF;
    IF v_wr IS NOT NULL AND v_now >= v_woff THEN
        IF cardinality(v_wres) > 0 AND abs(v_wr - v_wres[cardinality(v_wres)]) < t[41] THEN
            -- The same window's reset: the earlier bound is the tighter.
            v_wres[cardinality(v_wres)] := LEAST(v_wres[cardinality(v_wres)], v_wr);
        ELSE
            v_wres := v_wres || v_wr;
            v_wres := v_wres[GREATEST(cardinality(v_wres) - 3, 1):];
        END IF;
        v_wra := GREATEST(v_wra, p_retry);
        IF v_wra >= 2 THEN
            SELECT w.len, w.phase INTO v_wfit FROM fleetpace_pace_window(v_wres, v_wra, t) AS w;
            IF v_wfit.len IS NOT NULL AND v_wfit.len <> v_wlen THEN
                -- A window learned, or a new length. Its quota is a
                -- guess on the high side (a fifth and one more than the
                -- estimate per window or what was accepted since the
                -- hold before, a window's quota or more, the answers
                -- still in their processes' batches aside): the first
                -- window then ends in a refusal, and what it accepted
                -- becomes the quota (below). Too low, it would stay
                -- so until the probes found the rest, a request per
                -- t[42] windows.
                v_wlen := v_wfit.len;
                v_wphase := v_wfit.phase;
                v_wq := ceil(1.2 * GREATEST(GREATEST(s.est, v_est) * v_wlen, s.acc_cycle, 1))::int + 1;
                v_wclean := -1;
            ELSIF v_wfit.len IS NOT NULL THEN
                v_wphase := v_wfit.phase;
                IF p_sent_from >= s.win_at AND v_wclean >= 0 AND v_wacc * 2 < v_wq THEN
                    -- Refused before half a known quota was accepted in
                    -- the window: no fixed window. A sliding log lets
                    -- the fleet's bursts through while their expiries
                    -- fall on one grid, and refuses one of them once a
                    -- burst goes out later than the one a log's length
                    -- before it; a limit that dropped far refuses too.
                    -- The estimate paces again, from what the window
                    -- took, and no window is learned for t[11].
                    v_wlen := 0;
                    v_wres := '{}';
                    v_wra := 0;
                    v_woff := v_now + t[11];
                    v_est := v_wq / s.win_len;
                    v_est_max := v_est;
                    v_est_at := v_now;
                    v_plateau := 0;
                    s.est_guess := false;
                ELSIF p_sent_from >= s.win_at THEN
                    -- Refused inside the window the reservations
                    -- count: the quota was one too many (a probe's, or
                    -- the first guess), or less is left to the fleet.
                    -- When the next window starts (reserveSQL), a first
                    -- guess becomes what this window accepted (the
                    -- answers its processes gather in batches are all
                    -- in by then: read at the refusal, a 10-s window of
                    -- 20 read 18), a known quota one less.
                    v_wfix := true;
                ELSIF p_sent_from >= s.win_at - s.win_len THEN
                    -- Refused in the window before: what it accepted.
                    v_wq := GREATEST(LEAST(v_wq - 1, v_wprev), 1);
                    v_wclean := 0;
                END IF;
            ELSIF v_wlen > 0 THEN
                -- The bounds no longer lie on one grid (a sliding log
                -- whose requests' expiries fell on one while the fleet
                -- sent in bursts on it, then moved): the latest two may
                -- find it again. Meanwhile the estimate paces, from what
                -- the window took, just under it: cut by its own rules
                -- while the window paced, from refusals at the ceiling's
                -- pace, it read a log of 67 per 10 s at 3.3/s.
                v_wlen := 0;
                v_wres := v_wres[cardinality(v_wres) - 1:];
                v_est := v_wq / s.win_len;
                v_est_max := v_est;
                v_est_at := v_now;
                v_plateau := 0;
                s.est_guess := false;
            END IF;
            -- The first long hold of a window not known yet: from its
            -- end (the window's reset) the fleet sends at the ceiling
            -- until refused, in the next window, at its quota. Paced
            -- by the estimate, the next refusal came a probe later,
            -- windows later (a 10-s window of 2/s: 27 s).
            v_wtry := v_wlen = 0 AND cardinality(v_wres) = 1 AND p_retry >= 2;
        END IF;
    END IF;
    v_i_new := fleetpace_pace_interval(s.adapt, s.rate, s.burst, v_m, v_est, v_est_max, v_plateau, v_est_at,
                                       v_ann_i, v_ann_until, v_now, t);
    IF (v_wlen > 0 AND v_wq > 0 OR v_wtry) AND v_ann_until <= v_now THEN
        v_i_new := fleetpace_pace_ceiling(s.rate, s.burst, t);
    END IF;
    v_ratio := GREATEST(v_i_new / v_i_old, 1);
    v_pivot := v_now + t[12];
    v_first := CASE WHEN s.cursor_at > v_pivot THEN s.cursor_at - floor((s.cursor_at - v_pivot) / v_i_old) * v_i_old ELSE v_pivot END;
    IF v_win > 0 AND v_ann_i > 0 THEN
        v_retro := GREATEST(LEAST(s.cursor_at, v_pivot) - GREATEST(s.run_start, v_pivot - v_win), 0) * (v_ratio - 1);
    END IF;
    v_event := s.respace AND (v_effect IN (3, 7) AND v_ratio > 1.000001 OR v_ratio > t[13] OR v_hold > GREATEST(s.hold_until, v_now));
    -- Slots moved later go after the hold, after the run's quota window
    -- (retro), and a whole new spacing after the pivot: a slot left where it
    -- was may lie just before the pivot, and a strict limiter refuses two
    -- requests closer than its spacing.
    v_shift := GREATEST(GREATEST(v_hold, s.paused_until) - (v_pivot + (v_first - v_pivot) * v_ratio), v_retro,
                        CASE WHEN v_ratio > 1.000001 THEN v_i_new - (v_first - v_pivot) * v_ratio ELSE 0 END, 0);

    v_doubled := CASE WHEN v_event AND (v_ratio > 1.000001 OR v_shift > 0) THEN v_now ELSE v_slowed END;
    UPDATE fleetpace_pace AS u SET
        multiplier = v_m, clean_streak = v_streak, pressure_mult = v_mp,
        est = v_est, est_max = v_est_max, est_at = v_est_at, est_plateau = v_plateau, est_prev = v_prev,
        doubled_at = v_doubled,
        hold_until = v_hold,
        hold_reason = CASE WHEN v_hold > s.hold_until THEN p_reason ELSE s.hold_reason END,
        announced_interval = v_ann_i, announced_until = v_ann_until,
        announced_window = CASE WHEN v_win_new THEN p_window ELSE s.announced_window END,
        announced_window_at = CASE WHEN v_win_new THEN v_now ELSE s.announced_window_at END,
        acc_rate = s.acc_rate, ref_rate = s.ref_rate, acc_at = s.acc_at, acc_from = s.acc_from,
        acc_cut = s.acc_cut, ref_cut = s.ref_cut,
        acc_cycle = CASE WHEN GREATEST(v_hold, v_doubled) > GREATEST(s.hold_until, s.doubled_at) THEN 0 ELSE s.acc_cycle END,
        meas_window = s.meas_window, meas_window_at = s.meas_window_at, jitter_at = s.jitter_at, held_at = s.held_at,
        cut_below = s.cut_below, est_guess = s.est_guess,
        -- Slots moved past the horizon are given back, so the cursor ends
        -- a spacing after it at most; and where the hold (or the pause)
        -- reaches the horizon, every slot after the pivot is given back
        -- (moved to the hold or later, or landing inside it), and the
        -- next reservation takes the hold's end: a spacing after the
        -- horizon left a hole there after each Retry-After as long as the
        -- callers' wait (a strict bucket of 8/s, one request a probe).
        cursor_at = CASE WHEN v_event AND s.cursor_at > v_pivot
                         THEN LEAST(v_pivot + (s.cursor_at - v_pivot) * v_ratio + v_shift, GREATEST(v_now + s.last_max_wait, v_pivot) + v_i_new,
                                    CASE WHEN GREATEST(v_hold, s.paused_until) >= GREATEST(v_now + s.last_max_wait, v_pivot) AND COALESCE(t[39], 0) > 0
                                         THEN GREATEST(v_hold, s.paused_until, v_pivot + v_i_new + COALESCE(v_retro, 0)) END)
                         WHEN v_event
                         THEN LEAST(s.cursor_at + v_retro, GREATEST(v_now + s.last_max_wait, v_pivot) + v_i_new)
                         ELSE s.cursor_at END,
        last_interval = v_i_new,
        event_seq = s.event_seq + v_event::int,
        event_at = CASE WHEN v_event THEN v_now ELSE s.event_at END,
        event_interval = CASE WHEN v_event THEN v_i_new ELSE s.event_interval END,
        event_shift = CASE WHEN v_event THEN v_shift ELSE s.event_shift END,
        event_horizon = CASE WHEN v_event THEN GREATEST(v_now + s.last_max_wait, v_pivot) ELSE s.event_horizon END,
        last_respaced = v_event,
        last_effect = v_effect,
        win_resets = v_wres, win_ra = v_wra, win_len = v_wlen, win_phase = v_wphase, win_quota = v_wq,
        win_acc = CASE WHEN v_wlen <> s.win_len THEN 0 ELSE v_wacc END,
        win_acc_prev = CASE WHEN v_wlen <> s.win_len THEN 0 ELSE v_wprev END,
        win_at = CASE WHEN v_wlen <> s.win_len THEN 0 ELSE s.win_at END,
        win_count = CASE WHEN v_wlen <> s.win_len THEN 0 ELSE s.win_count END,
        win_clean = v_wclean, win_try = v_wtry, win_fix = v_wfix AND v_wlen = s.win_len, win_off = v_woff
    WHERE u.platform = p_platform AND u.key = p_key
    RETURNING u.* INTO s;

    IF v_event THEN
        PERFORM pg_notify('fleetpace_pace', fleetpace_pace_channel_name(s.platform, s.key) || '|' || s.event_seq || '|' || s.event_at || '|' || s.last_interval
                                            || '|' || s.event_shift || '|' || s.event_horizon
                                            || '|' || GREATEST(s.hold_until, s.paused_until));
    END IF;
    RETURN QUERY SELECT s.multiplier, s.max_multiplier, s.clean_streak, s.last_effect,
                        GREATEST(s.hold_until - v_now, 0), s.event_seq, s.event_at, s.last_interval,
                        s.event_shift, s.event_horizon, GREATEST(s.hold_until, s.paused_until), s.last_respaced,
                        CASE WHEN v_now - s.announced_window_at < t[16] THEN s.announced_window ELSE 0 END,
                        s.est;
END
$$;

-- fleetpace_pace_report without p_sent_from: a process that does not send
-- it (nothing counts towards acc_cycle).
CREATE OR REPLACE FUNCTION fleetpace_pace_report(
    p_platform text, p_now float8, p_pressure boolean, p_reserved_at float8, p_sent_interval float8,
    p_retry float8, p_answered integer, p_clean integer, p_fresh integer,
    p_announced float8, p_announced_ttl float8, p_quota_hold float8, p_reason text,
    p_window float8, p_limit float8, t float8[], p_key text DEFAULT '')
RETURNS TABLE (r_multiplier float8, r_max_multiplier float8, r_streak integer, r_effect smallint, r_hold_left float8,
               r_event_seq bigint, r_event_at float8, r_interval float8, r_shift float8, r_horizon float8,
               r_hold_at float8, r_respaced boolean, r_window float8, r_estimate float8)
LANGUAGE sql AS $$
    SELECT * FROM fleetpace_pace_report(p_platform, p_now, p_pressure, p_reserved_at, p_sent_interval, p_retry,
                                        p_answered, p_clean, p_fresh, p_announced, p_announced_ttl, p_quota_hold,
                                        p_reason, p_window, p_limit, t, p_key, NULL::float8)
$$;

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
-- For the operator's view of rate limiting: which rule started the
-- cooldown (cause: 'slowest_pace' — pressure while the platform was paced
-- as slowly as it may be; 'retry_after' — a Retry-After longer than the
-- fetcher's limit; '' — the fetcher said stop) and the Retry-After that
-- came with it (seconds, 0: none), so status can say how the length was
-- decided.
ALTER TABLE fleetpace_cooldown
    ADD COLUMN IF NOT EXISTS cause         text             NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS retry_after_s double precision NOT NULL DEFAULT 0;

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

-- Nested limits: the source's key (an account, a token's name,
-- a tenant — never a secret; '' for none), which the platform may limit
-- separately (fleetpace_platform.key_rate and friends).
ALTER TABLE fleetpace_source ADD COLUMN IF NOT EXISTS key text NOT NULL DEFAULT '';
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'fleetpace_source'::regclass AND conname = 'fleetpace_source_key_bounds') THEN
        ALTER TABLE fleetpace_source ADD CONSTRAINT fleetpace_source_key_bounds CHECK (octet_length(key) <= 200);
    END IF;
END
$$;

-- Fair order: never checked first (their fair key is -infinity), then
-- longest since checked, ties by id; per key of a platform, since the scan
-- takes keys in turns (package scan). The due query walks this index per
-- (platform, key) from the key's head. due_at is its last key column, after
-- the id (so it orders nothing): the walk's due_at <= now() is an index
-- condition, which the index tests before it looks at the heap, so a walk
-- passing sources not due yet costs no heap fetch for them (as an included
-- column it was a filter, tested after the visibility check: one heap
-- fetch per source passed on every page a check or a tick had changed
-- since the last vacuum, most of a walk at 200,000 sources).
-- last_checked_at is included so the walk is an index-only scan (the
-- planner takes an expression from an index only when its columns are
-- there too). Queued and disabled sources are not in it. It replaces
-- fleetpace_source_key_fair_idx (due_at included, not a key column),
-- fleetpace_source_fair_idx (platform, fair key, id), which walked a
-- platform's sources over all its keys, and fleetpace_source_due_idx
-- (last_checked_at NULLS FIRST: a fair key with no NULLs can be bounded
-- in an index condition).
CREATE INDEX IF NOT EXISTS fleetpace_source_key_due_idx
    ON fleetpace_source (platform, key, COALESCE(last_checked_at, '-infinity'::timestamptz), id, due_at) INCLUDE (last_checked_at)
    WHERE enabled AND queued_at IS NULL;
DROP INDEX IF EXISTS fleetpace_source_key_fair_idx;
DROP INDEX IF EXISTS fleetpace_source_fair_idx;
DROP INDEX IF EXISTS fleetpace_source_due_idx;

-- Bounds of the settings of platforms and sources: the numbers are package
-- sources' (sources/bounds.go: MinRate, MaxRate, MaxBurst,
-- MaxMultiplierLimit, MaxDecayAfter, MinCooldown, MaxCooldown, MinInterval,
-- MaxInterval), which validates them in Go before anything is written;
-- sources.TestSchemaAgreesWithBounds checks that these constraints draw
-- every limit exactly there. A database made by an older fleetpace has
-- looser checks instead (*_check, which let a rate of 1e-300, an interval of
-- 0 or a burst of 2^31 in, or failed with a raw error): they are replaced
-- once, in one ALTER per table, after bringing rows outside the bounds to
-- the nearest one. Later runs find the bounds and do nothing.
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

-- Bounds of the nested limits (sources/bounds.go: MinRate, MaxRate,
-- MaxBurst, MaxInFlight, MaxKeyBytes; sources.TestSchemaAgreesWithBounds):
-- a platform's per-key rate is 0 (none) or a rate, its caps 0 (none) or
-- at most MaxInFlight; a key's own limits are NULL (the platform's) or the
-- same, on a key that is not empty.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'fleetpace_platform'::regclass AND conname = 'fleetpace_platform_key_rate_bounds') THEN
        ALTER TABLE fleetpace_platform
            ADD CONSTRAINT fleetpace_platform_key_rate_bounds
                CHECK (key_rate = 0 OR (key_rate >= 1e-4 AND key_rate <= 1e9)),
            ADD CONSTRAINT fleetpace_platform_key_burst_bounds
                CHECK (key_burst >= 1 AND key_burst <= 1000000),
            ADD CONSTRAINT fleetpace_platform_max_in_flight_bounds
                CHECK (max_in_flight >= 0 AND max_in_flight <= 10000),
            ADD CONSTRAINT fleetpace_platform_key_max_in_flight_bounds
                CHECK (key_max_in_flight >= 0 AND key_max_in_flight <= 10000);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint
                   WHERE conrelid = 'fleetpace_key_limit'::regclass AND conname = 'fleetpace_key_limit_bounds') THEN
        ALTER TABLE fleetpace_key_limit
            ADD CONSTRAINT fleetpace_key_limit_bounds
                CHECK (key <> '' AND octet_length(key) <= 200
                       AND (rate IS NULL OR (rate >= 1e-4 AND rate <= 1e9))
                       AND (burst IS NULL OR (burst >= 1 AND burst <= 1000000))
                       AND (max_in_flight IS NULL OR (max_in_flight >= 0 AND max_in_flight <= 10000)));
    END IF;
END
$$;

-- platform_due: the heads the due query (package scan) reads instead of
-- probing every platform and key: one row per key of a platform that has
-- enabled, unqueued sources (key '' included), with its head — the key's
-- first due source in fair order (head_key is its COALESCE(last_checked_at,
-- '-infinity'), head_id its id; NULL when none is due) — valid until
-- valid_until, when a source of the key that would come before the head
-- falls due. first marks each platform's key with the first head: the
-- platform's first due source over all its keys. The scan keeps them
-- (refreshSQL) from the change log below. With 10,000 platforms, or
-- 100,000 keys on one, the due query reads platforms in the order of their
-- first keys' heads, and a platform's keys in the order of theirs, as far
-- as the tick needs.
CREATE TABLE IF NOT EXISTS fleetpace_platform_due (
    platform    text        PRIMARY KEY REFERENCES fleetpace_platform (name) ON DELETE CASCADE,
    head_key    timestamptz,
    head_id     bigint,
    valid_until timestamptz NOT NULL DEFAULT '-infinity'
);

-- due_change: an append-only log of keys whose head may have moved,
-- written by the statement triggers below (no lock shared by writers) and
-- consumed by the next scan tick. due_at: the earliest due_at among the
-- statement's enabled, unqueued sources of the key ('-infinity' when a due
-- source left: queued, disabled or deleted); fair_key: the least fair key
-- (COALESCE(last_checked_at, '-infinity')) among those sources (NULL: not
-- known). A source whose fair key comes after its key's head cannot become
-- the head when it falls due: a check (last checked now) does not shorten
-- its head's validity.
CREATE TABLE IF NOT EXISTS fleetpace_due_change (
    platform text        NOT NULL,
    due_at   timestamptz NOT NULL
);
ALTER TABLE fleetpace_due_change ADD COLUMN IF NOT EXISTS key text NOT NULL DEFAULT '';
ALTER TABLE fleetpace_due_change ADD COLUMN IF NOT EXISTS fair_key timestamptz;

-- Added with keys: a row per key instead of one per platform. The
-- platforms' rows go (the keys' rows replace them), the table's key
-- becomes (platform, key), and every key of every source is logged once as
-- changed, so the next tick computes every key's head (a scan of the
-- sources, once).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                   WHERE attrelid = 'fleetpace_platform_due'::regclass AND attname = 'key' AND NOT attisdropped) THEN
        DELETE FROM fleetpace_platform_due;
        ALTER TABLE fleetpace_platform_due
            ADD COLUMN key   text    NOT NULL DEFAULT '',
            ADD COLUMN first boolean NOT NULL DEFAULT false,
            DROP CONSTRAINT fleetpace_platform_due_pkey,
            ADD PRIMARY KEY (platform, key);
        INSERT INTO fleetpace_due_change (platform, key, due_at)
        SELECT DISTINCT platform, key, '-infinity'::timestamptz FROM fleetpace_source
        WHERE enabled AND queued_at IS NULL;
    END IF;
END
$$;
DROP TRIGGER IF EXISTS fleetpace_platform_due_init ON fleetpace_platform;
DROP FUNCTION IF EXISTS fleetpace_platform_due_init();

-- Platforms in the order of their first keys' heads (the due query's
-- candidates).
CREATE INDEX IF NOT EXISTS fleetpace_platform_due_first_idx
    ON fleetpace_platform_due (head_key, head_id) WHERE first;
DROP INDEX IF EXISTS fleetpace_platform_due_head_idx;
-- A platform's keys in the order of their heads.
CREATE INDEX IF NOT EXISTS fleetpace_platform_due_key_head_idx
    ON fleetpace_platform_due (platform, head_key, head_id) WHERE head_id IS NOT NULL;
-- Keys whose head expires (a source before it falls due). Only those are
-- in it: an index of every key would be a way to walk a platform's keys
-- the planner takes when its statistics count few keys (one full walk per
-- platform).
CREATE INDEX IF NOT EXISTS fleetpace_platform_due_expiry_idx
    ON fleetpace_platform_due (valid_until) WHERE valid_until < 'infinity';

-- One function for every statement trigger on fleetpace_source: inserted or
-- updated sources that are enabled and unqueued may become their key's head
-- (now, or at their due_at); a due source that leaves (queued, disabled,
-- deleted) may have been one. A truncation leaves no key and no head.
CREATE OR REPLACE FUNCTION fleetpace_source_due_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        DELETE FROM fleetpace_platform_due;
        RETURN NULL;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO fleetpace_due_change (platform, key, due_at, fair_key)
        SELECT platform, key, min(due_at), min(COALESCE(last_checked_at, '-infinity'::timestamptz)) FROM fleetpace_new_sources
        WHERE enabled AND queued_at IS NULL GROUP BY platform, key;
    END IF;
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO fleetpace_due_change (platform, key, due_at)
        SELECT DISTINCT platform, key, '-infinity'::timestamptz FROM fleetpace_old_sources
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
-- Added later: the fetches each worker had sent and not yet got an answer
-- for, per platform, at its last heartbeat ({"platform": n}); status sums
-- them over the live workers.
ALTER TABLE fleetpace_worker ADD COLUMN IF NOT EXISTS in_flight jsonb NOT NULL DEFAULT '{}';

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

-- dashboard_epoch: the dashboard's sign-out epoch, one row, owned by package
-- dashboard. Every session cookie carries the epoch it was issued in, and a
-- session of an older epoch is refused: signing out bumps it, which ends
-- every session issued before, in every process sharing the database (a
-- cookie copied before the sign-out cannot be replayed after it).
CREATE TABLE IF NOT EXISTS fleetpace_dashboard_epoch (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),
    epoch bigint  NOT NULL DEFAULT 0
);
INSERT INTO fleetpace_dashboard_epoch DEFAULT VALUES ON CONFLICT DO NOTHING;

-- What "due" means, defined once here for every statement that asks it:
-- the scan's due query, `sources list --due`, the status counts and the
-- dashboard.
--
-- fleetpace_due_source: the sources due by their own state — enabled, not
-- queued, past due_at (the partial index fleetpace_source_key_due_idx
-- holds the enabled, unqueued ones, fleetpace_source_platform_due_at_idx
-- the enabled ones by due_at). A view is inlined by the planner: reading
-- it is reading fleetpace_source with these conditions.
CREATE OR REPLACE VIEW fleetpace_due_source AS
SELECT * FROM fleetpace_source WHERE enabled AND queued_at IS NULL AND due_at <= now();

-- fleetpace_platform_stop: per platform, whether it takes no new jobs now —
-- it cools down (fleetpace_cooldown) or an operator paused it (the pacer's
-- row: paused_until, epoch seconds of the database clock). A source is due
-- now when it is a fleetpace_due_source and its platform is not stopped.
CREATE OR REPLACE VIEW fleetpace_platform_stop AS
SELECT platform, cooling_down, paused, cooling_down OR paused AS stopped
FROM (SELECT p.name AS platform,
             EXISTS (SELECT 1 FROM fleetpace_cooldown c WHERE c.platform = p.name AND c.until > now()) AS cooling_down,
             EXISTS (SELECT 1 FROM fleetpace_pace x WHERE x.platform = p.name AND x.key = ''
                                                  AND x.paused_until > date_part('epoch', now())) AS paused
      FROM fleetpace_platform p) AS s;

-- fleetpace_unfinished_jobs: the ids of River's jobs that have not finished
-- (neither completed, discarded nor cancelled), for the scan's
-- reconciliation of queued sources. A function rather than a view, so that
-- River's own migrations of river_job never meet an object depending on it
-- (River's tables come after this file: its body is checked when called);
-- the planner inlines it into the statement that reads it.
SET LOCAL check_function_bodies = off;
CREATE OR REPLACE FUNCTION fleetpace_unfinished_jobs() RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM river_job WHERE state NOT IN ('completed', 'discarded', 'cancelled')
$$;
SET LOCAL check_function_bodies = on;

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
