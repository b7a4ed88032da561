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
// interval, otherwise it is written back unchanged. Idle time never
// accumulates into a larger burst because the cursor restarts from now.
//
// The platform's rate, burst and maximum multiplier are read from the pace
// row itself (a trigger copies them from fleetpace_platform on every change);
// the rate and maximum multiplier are returned for the degraded-mode cache.
// Every platform has a pace row.
// Should one be missing, the INSERT branch creates it without configuration
// (rate 0, or a foreign-key error if the platform does not exist); a row with
// rate 0 is left unchanged by the UPDATE branch, and the caller copies the
// configuration with syncRowSQL and reserves again.
const reserveSQL = `
INSERT INTO fleetpace_pace AS s (platform) VALUES ($1)
ON CONFLICT (platform) DO UPDATE SET
    (cursor_at, multiplier, last_slot, last_effect) = (
        SELECT CASE WHEN s.rate > 0 AND d.slot - d.now <= $2::float8
                    THEN GREATEST(s.cursor_at, d.now + $3::float8, s.hold_until) + d.m / s.rate
                    ELSE s.cursor_at END,
               d.m,
               d.slot,
               CASE WHEN s.rate <= 0 THEN 0 WHEN d.slot - d.now <= $2::float8 THEN 1 ELSE 2 END
        FROM (SELECT n.now, n.m,
                     GREATEST(n.now + $3::float8, s.cursor_at - (s.burst - 1) / NULLIF(s.rate, 0), s.hold_until) AS slot
              FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS now,
                           GREATEST(1.0, LEAST(s.multiplier, s.max_multiplier)) AS m) AS n
        ) AS d
    )
RETURNING extract(epoch FROM clock_timestamp())::float8, s.last_effect, s.last_slot,
          s.multiplier, s.hold_until, s.rate, s.max_multiplier`

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
        SELECT CASE WHEN d.dbl THEN LEAST(d.m * 2, s.max_multiplier)
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
                   $2::bool AND NOT n.stale AND n.m < s.max_multiplier AS dbl,
                   n.stale,
                   NOT $2::bool AND s.clean_streak + 1 >= s.decay_after AS halve
            FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS now,
                         GREATEST(1.0, LEAST(s.multiplier, s.max_multiplier)) AS m,
                         COALESCE($3::float8, extract(epoch FROM clock_timestamp())::float8) < s.doubled_at AS stale
                 ) AS n
        ) AS d
    )
WHERE s.platform = $1
RETURNING s.multiplier, s.max_multiplier, s.clean_streak, s.last_effect,
          GREATEST(s.hold_until - extract(epoch FROM clock_timestamp())::float8, 0)`

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
CROSS JOIN (SELECT extract(epoch FROM clock_timestamp())::float8 AS now) AS n
ORDER BY p.name`
