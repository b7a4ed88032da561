package pacer

// All of the pacer's SQL. Times are epoch seconds of the database clock
// (clock_timestamp(), read after the row lock is taken, inside the SET), so
// every process measures against one clock.

// Codes written to fleetpace_pace.last_effect by the statement that wrote the
// row last; RETURNING hands them back so one round trip tells the caller what
// was decided.
const (
	effectNone    = 0 // clean report without halving
	effectGranted = 1 // reservation granted, cursor moved
	effectDenied  = 2 // reservation denied (wait > max wait), cursor unchanged
	effectDoubled = 3 // pressure doubled the multiplier
	effectAtMax   = 4 // pressure while the multiplier was already at its maximum
	effectStale   = 5 // pressure for a request reserved before the latest doubling
	effectHalved  = 6 // decay_after clean reports halved the multiplier
)

// reserveSQL takes one reservation in one statement. $1 platform, $2 the
// longest wait the caller accepts, in seconds, $3 the shortest (0 but while
// the process also honours its local share just after an outage; the row
// then books the slot the request will really use).
//
// GCRA: interval = multiplier / rate; tau = (burst - 1) / rate. With
// t = now + min wait, the slot is max(t, cursor - tau, hold_until); if
// slot - now <= max wait the cursor moves to max(cursor, t, hold_until) +
// interval, otherwise it is written back unchanged. Idle time never accumulates into a larger burst because the
// cursor restarts from now. The rate, burst and maximum multiplier are read
// from fleetpace_platform in the same statement (a `platforms set` applies to
// the whole fleet at the next reservation) and returned for the degraded-mode
// cache. No row means the platform does not exist.
const reserveSQL = `
WITH p AS (
    SELECT name, rate_per_sec, burst, max_multiplier
    FROM fleetpace_platform
    WHERE name = $1
), r AS (
    INSERT INTO fleetpace_pace AS s (platform, cursor_at, last_slot, last_effect)
    SELECT p.name, n.t + 1.0 / p.rate_per_sec, n.t, 1
    FROM p, (SELECT extract(epoch FROM clock_timestamp())::float8 + $3::float8 AS t) AS n
    ON CONFLICT (platform) DO UPDATE SET
        (cursor_at, multiplier, last_slot, last_effect) = (
            SELECT CASE WHEN d.slot - d.now <= $2::float8
                        THEN GREATEST(s.cursor_at, d.now + $3::float8, s.hold_until) + d.m / p.rate_per_sec
                        ELSE s.cursor_at END,
                   d.m,
                   d.slot,
                   CASE WHEN d.slot - d.now <= $2::float8 THEN 1 ELSE 2 END
            FROM p, LATERAL (
                SELECT n.now, n.m,
                       GREATEST(n.now + $3::float8, s.cursor_at - (p.burst - 1) / p.rate_per_sec, s.hold_until) AS slot
                FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS now,
                             GREATEST(1.0, LEAST(s.multiplier, p.max_multiplier)) AS m) AS n
            ) AS d
        )
    RETURNING s.cursor_at, s.multiplier, s.hold_until, s.last_slot, s.last_effect,
              extract(epoch FROM clock_timestamp())::float8 AS at
)
SELECT r.at, r.last_effect, r.last_slot, r.cursor_at, r.multiplier, r.hold_until,
       p.rate_per_sec, p.burst, p.max_multiplier
FROM r, p`

// reportSQL applies one outcome. $1 platform, $2 true for rate pressure
// (false: clean), $3 the reservation's database time (NULL: unknown, treated
// as now), $4 Retry-After in seconds (NULL: none).
//
// Pressure doubles the multiplier (capped at max_multiplier) unless the
// request was reserved before the latest doubling, and always resets the
// clean streak; with Retry-After it extends hold_until. A clean response adds
// to the fleet-wide streak; reaching decay_after halves the multiplier (never
// below 1) and restarts the streak. UPDATE under READ COMMITTED re-evaluates
// SET against the latest row version, so concurrent reports compose.
const reportSQL = `
UPDATE fleetpace_pace AS s SET
    (multiplier, clean_streak, doubled_at, hold_until, last_effect) = (
        SELECT CASE WHEN d.dbl THEN LEAST(d.m * 2, p.max_multiplier)
                    WHEN d.halve THEN GREATEST(d.m / 2, 1.0)
                    ELSE d.m END,
               CASE WHEN $2::bool OR d.halve THEN 0 ELSE s.clean_streak + 1 END,
               CASE WHEN d.dbl THEN d.now ELSE s.doubled_at END,
               CASE WHEN $2::bool AND $4::float8 IS NOT NULL
                    THEN GREATEST(s.hold_until, d.now + $4::float8)
                    ELSE s.hold_until END,
               CASE WHEN d.dbl THEN 3
                    WHEN $2::bool AND d.stale THEN 5
                    WHEN $2::bool THEN 4
                    WHEN d.halve AND d.m > 1 THEN 6
                    ELSE 0 END
        FROM (
            SELECT n.now, n.m,
                   $2::bool AND NOT n.stale AND n.m < p.max_multiplier AS dbl,
                   n.stale,
                   NOT $2::bool AND s.clean_streak + 1 >= p.decay_after AS halve
            FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS now,
                         GREATEST(1.0, LEAST(s.multiplier, p.max_multiplier)) AS m,
                         COALESCE($3::float8, extract(epoch FROM clock_timestamp())::float8) < s.doubled_at AS stale
                 ) AS n
        ) AS d
    )
FROM fleetpace_platform AS p
WHERE s.platform = $1 AND p.name = s.platform
RETURNING s.multiplier, p.max_multiplier, s.clean_streak, s.last_effect,
          GREATEST(s.hold_until - extract(epoch FROM clock_timestamp())::float8, 0)`

// ensureRowSQL creates a platform's pace row if it is missing (a report that
// arrives before any reservation). No row affected and no row present means
// the platform does not exist.
const ensureRowSQL = `
INSERT INTO fleetpace_pace (platform)
SELECT name FROM fleetpace_platform WHERE name = $1
ON CONFLICT (platform) DO NOTHING`

// statesSQL reads every platform's pacer state for humans.
const statesSQL = `
SELECT p.name, p.rate_per_sec, p.burst, p.max_multiplier, p.decay_after,
       COALESCE(s.multiplier, 1), COALESCE(s.clean_streak, 0),
       GREATEST(COALESCE(s.hold_until, 0) - n.now, 0),
       GREATEST(COALESCE(s.cursor_at, 0) - n.now, 0)
FROM fleetpace_platform AS p
LEFT JOIN fleetpace_pace AS s ON s.platform = p.name
CROSS JOIN (SELECT extract(epoch FROM clock_timestamp())::float8 AS now) AS n
ORDER BY p.name`
