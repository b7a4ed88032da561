package pacer

import (
	"fmt"
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
	effectIncreased = 3 // pressure multiplied the multiplier by the backoff factor
	effectAtMax     = 4 // pressure while the multiplier was already at its maximum
	effectStale     = 5 // pressure for a request reserved before the latest increase
	effectRelaxed   = 6 // clean streaks divided the multiplier
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
// after an outage; the row then books the slot the request will really use).
//
// GCRA: interval i is the effective spacing — multiplier / rate, or the
// destination's announced spacing while it holds, whichever is larger — and
// tau = (burst - 1) / rate. With t = now + min wait, h the later of the hold
// and the pause, and b = max(cursor, t, h), the k-th of n reservations taken
// at once gets slot max(t, h, b - tau + k·i) — exactly what n single
// reservations in a row would get. k slots are granted, as many as start
// within the max wait (at most $4); the cursor moves to b + k·i, or stays
// where it is when none does. Idle time never accumulates into a larger
// burst because b restarts from now.
//
// Where the spacing is short, some of the burst is held back for lateness:
// heldBack(i) = min(floor((burst − 1) / 2), max(0, ceil(LateSlack / i −
// 1/2))) slots, so tau = (burst − 1 − heldBack) / rate, and a request may
// leave up to (heldBack + 1/2)·i late (lateTolerance) with every 1-s window
// still within rate + burst at the destination. It is 0 at spacings of 10 ms
// and more, and for a burst below 3. The statement returns it.
//
// last_slot is written as the first slot, last_count as k and last_interval
// as i; with the new cursor and burst the caller rebuilds every other slot:
// slot k is max(first, cursor - tau - (count - k)·i). The multiplier and the
// announced spacing are read, not written (reports keep them). The
// platform's rate, burst and maximum multiplier are read from the pace row
// itself (a trigger copies them from fleetpace_platform on every change);
// the rate and maximum multiplier are returned for the degraded-mode cache,
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
// numeric since PostgreSQL 14); and OFFSET 0 keeps the planner from pulling
// the sub-selects up, which would copy b and k into every expression that
// uses them (measured: 10–15 % fewer statements per second without).
var reserveSQL = `
INSERT INTO fleetpace_pace AS s (platform) VALUES ($1)
ON CONFLICT (platform) DO UPDATE SET
    (cursor_at, last_slot, last_count, last_interval, last_max_wait, run_start) = (
        SELECT CASE WHEN g.k > 0 THEN g.b + g.k * g.i ELSE s.cursor_at END, g.first, g.k, COALESCE(g.i, 0), $2::float8,
               CASE WHEN g.k > 0 AND g.first > s.cursor_at + g.i THEN g.first ELSE s.run_start END
        FROM (SELECT f.b, f.i, f.first,
                     CASE WHEN s.rate <= 0 OR f.first - f.now > $2::float8 OR s.paused_until > f.now THEN 0
                          ELSE LEAST($4::float8, floor((f.now + $2::float8 - f.base) / f.i) + 1)::int END AS k
              FROM (SELECT e.now, e.i, e.b, e.base, GREATEST(e.now + $3::float8, e.hold, e.base) AS first
                    FROM (SELECT c.now, c.i, c.hold,
                                 GREATEST(s.cursor_at, c.now + $3::float8, c.hold) AS b,
                                 GREATEST(s.cursor_at, c.now + $3::float8, c.hold) - COALESCE((s.burst - 1 - ` + heldBackSQL("c.i") + `) / NULLIF(s.rate, 0), 0) AS base
                          FROM (SELECT n.now, GREATEST(s.hold_until, s.paused_until) AS hold,
                                       CASE WHEN n.now < s.announced_until
                                            THEN GREATEST(GREATEST(s.multiplier, 1.0) / NULLIF(s.rate, 0), s.announced_interval)
                                            ELSE GREATEST(s.multiplier, 1.0) / NULLIF(s.rate, 0) END AS i
                                FROM (SELECT date_part('epoch', clock_timestamp()) AS now) AS n
                          ) AS c
                    ) AS e OFFSET 0
              ) AS f OFFSET 0
        ) AS g
    )
RETURNING date_part('epoch', clock_timestamp()), s.last_count, s.last_slot, s.last_interval,
          s.cursor_at, s.rate, s.burst, s.max_multiplier, s.multiplier, s.event_seq,
          GREATEST(s.hold_until, s.paused_until), s.paused_until, s.event_at, s.event_shift, s.event_horizon,
          ` + heldBackSQL("NULLIF(s.last_interval, 0)") + `::int`

// heldBackSQL is how many slots of the pace row s's burst a reservation at
// spacing i (an SQL expression, seconds) holds back for lateness: see
// reserveSQL and lateTolerance.
func heldBackSQL(i string) string {
	slack := strconv.FormatFloat(LateSlack.Seconds(), 'f', -1, 64)
	return `LEAST(floor((s.burst - 1) / 2), GREATEST(0, ceil(` + slack + ` / ` + i + ` - 0.5)))`
}

// reportSQL applies $5 outcomes of one kind at once (a batch of clean
// reports; pressure is always reported alone) and what the destination
// announced. $1 platform, $2 true for rate pressure (false: clean), $3 the
// reservation's database time (NULL: unknown, treated as now), $4
// Retry-After in seconds (NULL: none), $5 how many, $6 the spacing the
// destination announced in seconds (NULL: nothing announced), $7 how long
// the announcement holds, in seconds, $8 a hold the destination asked for
// through its quota headers, in seconds (NULL: none), $9 the reason of a
// new hold, $10 the announced quota's window in seconds (NULL: unknown).
//
// The multiplier (the controller; see docs/design.md "Adaptive pacing"):
//   - Pressure for a request reserved at or after the latest slow-down (an
//     increase, an announced lower rate, a hold: doubled_at) multiplies it by
//     backoff_factor (at most max_multiplier) and remembers the multiplier
//     it came from (pressure_mult); older pressure is stale and does not
//     increase it again (one increase per episode). Any pressure resets the
//     fleet-wide clean streak.
//   - While the destination's announced spacing is in force, a completed
//     clean streak relaxes the multiplier at least down to the announced
//     level (rate × announced spacing): the destination says what it allows,
//     and the streak confirms it.
//   - Every decay_after clean responses, fleet-wide, divide it by
//     recovery_factor, never below 1. With probe, the division stops at
//     pressure_mult × (1 + probeMargin); from there each step divides by
//     recovery_factor^(1/probeSteps); a step that takes it below
//     pressure_mult / (1 + probeMargin) forgets the memory.
//
// Announced spacing (use_headers only) replaces the previous one and holds
// for $7 seconds; a quota hold ($8) extends hold_until like Retry-After.
//
// With respace (the default), a report that slows the platform down — an
// increase of the multiplier, any other larger effective spacing by more
// than respaceRatio (an announced quota a little lower than the last is
// noise: only new slots follow it), or a hold extended past now — is an
// event: event_seq grows, the cursor's
// granted-but-unused slots are re-spaced (stretched by the ratio of the
// spacings after the later of now and the hold), and pg_notify tells every
// process, which re-spaces the slots it holds the same way. An event that
// brings an announced quota with its window ($10) also re-spaces what the
// current run of reservations (run_start) granted in the last window, as if
// it had been spaced by the quota: every later slot moves by retro, the
// stretch of those slots, so no window of that length holds more than the
// quota even though the fleet sent at the old spacing until it knew. UPDATE under READ
// COMMITTED re-evaluates SET against the latest row version, so concurrent
// reports compose.
var reportSQL = fmt.Sprintf(`
WITH u AS (
UPDATE fleetpace_pace AS s SET
    (multiplier, clean_streak, doubled_at, pressure_mult, hold_until, hold_reason,
     announced_interval, announced_until, announced_window, announced_window_at, cursor_at, last_interval,
     event_seq, event_at, event_shift, event_horizon, last_respaced, last_effect) = (
        SELECT q.m, q.streak,
               CASE WHEN q.event AND (q.ratio > 1.000001 OR q.shift > 0) THEN q.now ELSE q.doubled_at END,
               q.mp, q.hold, q.hold_reason,
               q.ann_i, q.ann_until,
               CASE WHEN q.win_new THEN $10::float8 ELSE s.announced_window END,
               CASE WHEN q.win_new THEN q.now ELSE s.announced_window_at END,
               CASE WHEN q.event AND s.cursor_at > q.pivot
                    THEN LEAST(q.pivot + (s.cursor_at - q.pivot) * q.ratio + q.shift, GREATEST(q.now + s.last_max_wait, q.pivot) + q.i_new)
                    WHEN q.event
                    THEN LEAST(s.cursor_at + q.retro, GREATEST(q.now + s.last_max_wait, q.pivot) + q.i_new)
                    ELSE s.cursor_at END,
               q.i_new,
               s.event_seq + q.event::int,
               CASE WHEN q.event THEN q.now ELSE s.event_at END,
               CASE WHEN q.event THEN q.shift ELSE s.event_shift END,
               CASE WHEN q.event THEN GREATEST(q.now + s.last_max_wait, q.pivot) ELSE s.event_horizon END,
               q.event,
               q.effect
        FROM (SELECT r.*, s.respace AND (r.effect = %[1]d AND r.ratio > 1.000001 OR r.ratio > %[8]g
                                         OR r.hold > GREATEST(s.hold_until, r.now)) AS event,
                     GREATEST(GREATEST(r.hold, s.paused_until) - (r.pivot + (r.first - r.pivot) * r.ratio), r.retro, 0) AS shift
              FROM (SELECT r.*,
                           CASE WHEN r.win > 0 AND r.ann_i > 0
                                THEN GREATEST(LEAST(s.cursor_at, r.pivot) - GREATEST(s.run_start, r.pivot - r.win), 0) * (r.ratio - 1)
                                ELSE 0 END AS retro
              FROM (SELECT p.*, GREATEST(p.i_new / p.i_old, 1) AS ratio, p.now + %[9]g AS pivot,
                           CASE WHEN s.cursor_at > p.now + %[9]g
                                THEN s.cursor_at - floor((s.cursor_at - p.now - %[9]g) / p.i_old) * p.i_old
                                ELSE p.now + %[9]g END AS first
                    FROM (SELECT p.*,
                           CASE WHEN p.now < s.announced_until
                                THEN GREATEST(p.m0 / s.rate, s.announced_interval) ELSE p.m0 / s.rate END AS i_old,
                           CASE WHEN p.now < p.ann_until
                                THEN GREATEST(p.m / s.rate, p.ann_i) ELSE p.m / s.rate END AS i_new
                    FROM (SELECT d.now, d.m0, d.m, d.streak, d.doubled_at, d.hold, d.ann_i, d.ann_until, d.effect, d.win, d.win_new,
                                 CASE WHEN d.fresh THEN d.m0
                                      WHEN d.steps > 0 AND d.m < s.pressure_mult / (1 + %[5]g) THEN 0
                                      ELSE s.pressure_mult END AS mp,
                                 CASE WHEN d.hold > s.hold_until THEN $9::text ELSE s.hold_reason END AS hold_reason
                          FROM (SELECT n.now, n.m0, n.fresh, n.steps, n.win, n.win_new,
                                       CASE WHEN n.fresh THEN LEAST(n.m0 * s.backoff_factor, s.max_multiplier)
                                            WHEN n.steps = 0 THEN n.m0
                                            WHEN n.ann_i > 0
                                                 THEN GREATEST(LEAST(n.m0 / power(s.recovery_factor, n.steps), n.ann_i * s.rate), 1.0)
                                            WHEN NOT s.probe OR s.pressure_mult <= 0
                                                 THEN GREATEST(n.m0 / power(s.recovery_factor, n.steps), 1.0)
                                            WHEN n.m0 > s.pressure_mult * (1 + %[5]g)
                                                 THEN GREATEST(n.m0 / power(s.recovery_factor, n.steps), s.pressure_mult * (1 + %[5]g))
                                            ELSE GREATEST(n.m0 / power(s.recovery_factor, n.steps / %[6]d.0), 1.0) END AS m,
                                       CASE WHEN $2::bool THEN 0 ELSE n.streak %% GREATEST(s.decay_after, 1) END AS streak,
                                       CASE WHEN n.fresh THEN n.now ELSE s.doubled_at END AS doubled_at,
                                       GREATEST(s.hold_until,
                                                CASE WHEN $2::bool THEN n.now + $4::float8 END,
                                                CASE WHEN s.use_headers THEN n.now + $8::float8 END) AS hold,
                                       COALESCE(n.ann, s.announced_interval) AS ann_i,
                                       CASE WHEN n.ann IS NOT NULL THEN n.now + $7::float8 ELSE s.announced_until END AS ann_until,
                                       CASE WHEN n.fresh THEN %[1]d
                                            WHEN $2::bool AND n.stale THEN %[3]d
                                            WHEN $2::bool THEN %[2]d
                                            WHEN n.steps > 0 AND n.m0 > 1 THEN %[4]d
                                            ELSE 0 END AS effect
                                FROM (SELECT c.*, $2::bool AND NOT c.stale AND c.m0 < s.max_multiplier AS fresh,
                                             COALESCE(c.ann, CASE WHEN c.now < s.announced_until THEN s.announced_interval ELSE 0 END) AS ann_i,
                                             CASE WHEN $2::bool THEN 0 ELSE LEAST(c.streak / GREATEST(s.decay_after, 1), 64) END AS steps
                                      FROM (SELECT w.*,
                                                   CASE WHEN s.use_headers AND $6::float8 IS NOT NULL
                                                        THEN LEAST(GREATEST($6::float8, CASE WHEN $11::float8 > 0 AND w.win > 0
                                                                                             THEN w.win / ($11::float8 * %[10]g) ELSE 0 END), %[11]g)
                                                   END AS ann
                                            FROM (SELECT v.*,
                                                         GREATEST(COALESCE($10::float8, 0), CASE WHEN v.win_kept THEN s.announced_window ELSE 0 END) AS win,
                                                         s.use_headers AND $10::float8 > 0 AND ($10::float8 >= s.announced_window OR NOT v.win_kept) AS win_new
                                                  FROM (SELECT date_part('epoch', clock_timestamp()) AS now,
                                                               GREATEST(1.0, LEAST(s.multiplier, s.max_multiplier)) AS m0,
                                                               s.clean_streak + $5::int AS streak,
                                                               COALESCE($3::float8, date_part('epoch', clock_timestamp())) < s.doubled_at AS stale,
                                                               date_part('epoch', clock_timestamp()) - s.announced_window_at < %[12]g AS win_kept
                                                       ) AS v
                                                 ) AS w
                                           ) AS c
                                ) AS n
                          ) AS d
                    ) AS p OFFSET 0
                    ) AS p
              ) AS r
              ) AS r
        ) AS q
    )
WHERE s.platform = $1 AND s.rate > 0
RETURNING s.platform, s.multiplier, s.max_multiplier, s.clean_streak, s.last_effect,
          GREATEST(s.hold_until - date_part('epoch', clock_timestamp()), 0) AS hold_left,
          s.event_seq, s.event_at, s.last_interval, s.event_shift, s.event_horizon,
          GREATEST(s.hold_until, s.paused_until) AS hold_at, s.last_respaced,
          CASE WHEN date_part('epoch', clock_timestamp()) - s.announced_window_at < %[12]g THEN s.announced_window ELSE 0 END AS window
)
SELECT u.multiplier, u.max_multiplier, u.clean_streak, u.last_effect, u.hold_left,
       u.event_seq, u.event_at, u.last_interval, u.event_shift, u.event_horizon, u.hold_at, u.last_respaced, u.window,
       CASE WHEN u.last_respaced
            THEN pg_notify('%[7]s', u.platform || '|' || u.event_seq || '|' || u.event_at || '|' || u.last_interval
                                    || '|' || u.event_shift || '|' || u.event_horizon || '|' || u.hold_at)
       END IS NULL
FROM u`,
	effectIncreased, effectAtMax, effectStale, effectRelaxed, probeMargin, probeSteps, NotifyChannel, respaceRatio,
	respaceLead.Seconds(), announcedShare, MaxHold.Seconds(), resetMemory.Seconds())

// pauseSQL pauses a platform fleet-wide until $2 (epoch seconds of the
// database clock; 'Infinity': until resumed), or for $4 seconds from now
// when $4 > 0, for the reason $3, and returns when the pause ends. It is an
// event: every process gives back the slots it holds (they were granted
// before the pause), and the cursor restarts from now, since no granted
// slot is left to honour.
var pauseSQL = `
WITH u AS (
UPDATE fleetpace_pace AS s SET paused_until = CASE WHEN $4::float8 > 0 THEN n.now + $4::float8 ELSE $2::float8 END, pause_reason = $3,
    cursor_at = LEAST(s.cursor_at, n.now + ` + leadSQL + `), event_seq = s.event_seq + 1, event_at = n.now,
    event_shift = 'Infinity', event_horizon = n.now, last_respaced = true
FROM (SELECT date_part('epoch', clock_timestamp()) AS now) AS n
WHERE s.platform = $1
RETURNING s.platform, s.event_seq, s.event_at, s.last_interval, GREATEST(s.hold_until, s.paused_until) AS hold_at, s.paused_until
)
SELECT u.paused_until, pg_notify('` + NotifyChannel + `', u.platform || '|' || u.event_seq || '|' || u.event_at || '|' || u.last_interval
                 || '|Infinity|' || u.event_at || '|' || u.hold_at) IS NULL
FROM u`

// holdSQL raises a platform's hold to $2 (a timestamptz, converted to the
// pacer's epoch seconds by the database) for the reason $3, if that is later
// than the hold in place and than now. With respace it is an event: the
// cursor's granted slots move past the hold, keeping their spacing, and
// every process moves its own alike.
var holdSQL = `
WITH n AS (SELECT date_part('epoch', clock_timestamp()) AS now, date_part('epoch', $2::timestamptz) AS until),
u AS (
UPDATE fleetpace_pace AS s SET
    (hold_until, hold_reason, cursor_at, event_seq, event_at, event_shift, event_horizon, last_respaced) = (
        SELECT n.until, $3::text,
               CASE WHEN s.respace AND s.cursor_at > n.now + ` + leadSQL + `
                    THEN LEAST(s.cursor_at + f.shift, GREATEST(n.now + GREATEST(s.last_max_wait, ` + leadSQL + `) + s.last_interval, n.until))
                    ELSE s.cursor_at END,
               s.event_seq + s.respace::int,
               CASE WHEN s.respace THEN n.now ELSE s.event_at END,
               CASE WHEN s.respace THEN f.shift ELSE s.event_shift END,
               CASE WHEN s.respace THEN n.now + GREATEST(s.last_max_wait, ` + leadSQL + `) ELSE s.event_horizon END,
               s.respace
        FROM (SELECT GREATEST(n.until - CASE WHEN s.cursor_at > n.now + ` + leadSQL + ` AND s.last_interval > 0
                                             THEN s.cursor_at - floor((s.cursor_at - n.now - ` + leadSQL + `) / s.last_interval) * s.last_interval
                                             ELSE n.now + ` + leadSQL + ` END, 0) AS shift) AS f
    )
FROM n
WHERE s.platform = $1 AND n.until > GREATEST(s.hold_until, n.now)
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
const resumeSQL = `UPDATE fleetpace_pace SET paused_until = 0, pause_reason = '' WHERE platform = $1`

// clearHoldSQL ends a platform's fleet-wide hold (Retry-After, quota or
// cooldown) at once, and the backoff with it: the platform runs at its
// configured pace again (an operator who clears a cooldown says "go"; a
// multiplier left at its maximum would keep it crawling), and pressure for
// requests reserved before the clear is stale. Slots granted during the
// hold were placed after it: the cursor comes back to now and they are
// given back (an event with an infinite shift), so their callers reserve
// again and go now.
var clearHoldSQL = `
WITH u AS (
UPDATE fleetpace_pace AS s SET hold_until = 0, hold_reason = '',
    multiplier = 1, pressure_mult = 0, clean_streak = 0, doubled_at = n.now,
    last_interval = CASE WHEN s.rate > 0 THEN GREATEST(1.0 / s.rate, CASE WHEN n.now < s.announced_until THEN s.announced_interval ELSE 0 END)
                         ELSE s.last_interval END,
    cursor_at = LEAST(s.cursor_at, n.now + ` + leadSQL + `), event_seq = s.event_seq + 1, event_at = n.now,
    event_shift = 'Infinity', event_horizon = n.now, last_respaced = true
FROM (SELECT date_part('epoch', clock_timestamp()) AS now) AS n
WHERE s.platform = $1
RETURNING s.platform, s.event_seq, s.event_at, s.last_interval, s.paused_until AS hold_at
)
SELECT pg_notify('` + NotifyChannel + `', u.platform || '|' || u.event_seq || '|' || u.event_at || '|' || u.last_interval
                 || '|Infinity|' || u.event_at || '|' || u.hold_at) IS NULL
FROM u`

// ensureRowSQL creates a platform's pace row if it is missing (normally the
// platform trigger has made it). No row affected and no row present means
// the platform does not exist.
const ensureRowSQL = `
INSERT INTO fleetpace_pace (platform, rate, burst, max_multiplier, decay_after,
                            backoff_factor, recovery_factor, probe, use_headers, respace)
SELECT name, rate_per_sec, burst, max_multiplier, decay_after,
       backoff_factor, recovery_factor, probe, use_headers, respace
FROM fleetpace_platform WHERE name = $1
ON CONFLICT (platform) DO NOTHING`

// syncRowSQL copies a platform's configuration into its pace row (after the
// row was created without it).
const syncRowSQL = `
UPDATE fleetpace_pace AS s SET rate = p.rate_per_sec, burst = p.burst,
    max_multiplier = p.max_multiplier, decay_after = p.decay_after,
    backoff_factor = p.backoff_factor, recovery_factor = p.recovery_factor,
    probe = p.probe, use_headers = p.use_headers, respace = p.respace
FROM fleetpace_platform AS p
WHERE s.platform = $1 AND p.name = s.platform`

// statesSQL reads every platform's pacer state for humans; statesOfSQL
// those of the platforms in $1 (primary-key lookups).
const (
	statesSQL   = statesSelect + `ORDER BY s.platform`
	statesOfSQL = statesSelect + `WHERE s.platform = ANY($1::text[]) ORDER BY s.platform`
)

const statesSelect = `
SELECT s.platform, s.rate, s.burst, s.max_multiplier, s.decay_after,
       s.backoff_factor, s.recovery_factor, s.probe, s.use_headers, s.respace,
       s.multiplier, s.clean_streak, s.pressure_mult,
       GREATEST(s.hold_until - n.now, 0), s.hold_reason,
       GREATEST(s.paused_until - n.now, 0), s.pause_reason,
       CASE WHEN n.now < s.announced_until THEN s.announced_interval ELSE 0 END,
       GREATEST(s.announced_until - n.now, 0),
       GREATEST(s.cursor_at - n.now, 0), s.event_seq
FROM fleetpace_pace AS s
CROSS JOIN (SELECT date_part('epoch', clock_timestamp()) AS now) AS n
`
