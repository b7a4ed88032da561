package pacer

import (
	"strconv"
	"time"
)

// All of the pacer's SQL. Times are epoch seconds of the database clock
// (clock_timestamp(), read after the row lock is taken, inside the SET), so
// every process measures against one clock.

// Codes written to fleetpace_pace.last_effect by the report that wrote the
// row last; RETURNING hands them back so one round trip tells the caller what
// was decided. The statements are built from these constants.
const (
	effectIncreased = 3 // pressure slowed the platform down (a larger multiplier, a lower estimate)
	effectAtMax     = 4 // pressure while the platform was already as slow as it may be
	effectStale     = 5 // pressure for a request reserved before the latest slow-down
	effectRelaxed   = 6 // clean streaks divided the multiplier ('multiplier' mode)
	effectJitter    = 7 // a lone refusal below the estimate: kept, the approach started again
	effectQuota     = 8 // a refusal whose answer said the announced quota ran out: held until its reset, the estimate kept
)

// NotifyChannel is the PostgreSQL channel every slow-down is announced on
// (pg_notify, delivered at commit). The payload is
// "platform|event_seq|event_at|interval|shift|horizon|hold" (see parseEvent).
const NotifyChannel = "fleetpace_pace"

// probeMargin and probeSteps shape probing recovery: after pressure began at
// multiplier m_p, recovery by whole steps stops at m_p × (1 + probeMargin);
// from there each decay_after clean responses relax by recovery_factor^(1 /
// probeSteps). A multiplier below m_p / (1 + probeMargin) forgets m_p (the
// destination allows more than it did). Measured: see docs/design.md.
const (
	probeMargin = 0.15
	probeSteps  = 8
)

// respaceLead is how soon after an event a granted slot is left as it is,
// by the database and by every process alike: a process may not have heard
// of the event by then, and moving the slots around it (but not it) could
// bring two of them closer than the spacing. Slots due later are
// re-spaced around the pivot, event time + respaceLead. A notification
// takes milliseconds; a process that hears of an event later than this can
// still send one slot early of its new place.
const respaceLead = 20 * time.Millisecond

// leadSQL is respaceLead in seconds, for the statements.
var leadSQL = strconv.FormatFloat(respaceLead.Seconds(), 'f', -1, 64)

// respaceRatio is how much slower an announced spacing must be than the one
// in force to re-space the slots already granted. Announcements move by a
// few per cent from one response to the next; re-spacing on each would
// stretch the granted slots again and again (a speed-up never draws them
// back in), losing more than the announcement asks for.
const respaceRatio = 1.2

// reserveSQL takes up to $4 consecutive reservations (a block) in one
// statement. $1 platform, $2 the longest wait the caller accepts, in seconds,
// $3 the shortest (0 but while the process also honours its local share just
// after an outage; the row then books the slot the request will really use),
// $5 the time (NULL: the database's clock; a fake clock in tests), $6 the
// tuning (tuning.array).
//
// GCRA: interval i is the effective spacing (fleetpace_pace_interval: the
// largest of adaptation's, the ceiling's and the destination's announced
// spacing) and tau the burst tolerance (fleetpace_pace_tau: (burst − 1) /
// rate less what lateness costs). With t = now + min wait, h the later of
// the hold and the pause, and b = max(cursor, t, h), the k-th of n
// reservations taken at once gets slot max(t, h, b − tau + k·i) — exactly
// what n single reservations in a row would get. k slots are granted, as
// many as start within the max wait (at most $4); the cursor moves to
// b + k·i, or stays where it is when none does. Idle time never accumulates
// into a larger burst because b restarts from now.
//
// last_slot is written as the first slot, last_count as k and last_interval
// as i; with the new cursor and tau the caller rebuilds every other slot:
// slot k is max(first, cursor − tau − (count − k)·i). Adaptation's state is
// read, not written (reports keep it). The platform's rate, burst and
// settings are read from the pace row itself (a trigger copies them from
// fleetpace_platform on every change); the rate, burst and maximum
// multiplier are returned for the degraded-mode cache and the lateness
// tolerance, the multiplier in force (the ceiling over the adaptive pace),
// the last event (sequence, time, shift, horizon) so the caller applies a
// slow-down it has not heard of yet exactly as a notification would, and
// the hold and pause so it can tell a hold from a pause.
//
// Every platform has a pace row. Should one be missing, the INSERT branch
// creates it without configuration (rate 0, or a foreign-key error if the
// platform does not exist); a row with rate 0 grants nothing, and the caller
// copies the configuration with syncRowSQL and reserves again.
//
// The statement's server time is mostly building and evaluating
// expressions, so: date_part, not extract (extract(epoch …) computes in
// numeric since PostgreSQL 14); the schema's functions are plain SQL, which
// the planner inlines; and OFFSET 0 keeps the planner from pulling the
// sub-selects up, which would copy b and k into every expression that uses
// them.
const reserveSQL = `
INSERT INTO fleetpace_pace AS s (platform) VALUES ($1)
ON CONFLICT (platform, key) DO UPDATE SET
    (cursor_at, last_slot, last_count, last_interval, last_max_wait, run_start, leases,
     win_at, win_count, win_acc, win_acc_prev, win_clean, win_quota, win_fix) = (
        SELECT CASE WHEN g.k > 0 THEN g.b + g.k * g.i ELSE s.cursor_at END, g.first, g.k, COALESCE(g.i, 0), $2::float8,
               CASE WHEN g.k > 0 AND g.first > s.cursor_at + g.i THEN g.first ELSE s.run_start END,
               CASE WHEN s.max_in_flight <= 0 THEN s.leases
                    WHEN g.k > 0 THEN array_append(g.live, GREATEST(g.now + $7::float8,
                                                                    (SELECT max(x) FROM unnest(g.live) AS x) + 1e-6))
                    ELSE g.live END,
               CASE WHEN g.capped AND g.k > 0 THEN g.wstart ELSE s.win_at END,
               CASE WHEN g.capped AND g.k > 0 THEN g.cnt + g.k ELSE s.win_count END,
               CASE WHEN g.capped AND g.k > 0 AND g.rolled THEN 0 ELSE s.win_acc END,
               CASE WHEN NOT (g.capped AND g.k > 0 AND g.rolled) THEN s.win_acc_prev
                    WHEN abs(g.wstart - s.win_at - s.win_len) < 1e-6 THEN s.win_acc ELSE 0 END,
               CASE WHEN NOT (g.capped AND g.k > 0 AND g.rolled) THEN s.win_clean
                    WHEN s.win_fix THEN 0
                    WHEN s.win_count < s.win_quota THEN LEAST(s.win_clean, 0)
                    WHEN s.win_clean + 1 >= ($6::float8[])[42] THEN 0
                    ELSE s.win_clean + 1 END,
               CASE WHEN g.capped AND g.k > 0 THEN g.q ELSE s.win_quota END,
               s.win_fix AND NOT (g.capped AND g.k > 0 AND g.rolled)
        FROM (SELECT f.b, f.i, f.first, f.now, f.live, f.capped, f.wstart, f.cnt, f.rolled, f.q,
                     CASE WHEN s.rate <= 0 OR f.first - f.now > $2::float8 OR s.paused_until > f.now
                               OR s.max_in_flight > 0 AND cardinality(f.live) >= s.max_in_flight THEN 0
                          WHEN s.max_in_flight > 0 THEN 1
                          WHEN f.capped THEN GREATEST(LEAST($4::float8, floor((f.now + $2::float8 - f.base) / f.i) + 1,
                                                            f.q - f.cnt,
                                                            floor((f.wstart + s.win_len - ($6::float8[])[41] - f.b) / f.i) + 1), 0)::int
                          ELSE LEAST($4::float8, floor((f.now + $2::float8 - f.base) / f.i) + 1)::int END AS k
              FROM (SELECT e.now, e.i, e.b, e.base, e.live, e.capped, e.wstart, e.cnt, e.rolled, e.q,
                           GREATEST(e.now + $3::float8, e.hold, e.base) AS first
                    FROM (SELECT w.now, w.i, w.live, w.capped, w.wstart, w.cnt, w.rolled,
                                 -- A new window's quota: what the last one
                                 -- accepted if a request was refused in it,
                                 -- one more after winProbe full ones.
                                 CASE WHEN NOT w.rolled THEN s.win_quota
                                      WHEN s.win_fix AND s.win_clean < 0 THEN GREATEST(s.win_acc, 1)
                                      WHEN s.win_fix THEN GREATEST(s.win_quota - 1, 1)
                                      WHEN s.win_count >= s.win_quota AND s.win_clean + 1 >= ($6::float8[])[42] THEN s.win_quota + 1
                                      ELSE s.win_quota END AS q,
                                 GREATEST(w.hold, w.gate) AS hold,
                                 GREATEST(w.b0, w.gate) AS b,
                                 GREATEST(w.b0, w.gate) - COALESCE(fleetpace_pace_tau(s.rate, s.burst, $6), 0) AS base
                          FROM (SELECT v.now, v.i, v.live, v.hold, v.b0, v.capped,
                                       CASE WHEN v.full THEN v.w0 + s.win_len ELSE v.w0 END AS wstart,
                                       v.capped AND abs(CASE WHEN v.full THEN v.w0 + s.win_len ELSE v.w0 END - s.win_at) > 1e-6 AS rolled,
                                       CASE WHEN v.full OR abs(s.win_at - v.w0) > 1e-6 THEN 0 ELSE s.win_count END AS cnt,
                                       CASE WHEN v.full THEN v.w0 + s.win_len ELSE 0 END AS gate
                                FROM (SELECT u.*,
                                             u.capped AND (abs(s.win_at - u.w0) <= 1e-6 AND s.win_count >= s.win_quota
                                                           OR u.b0 >= u.w0 + s.win_len - ($6::float8[])[41]) AS full
                                      FROM (SELECT c.now, c.i, c.hold, c.live, c.capped,
                                                   GREATEST(s.cursor_at, c.now + $3::float8, c.hold) AS b0,
                                                   CASE WHEN c.capped
                                                        THEN s.win_phase + floor((GREATEST(s.cursor_at, c.now + $3::float8, c.hold) - s.win_phase)
                                                                                 / s.win_len) * s.win_len END AS w0
                                            FROM (SELECT n.now, GREATEST(s.hold_until, s.paused_until) AS hold,
                                                         CASE WHEN (s.win_len > 0 AND s.win_quota > 0 OR s.win_try) AND s.announced_until <= n.now
                                                              THEN fleetpace_pace_ceiling(s.rate, s.burst, $6)
                                                              ELSE fleetpace_pace_interval(s.adapt, s.rate, s.burst, s.multiplier, s.est, s.est_max,
                                                                                           s.est_plateau, s.est_at, s.announced_interval,
                                                                                           s.announced_until, n.now, $6) END AS i,
                                                         s.win_len > 0 AND s.win_quota > 0 AND s.announced_until <= n.now AS capped,
                                                         CASE WHEN s.max_in_flight > 0 THEN ARRAY(SELECT x FROM unnest(s.leases) AS x WHERE x > n.now) END AS live
                                                  FROM (SELECT COALESCE($5::float8, date_part('epoch', clock_timestamp())) AS now) AS n
                                            ) AS c
                                      ) AS u
                                ) AS v
                          ) AS w
                    ) AS e OFFSET 0
              ) AS f OFFSET 0
        ) AS g
    )
RETURNING COALESCE($5::float8, date_part('epoch', clock_timestamp())), s.last_count, s.last_slot, s.last_interval,
          s.cursor_at, s.rate, s.burst, s.max_multiplier,
          COALESCE(s.rate * fleetpace_pace_adaptive(s.adapt, s.rate, s.multiplier, s.est, s.est_max, s.est_plateau,
                                                    COALESCE($5::float8, date_part('epoch', clock_timestamp())) - s.est_at, $6), 1),
          s.event_seq, GREATEST(s.hold_until, s.paused_until), s.paused_until, s.event_at, s.event_shift, s.event_horizon,
          COALESCE(fleetpace_pace_tau(s.rate, s.burst, $6), 0), s.event_interval,
          CASE WHEN s.max_in_flight > 0 AND s.last_count > 0 THEN s.leases[cardinality(s.leases)] ELSE 0 END,
          CASE WHEN s.max_in_flight > 0 AND s.last_count = 0 AND cardinality(s.leases) >= s.max_in_flight
               THEN (SELECT min(x) FROM unnest(s.leases) AS x) ELSE 0 END,
          s.respace`

// reserveKeySQL takes one slot of platform $1 for its key $2, from both
// pace rows at once: the key's and the platform's, locked in that order
// (” sorts first) by the same statement, so no other reservation of either
// comes between. $3 the longest wait, $4 the shortest, $5 the time (NULL:
// the database's clock), $6 the tuning, $7 a lease's time to live.
//
// The slot is the platform's next one, when the key's next one is no
// later: both cursors move past it, and a lease is taken on each row that
// caps its open requests. When the key's next slot is later, nothing is
// booked (the platform's schedule must not wait for one key while other
// keys could use it): the wait says until when, and the caller reserves
// again then. A row whose open requests are at their cap grants nothing
// either; the wait is until its earliest lease expires, at most a second.
// It returns one row: the decision and both rows' state (the key's events
// are applied by the caller), or none when the key's row does not exist
// yet (ensureKeyRowSQL makes it).
const reserveKeySQL = `
WITH n AS (SELECT COALESCE($5::float8, date_part('epoch', clock_timestamp())) AS now),
r AS (
    SELECT s.platform, s.key, s.cursor_at, s.rate, s.burst, s.max_in_flight, s.paused_until,
           GREATEST(s.hold_until, s.paused_until) AS hold,
           fleetpace_pace_interval(s.adapt, s.rate, s.burst, s.multiplier, s.est, s.est_max, s.est_plateau, s.est_at,
                                   s.announced_interval, s.announced_until, n.now, $6) AS i,
           COALESCE(fleetpace_pace_tau(s.rate, s.burst, $6), 0) AS tau,
           CASE WHEN s.max_in_flight > 0 THEN ARRAY(SELECT x FROM unnest(s.leases) AS x WHERE x > n.now) END AS live,
           n.now
    FROM fleetpace_pace AS s CROSS JOIN n
    WHERE s.platform = $1 AND s.key IN ('', $2)
    ORDER BY s.key
    FOR UPDATE OF s
),
d AS (
    SELECT p.now, p.i AS p_i, k.i AS k_i, p.live AS p_live, k.live AS k_live,
           GREATEST(p.now + $4::float8, p.hold, p.cursor_at - p.tau) AS p_first,
           GREATEST(k.now + $4::float8, k.hold, k.cursor_at - k.tau) AS k_first,
           p.rate > 0 AND k.rate > 0 AND p.paused_until <= p.now AND k.paused_until <= p.now AS open_,
           p.max_in_flight > 0 AND cardinality(p.live) >= p.max_in_flight
               OR k.max_in_flight > 0 AND cardinality(k.live) >= k.max_in_flight AS full,
           LEAST(CASE WHEN p.max_in_flight > 0 AND cardinality(p.live) >= p.max_in_flight
                      THEN (SELECT min(x) FROM unnest(p.live) AS x) END,
                 CASE WHEN k.max_in_flight > 0 AND cardinality(k.live) >= k.max_in_flight
                      THEN (SELECT min(x) FROM unnest(k.live) AS x) END) AS free_at
    FROM r AS p JOIN r AS k ON p.key = '' AND k.key = $2
),
g AS (
    SELECT d.*, d.open_ AND NOT d.full AND d.k_first <= d.p_first AND d.p_first - d.now <= $3::float8 AS granted,
           -- a lease's expiry is its name: unique on both rows
           GREATEST(d.now + $7::float8, (SELECT max(x) FROM unnest(d.p_live || d.k_live) AS x) + 1e-6) AS lease
    FROM d
),
u AS (
    UPDATE fleetpace_pace AS s SET
        cursor_at = CASE WHEN g.granted THEN GREATEST(s.cursor_at, g.p_first) + CASE WHEN s.key = '' THEN g.p_i ELSE g.k_i END
                         ELSE s.cursor_at END,
        last_slot = g.p_first, last_count = g.granted::int, last_max_wait = $3::float8,
        last_interval = CASE WHEN s.key = '' THEN g.p_i ELSE g.k_i END,
        leases = CASE WHEN s.max_in_flight <= 0 THEN s.leases
                      WHEN g.granted THEN array_append(CASE WHEN s.key = '' THEN g.p_live ELSE g.k_live END, g.lease)
                      ELSE CASE WHEN s.key = '' THEN g.p_live ELSE g.k_live END END
    FROM g
    WHERE s.platform = $1 AND s.key IN ('', $2)
    RETURNING s.key, s.rate, s.burst, s.max_multiplier, s.multiplier, s.est, s.est_max, s.est_plateau, s.est_at, s.adapt,
              s.event_seq, s.event_at, s.event_shift, s.event_horizon, s.event_interval,
              GREATEST(s.hold_until, s.paused_until) AS hold, s.paused_until, s.cursor_at, s.max_in_flight, s.respace
)
SELECT g.now, g.granted, g.p_first, g.k_first, g.full, COALESCE(g.free_at, 0), g.p_i, g.k_i,
       p.cursor_at, p.rate, p.burst, p.max_multiplier,
       COALESCE(p.rate * fleetpace_pace_adaptive(p.adapt, p.rate, p.multiplier, p.est, p.est_max, p.est_plateau, g.now - p.est_at, $6), 1),
       p.event_seq, p.hold, p.paused_until, p.event_at, p.event_shift, p.event_horizon, p.event_interval,
       k.rate, k.burst, k.event_seq, k.hold, k.paused_until,
       CASE WHEN g.granted AND (p.max_in_flight > 0 OR k.max_in_flight > 0) THEN g.lease ELSE 0 END, p.respace
FROM g CROSS JOIN u AS p CROSS JOIN u AS k
WHERE p.key = '' AND k.key = $2`

// ensureKeyRowSQL makes the pace row of platform $1's key $2 on its first
// use, with the key's settings (fleetpace_pace_key_settings) and the
// platform's adaptation. Nothing when the platform does not exist. Its
// cursor starts at $3, the time (NULL: the database's clock), not at 0:
// the row is in use from its making, and a scan tick's PruneKeys between
// the making and the reservation that asked for it would otherwise take
// it for a long-idle key and delete it (the reservation then found no row,
// and its job failed as if the platform did not exist).
const ensureKeyRowSQL = `
INSERT INTO fleetpace_pace (platform, key, rate, burst, max_in_flight, max_multiplier, decay_after,
                            backoff_factor, recovery_factor, probe, use_headers, respace, adapt, cursor_at)
SELECT p.name, $2, c.rate, c.burst, c.max_in_flight, p.max_multiplier, p.decay_after,
       p.backoff_factor, p.recovery_factor, p.probe, p.use_headers, p.respace, p.adapt,
       COALESCE($3::float8, date_part('epoch', clock_timestamp()))
FROM fleetpace_platform AS p CROSS JOIN fleetpace_pace_key_settings($1, $2) AS c
WHERE p.name = $1
ON CONFLICT (platform, key) DO NOTHING`

// releaseSQL gives back the lease $3 (its expiry) that a request of
// platform $1's key $2 took (”: a request without a key) on every row
// that caps open requests.
const releaseSQL = `
UPDATE fleetpace_pace SET leases = array_remove(leases, $3::float8)
WHERE platform = $1 AND key IN ('', $2) AND max_in_flight > 0`

// reportSQL applies reports to a platform's pace row: the schema's
// fleetpace_pace_report (plpgsql; the row is locked, read, decided on and
// written in one call). $1 platform, $2 the time (NULL: the database's
// clock), $3 true for rate pressure, $4 the reservation's database time
// (NULL: unknown, treated as now), $5 the spacing its slot was granted at,
// seconds (NULL: unknown), $6 Retry-After in seconds (NULL: none), $7 how
// many answers without pressure (clean or neutral: what the destination
// accepted), $8 how many of them clean, $9 how many of them to requests
// reserved since the latest slow-down the process knew of, $10 the
// spacing the destination announced in seconds (NULL: nothing announced),
// $11 how long the announcement holds, $12 a hold the destination asked
// for through its quota headers, in seconds (NULL: none), $13 the reason
// of a new hold, $14 the announced quota's window in seconds (NULL:
// unknown), $15 its limit (NULL: unknown), $16 the tuning, $17 the key
// whose row takes the report (”: the platform's), $18 the earliest slot
// (database time) of the answers without pressure (NULL: one unknown).
//
// It returns the multiplier (the ceiling over the pace in force), the
// maximum multiplier, the clean streak ('multiplier' mode), the effect
// (effect* codes), the hold left, the event (sequence, time, spacing,
// shift, horizon, hold), whether this report made one, the quota window
// the fleet keeps, and the estimate. See docs/design.md, "Adaptive pacing",
// for the rules.
const reportSQL = `SELECT * FROM fleetpace_pace_report($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`

// pauseSQL pauses a platform fleet-wide until $2 (epoch seconds of the
// database clock; 'Infinity': until resumed), or for $4 seconds from now
// ($5; NULL: the database's clock) when $4 > 0, for the reason $3, and
// returns when the pause ends. It is an
// event: every process gives back the slots it holds (they were granted
// before the pause), and the cursor restarts from now, since no granted
// slot is left to honour.
var pauseSQL = `
WITH u AS (
UPDATE fleetpace_pace AS s SET paused_until = CASE WHEN $4::float8 > 0 THEN n.now + $4::float8 ELSE $2::float8 END, pause_reason = $3,
    cursor_at = LEAST(s.cursor_at, n.now + ` + leadSQL + `), event_seq = s.event_seq + 1, event_at = n.now,
    event_shift = 'Infinity', event_horizon = n.now, event_interval = s.last_interval, last_respaced = true
FROM (SELECT COALESCE($5::float8, date_part('epoch', clock_timestamp())) AS now) AS n
WHERE s.platform = $1 AND s.key = ''
RETURNING s.platform, s.event_seq, s.event_at, s.last_interval, GREATEST(s.hold_until, s.paused_until) AS hold_at, s.paused_until
)
SELECT u.paused_until, pg_notify('` + NotifyChannel + `', u.platform || '|' || u.event_seq || '|' || u.event_at || '|' || u.last_interval
                 || '|Infinity|' || u.event_at || '|' || u.hold_at) IS NULL
FROM u`

// holdSQL raises a platform's hold to $2 (a timestamptz, converted to the
// pacer's epoch seconds by the database) for the reason $3, if that is later
// than the hold in place and than now ($4; NULL: the database's clock).
// With respace it is an event: the
// cursor's granted slots move past the hold, keeping their spacing, and
// every process moves its own alike.
var holdSQL = `
WITH n AS (SELECT COALESCE($4::float8, date_part('epoch', clock_timestamp())) AS now, date_part('epoch', $2::timestamptz) AS until),
u AS (
UPDATE fleetpace_pace AS s SET
    (hold_until, hold_reason, cursor_at, event_seq, event_at, event_shift, event_horizon, last_respaced, event_interval) = (
        SELECT n.until, $3::text,
               CASE WHEN s.respace AND s.cursor_at > n.now + ` + leadSQL + `
                    THEN LEAST(s.cursor_at + f.shift, GREATEST(n.now + GREATEST(s.last_max_wait, ` + leadSQL + `) + s.last_interval, n.until))
                    ELSE s.cursor_at END,
               s.event_seq + s.respace::int,
               CASE WHEN s.respace THEN n.now ELSE s.event_at END,
               CASE WHEN s.respace THEN f.shift ELSE s.event_shift END,
               CASE WHEN s.respace THEN n.now + GREATEST(s.last_max_wait, ` + leadSQL + `) ELSE s.event_horizon END,
               s.respace,
               CASE WHEN s.respace THEN s.last_interval ELSE s.event_interval END
        FROM (SELECT GREATEST(n.until - CASE WHEN s.cursor_at > n.now + ` + leadSQL + ` AND s.last_interval > 0
                                             THEN s.cursor_at - floor((s.cursor_at - n.now - ` + leadSQL + `) / s.last_interval) * s.last_interval
                                             ELSE n.now + ` + leadSQL + ` END, 0) AS shift) AS f
    )
FROM n
WHERE s.platform = $1 AND s.key = '' AND n.until > GREATEST(s.hold_until, n.now)
RETURNING s.platform, s.event_seq, s.event_at, s.last_interval, s.event_shift, s.event_horizon,
          GREATEST(s.hold_until, s.paused_until) AS hold_at, s.last_respaced
)
SELECT CASE WHEN u.last_respaced
            THEN pg_notify('` + NotifyChannel + `', u.platform || '|' || u.event_seq || '|' || u.event_at || '|' || u.last_interval
                                             || '|' || u.event_shift || '|' || u.event_horizon || '|' || u.hold_at)
       END IS NULL
FROM u`

// resumeSQL ends a platform's pause. Nothing to re-space: resuming only
// speeds the platform up.
const resumeSQL = `UPDATE fleetpace_pace SET paused_until = 0, pause_reason = '' WHERE platform = $1 AND key = ''`

// overrunSQL moves platform $1's schedule $2 seconds later after one of
// its requests went that far past its slot's guarantee (overrun.go): the
// cursor (from now at least), and every granted slot due after the pivot
// through an event with that shift and no horizon (nothing given back for
// it). Spacing, hold and adaptation are left as they are. $3 is the time
// (NULL: the database's clock).
var overrunSQL = `
WITH u AS (
UPDATE fleetpace_pace AS s SET
    cursor_at = GREATEST(s.cursor_at, n.now) + $2::float8,
    event_seq = s.event_seq + 1, event_at = n.now, event_interval = s.last_interval,
    event_shift = $2::float8, event_horizon = 'Infinity', last_respaced = true
FROM (SELECT COALESCE($3::float8, date_part('epoch', clock_timestamp())) AS now) AS n
WHERE s.platform = $1 AND s.key = ''
RETURNING s.platform, s.event_seq, s.event_at, s.last_interval, s.event_shift, s.event_horizon,
          GREATEST(s.hold_until, s.paused_until) AS hold_at
)
SELECT u.event_seq, u.event_at, u.last_interval, u.event_shift, u.event_horizon, u.hold_at
FROM u, LATERAL (SELECT pg_notify('` + NotifyChannel + `', u.platform || '|' || u.event_seq || '|' || u.event_at || '|' || u.last_interval
                 || '|' || u.event_shift || '|Infinity|' || u.hold_at)) AS notified`

// clearHoldSQL ends a platform's fleet-wide hold (Retry-After, quota or
// cooldown) at once, and the backoff with it: the platform runs at its
// configured pace again (an operator who clears a cooldown says "go"; a
// multiplier left at its maximum would keep it crawling), and pressure for
// requests reserved before the clear is stale. Slots granted during the
// hold were placed after it: the cursor comes back to now and they are
// given back (an event with an infinite shift), so their callers reserve
// again and go now. $2 is the time (NULL: the database's clock).
var clearHoldSQL = `
WITH u AS (
UPDATE fleetpace_pace AS s SET hold_until = 0, hold_reason = '',
    multiplier = 1, pressure_mult = 0, clean_streak = 0, doubled_at = n.now, est = 0, est_at = n.now, jitter_at = 0,
    last_interval = CASE WHEN s.rate > 0 THEN GREATEST(1.0 / s.rate, CASE WHEN n.now < s.announced_until THEN s.announced_interval ELSE 0 END)
                         ELSE s.last_interval END,
    cursor_at = LEAST(s.cursor_at, n.now + ` + leadSQL + `), event_seq = s.event_seq + 1, event_at = n.now,
    event_shift = 'Infinity', event_horizon = n.now, last_respaced = true,
    event_interval = CASE WHEN s.rate > 0 THEN GREATEST(1.0 / s.rate, CASE WHEN n.now < s.announced_until THEN s.announced_interval ELSE 0 END)
                          ELSE s.last_interval END
FROM (SELECT COALESCE($2::float8, date_part('epoch', clock_timestamp())) AS now) AS n
WHERE s.platform = $1 AND s.key = ''
RETURNING s.platform, s.event_seq, s.event_at, s.last_interval, s.paused_until AS hold_at
)
SELECT pg_notify('` + NotifyChannel + `', u.platform || '|' || u.event_seq || '|' || u.event_at || '|' || u.last_interval
                 || '|Infinity|' || u.event_at || '|' || u.hold_at) IS NULL
FROM u`

// forgetSQL makes a platform's pace row forget what adaptation learnt
// beyond what clearHoldSQL clears: the quota the destination announced and
// its window, the estimate's ceiling, the measurement of what the
// destination accepts, the jitter and hold memories, the current run, the
// window learned from refusals. With
// clearHoldSQL after it (Reset) the platform is as if just created: the
// next reservation goes at the configured pace.
const forgetSQL = `
UPDATE fleetpace_pace SET announced_interval = 0, announced_until = 0, announced_window = 0, announced_window_at = 0,
    est_max = 0, est_plateau = 0, acc_rate = 0, ref_rate = 0, acc_cut = 0, ref_cut = 0, acc_cycle = 0, acc_at = 0, acc_from = 0,
    meas_window = 0, meas_window_at = 0, jitter_at = 0, held_at = 0, run_start = 0, cut_below = false, est_guess = false,
    est_prev = 0, win_resets = '{}', win_ra = 0, win_len = 0, win_phase = 0, win_quota = 0, win_at = 0,
    win_count = 0, win_acc = 0, win_acc_prev = 0, win_clean = 0, win_try = false, win_fix = false, win_off = 0
WHERE platform = $1`

// ensureRowSQL creates a platform's pace row if it is missing (normally the
// platform trigger has made it). No row affected and no row present means
// the platform does not exist.
const ensureRowSQL = `
INSERT INTO fleetpace_pace (platform, rate, burst, max_multiplier, decay_after,
                            backoff_factor, recovery_factor, probe, use_headers, respace, adapt)
SELECT name, rate_per_sec, burst, max_multiplier, decay_after,
       backoff_factor, recovery_factor, probe, use_headers, respace, adapt
FROM fleetpace_platform WHERE name = $1
ON CONFLICT (platform, key) DO NOTHING`

// syncRowSQL copies a platform's configuration into its pace row (after the
// row was created without it).
const syncRowSQL = `
UPDATE fleetpace_pace AS s SET rate = p.rate_per_sec, burst = p.burst,
    max_multiplier = p.max_multiplier, decay_after = p.decay_after,
    backoff_factor = p.backoff_factor, recovery_factor = p.recovery_factor,
    probe = p.probe, use_headers = p.use_headers, respace = p.respace, adapt = p.adapt
FROM fleetpace_platform AS p
WHERE s.platform = $1 AND s.key = '' AND p.name = s.platform`

// statesSQL reads every platform's pacer state for humans; statesOfSQL
// those of the platforms in $3 (primary-key lookups). $1 is the time (NULL:
// the database's clock), $2 the tuning.
const (
	statesSQL   = statesSelect + `WHERE s.key = '' ORDER BY s.platform`
	statesOfSQL = statesSelect + `WHERE s.key = '' AND s.platform = ANY($3::text[]) ORDER BY s.platform`
)

const statesSelect = `
SELECT s.platform, s.rate, s.burst, s.max_multiplier, s.decay_after,
       s.backoff_factor, s.recovery_factor, s.probe, s.use_headers, s.respace,
       COALESCE(s.rate * fleetpace_pace_adaptive(s.adapt, s.rate, s.multiplier, s.est, s.est_max, s.est_plateau, n.now - s.est_at, $2), 1),
       s.clean_streak, s.pressure_mult, s.adapt, s.est,
       GREATEST(s.hold_until - n.now, 0), s.hold_reason,
       GREATEST(s.paused_until - n.now, 0), s.pause_reason,
       CASE WHEN n.now < s.announced_until THEN s.announced_interval ELSE 0 END,
       GREATEST(s.announced_until - n.now, 0),
       GREATEST(s.cursor_at - n.now, 0), s.event_seq,
       CASE WHEN s.announced_until <= n.now THEN s.win_len ELSE 0 END, s.win_quota
FROM fleetpace_pace AS s
CROSS JOIN (SELECT COALESCE($1::float8, date_part('epoch', clock_timestamp())) AS now) AS n
`

// pruneKeysSQL deletes at most $2 pace rows of keys idle for $1 seconds at
// time $3 (NULL: the database's clock). The table is small (a row per
// platform and per key in use) and its rows change on every reservation,
// so it has no index on the cursor (updates stay HOT): the scan reads it.
const pruneKeysSQL = `
WITH n AS (SELECT COALESCE($3::float8, date_part('epoch', clock_timestamp())) AS now)
DELETE FROM fleetpace_pace AS s USING n
WHERE s.ctid = ANY(ARRAY(
    SELECT x.ctid FROM fleetpace_pace AS x, n
    WHERE x.key <> '' AND x.cursor_at < n.now - $1::float8 AND x.hold_until < n.now AND x.paused_until < n.now
      AND NOT EXISTS (SELECT 1 FROM unnest(x.leases) AS l WHERE l > n.now)
    LIMIT $2))`
