package pacer

// All of the pacer's SQL. Times are epoch seconds of the database clock
// (clock_timestamp(), read after the row lock is taken, inside the SET), so
// every process measures against one clock.

// Codes written to fleetpace_pace.last_effect by the report that wrote the
// row last; RETURNING hands them back so one round trip tells the caller what
// was decided.
const (
	effectNone    = 0 // clean report without halving
	effectDoubled = 3 // pressure doubled the multiplier
	effectAtMax   = 4 // pressure while the multiplier was already at its maximum
	effectStale   = 5 // pressure for a request reserved before the latest doubling
	effectHalved  = 6 // decay_after clean reports halved the multiplier
)

// reserveSQL takes up to $4 consecutive reservations (a block) in one
// statement. $1 platform, $2 the longest wait the caller accepts, in seconds,
// $3 the shortest (0 but while the process also honours its local share just
// after an outage; the row then books the slot the request will really use).
//
// GCRA: interval i = multiplier / rate, tau = (burst - 1) / rate. With
// t = now + min wait and b = max(cursor, t, hold_until), the k-th of n
// reservations taken at once gets slot max(t, hold_until, b - tau + k·i) —
// exactly what n single reservations in a row would get. k slots are granted,
// as many as start within the max wait (at most $4); the cursor moves to
// b + k·i, or stays where it is when none does. Idle time never accumulates
// into a larger burst because b restarts from now.
//
// last_slot is written as the first slot and last_count as k; with the new
// cursor and burst the caller rebuilds every other slot: slot k is
// max(first, cursor - tau - (count - k)·i). The multiplier is read, not
// written: reports keep it within [1, max_multiplier], and the platform
// trigger caps it when the maximum is lowered.
// The platform's rate, burst and maximum multiplier are read from the pace
// row itself (a trigger copies them from fleetpace_platform on every change);
// the rate and maximum multiplier are returned for the degraded-mode cache.
// Every platform has a pace row. Should one be missing, the INSERT branch
// creates it without configuration (rate 0, or a foreign-key error if the
// platform does not exist); a row with rate 0 grants nothing, and the caller
// copies the configuration with syncRowSQL and reserves again.
//
// The statement's server time is mostly building and evaluating
// expressions, so: date_part, not extract (extract(epoch …) computes in
// numeric since PostgreSQL 14); and OFFSET 0 keeps the planner from pulling
// the sub-selects up, which would copy b and k into every expression that
// uses them (nine copies of b; measured: 10–15 % fewer statements per second).
const reserveSQL = `
INSERT INTO fleetpace_pace AS s (platform) VALUES ($1)
ON CONFLICT (platform) DO UPDATE SET
    (cursor_at, last_slot, last_count) = (
        SELECT CASE WHEN g.k > 0 THEN g.b + g.k * g.i ELSE s.cursor_at END, g.first, g.k
        FROM (SELECT f.b, f.i, f.first,
                     CASE WHEN s.rate <= 0 OR f.first - f.now > $2::float8 THEN 0
                          ELSE LEAST($4::float8, floor((f.now + $2::float8 - f.base) / f.i) + 1)::int END AS k
              FROM (SELECT e.now, e.i, e.b, e.base, GREATEST(e.now + $3::float8, s.hold_until, e.base) AS first
                    FROM (SELECT c.now, GREATEST(s.multiplier, 1.0) / NULLIF(s.rate, 0) AS i,
                                 GREATEST(s.cursor_at, c.now + $3::float8, s.hold_until) AS b,
                                 GREATEST(s.cursor_at, c.now + $3::float8, s.hold_until) - COALESCE((s.burst - 1) / NULLIF(s.rate, 0), 0) AS base
                          FROM (SELECT date_part('epoch', clock_timestamp()) AS now) AS c
                    ) AS e OFFSET 0
              ) AS f OFFSET 0
        ) AS g
    )
RETURNING date_part('epoch', clock_timestamp()), s.last_count, s.last_slot,
          s.multiplier, s.cursor_at, s.rate, s.burst, s.max_multiplier`

// reportSQL applies $5 outcomes of one kind at once (a batch of clean
// reports; pressure is always reported alone). $1 platform, $2 true for rate
// pressure (false: clean), $3 the reservation's database time (NULL: unknown,
// treated as now), $4 Retry-After in seconds (NULL: none), $5 how many.
//
// Pressure doubles the multiplier (capped at max_multiplier) unless the
// request was reserved before the latest doubling, and always resets the
// clean streak; with Retry-After it extends hold_until. Clean responses add
// to the fleet-wide streak; every decay_after of them halve the multiplier
// (never below 1), and the streak keeps the remainder. UPDATE under READ
// COMMITTED re-evaluates SET against the latest row version, so concurrent
// reports compose.
const reportSQL = `
UPDATE fleetpace_pace AS s SET
    (multiplier, clean_streak, doubled_at, hold_until, last_effect) = (
        SELECT CASE WHEN d.dbl THEN LEAST(d.m * 2, s.max_multiplier)
                    WHEN d.halvings > 0 THEN GREATEST(d.m / power(2::float8, LEAST(d.halvings, 60)::float8), 1.0)
                    ELSE d.m END,
               CASE WHEN $2::bool THEN 0 ELSE d.streak % GREATEST(s.decay_after, 1) END,
               CASE WHEN d.dbl THEN d.now ELSE s.doubled_at END,
               CASE WHEN $2::bool AND $4::float8 IS NOT NULL
                    THEN GREATEST(s.hold_until, d.now + $4::float8)
                    ELSE s.hold_until END,
               CASE WHEN d.dbl THEN 3
                    WHEN $2::bool AND d.stale THEN 5
                    WHEN $2::bool THEN 4
                    WHEN d.halvings > 0 AND d.m > 1 THEN 6
                    ELSE 0 END
        FROM (
            SELECT n.now, n.m, n.stale, n.streak,
                   $2::bool AND NOT n.stale AND n.m < s.max_multiplier AS dbl,
                   CASE WHEN $2::bool THEN 0 ELSE n.streak / GREATEST(s.decay_after, 1) END AS halvings
            FROM (SELECT date_part('epoch', clock_timestamp()) AS now,
                         GREATEST(1.0, LEAST(s.multiplier, s.max_multiplier)) AS m,
                         s.clean_streak + $5::int AS streak,
                         COALESCE($3::float8, date_part('epoch', clock_timestamp())) < s.doubled_at AS stale
                 ) AS n
        OFFSET 0
        ) AS d
    )
WHERE s.platform = $1
RETURNING s.multiplier, s.max_multiplier, s.clean_streak, s.last_effect,
          GREATEST(s.hold_until - date_part('epoch', clock_timestamp()), 0)`

// ensureRowSQL creates a platform's pace row if it is missing (normally the
// platform trigger has made it). No row affected and no row present means
// the platform does not exist.
const ensureRowSQL = `
INSERT INTO fleetpace_pace (platform, rate, burst, max_multiplier, decay_after)
SELECT name, rate_per_sec, burst, max_multiplier, decay_after FROM fleetpace_platform WHERE name = $1
ON CONFLICT (platform) DO NOTHING`

// syncRowSQL copies a platform's configuration into its pace row (after the
// row was created without it).
const syncRowSQL = `
UPDATE fleetpace_pace AS s SET rate = p.rate_per_sec, burst = p.burst,
    max_multiplier = p.max_multiplier, decay_after = p.decay_after
FROM fleetpace_platform AS p
WHERE s.platform = $1 AND p.name = s.platform`

// statesSQL reads every platform's pacer state for humans.
const statesSQL = `
SELECT p.name, p.rate_per_sec, p.burst, p.max_multiplier, p.decay_after,
       COALESCE(s.multiplier, 1), COALESCE(s.clean_streak, 0),
       GREATEST(COALESCE(s.hold_until, 0) - n.now, 0),
       GREATEST(COALESCE(s.cursor_at, 0) - n.now, 0)
FROM fleetpace_platform AS p
LEFT JOIN fleetpace_pace AS s ON s.platform = p.name
CROSS JOIN (SELECT date_part('epoch', clock_timestamp()) AS now) AS n
ORDER BY p.name`
