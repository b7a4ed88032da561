package sources

import "strings"

// Every SQL statement of the package lives here.

const setPlatformSQL = `
INSERT INTO fleetpace_platform (name, rate_per_sec, burst, max_multiplier, decay_after, cooldown,
                                backoff_factor, recovery_factor, probe, use_headers, respace, adapt,
                                key_rate, key_burst, max_in_flight, key_max_in_flight)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (name) DO UPDATE SET
    rate_per_sec    = EXCLUDED.rate_per_sec,
    burst           = EXCLUDED.burst,
    max_multiplier  = EXCLUDED.max_multiplier,
    decay_after     = EXCLUDED.decay_after,
    cooldown        = EXCLUDED.cooldown,
    backoff_factor  = EXCLUDED.backoff_factor,
    recovery_factor = EXCLUDED.recovery_factor,
    probe           = EXCLUDED.probe,
    use_headers     = EXCLUDED.use_headers,
    respace         = EXCLUDED.respace,
    adapt           = EXCLUDED.adapt,
    key_rate        = EXCLUDED.key_rate,
    key_burst       = EXCLUDED.key_burst,
    max_in_flight   = EXCLUDED.max_in_flight,
    key_max_in_flight = EXCLUDED.key_max_in_flight,
    updated_at      = now()`

const platformColumns = `name, rate_per_sec, burst, max_multiplier, decay_after, cooldown,
    backoff_factor, recovery_factor, probe, use_headers, respace, adapt,
    key_rate, key_burst, max_in_flight, key_max_in_flight`

const listPlatformsSQL = `SELECT ` + platformColumns + ` FROM fleetpace_platform ORDER BY name`

const getPlatformSQL = `SELECT ` + platformColumns + ` FROM fleetpace_platform WHERE name = $1`

const addSourceSQL = `
WITH ins AS (
    INSERT INTO fleetpace_source (platform, url, check_interval, key)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (platform, url) DO NOTHING
    RETURNING id
)
SELECT id, true FROM ins
UNION ALL
SELECT id, false FROM fleetpace_source WHERE platform = $1 AND url = $2 AND NOT EXISTS (SELECT 1 FROM ins)`

const sourceColumns = `id, platform, url, check_interval, enabled, due_at, last_checked_at,
    consecutive_failures, last_status, last_outcome, last_error, etag, last_modified,
    content_hash, queued_at, queued_job_id, key`

// activeCooldown is the condition "cooldown c has not ended" (as the
// schema's fleetpace_platform_stop asks it).
const activeCooldown = `c.until > now()`

// listSourcesSQL lists sources in fair order; with $2, only those due now
// (the schema's definition: a fleetpace_due_source whose platform is not
// stopped, fleetpace_platform_stop).
const listSourcesSQL = `
SELECT ` + sourceColumns + `
FROM fleetpace_source s
WHERE ($1 = '' OR s.platform = $1)
  AND (NOT $2 OR EXISTS (SELECT 1 FROM fleetpace_due_source d JOIN fleetpace_platform_stop st ON st.platform = d.platform
                         WHERE d.id = s.id AND NOT st.stopped))
  AND s.consecutive_failures >= $4
  AND ($5 = '' OR s.last_outcome = $5)
  AND ($6::text IS NULL OR s.key = $6)
ORDER BY s.last_checked_at ASC NULLS FIRST, s.id
LIMIT $3`

const getSourceSQL = `SELECT ` + sourceColumns + ` FROM fleetpace_source WHERE id = $1`

// existingSourceIDsSQL returns which of the ids $1 name a source.
const existingSourceIDsSQL = `SELECT id FROM fleetpace_source WHERE id = ANY($1)`

// removeSourcesSQL deletes sources and their history.
const removeSourcesSQL = `
WITH h AS (DELETE FROM fleetpace_check WHERE source_id = ANY($1))
DELETE FROM fleetpace_source WHERE id = ANY($1) RETURNING id`

const sourcesByURLSQL = `SELECT ` + sourceColumns + ` FROM fleetpace_source WHERE url = $1 ORDER BY id LIMIT 10`

// updateSourceSQL changes a source's interval ($2, NULL: unchanged) and
// whether it is enabled ($3, NULL: unchanged). A new interval moves the
// next check of a source that is not failing to its last check plus the new
// interval (a failing source keeps its backoff).
var updateSourceSQL = `
UPDATE fleetpace_source s SET ` + strings.NewReplacer("$4", "$2", "$5", "$3").Replace(sourceUpdateSet) + `
WHERE s.id = $1
RETURNING ` + sourceColumns

// sourceUpdateSet is what a SourceUpdate sets: the interval ($4, NULL:
// unchanged) and whether the source is enabled ($5, NULL: unchanged).
const sourceUpdateSet = `
    check_interval = COALESCE($4::interval, s.check_interval),
    enabled        = COALESCE($5::boolean, s.enabled),
    due_at         = CASE WHEN $4::interval IS NOT NULL AND s.last_checked_at IS NOT NULL AND s.consecutive_failures = 0
                          THEN s.last_checked_at + $4::interval ELSE s.due_at END`

// selectedSources is the condition of the sources a Selection selects: by
// ids ($1, NULL: any), platform ($2, empty: any) and consecutive failures
// (at least $3).
const selectedSources = `($1::bigint[] IS NULL OR s.id = ANY($1))
  AND ($2 = '' OR s.platform = $2)
  AND s.consecutive_failures >= $3`

// setEnabledSQL enables or disables ($4) the selected sources and returns
// the ids it selected.
const setEnabledSQL = `
UPDATE fleetpace_source s SET enabled = $4
WHERE ` + selectedSources + `
RETURNING s.id`

// updateSourcesSQL is updateSourceSQL for the selected sources: interval
// $4, enabled $5 (NULL: unchanged); it returns the ids it selected.
const updateSourcesSQL = `
UPDATE fleetpace_source s SET ` + sourceUpdateSet + `
WHERE ` + selectedSources + `
RETURNING s.id`

// addSourcesTempTableSQL and addSourcesInsertSQL are AddSources': the rows
// are copied into a temporary table, then inserted unless present.
const addSourcesTempTableSQL = `
CREATE TEMP TABLE fleetpace_import (
    platform       text     NOT NULL,
    url            text     NOT NULL,
    check_interval interval NOT NULL,
    key            text     NOT NULL
) ON COMMIT DROP`

const addSourcesInsertSQL = `
INSERT INTO fleetpace_source (platform, url, check_interval, key)
SELECT platform, url, check_interval, key FROM fleetpace_import
ON CONFLICT (platform, url) DO NOTHING`

// recordSQL builds the statement that records checks, one definition for
// every form (one check or a batch, with or without its history row), so
// they cannot drift apart. The rules:
//   - ok, not_modified: checked now; failures reset; next due after the interval.
//   - failed: checked now; failures + 1; next due after interval × 2^failures,
//     capped at 64 × interval and at max(interval, 24 h).
//   - rate_pressure, rate_limited: not a check and not a failure; the source
//     keeps its place in the fair order and is due again at once (cooldowns
//     and the pacer decide when it actually runs).
//
// Every check releases the source's queue mark. The check's job (0:
// unknown) must still hold the mark: if the source has been queued since
// for another job (released by the tick's reconciliation while this check
// was on its way), nothing is written and that job checks it.
//
// With history, the statement is a data-modifying CTE: the UPDATE returns
// the rows it wrote, and the same statement inserts one fleetpace_check row
// for each (a check that is not written has no history either). One
// statement, one round trip, one commit: the history costs the insert, not
// a trip.
//
// v names the check's values in the statement; from adds the batch's rows.
func recordSQL(v checkValues, from string, history bool) string {
	update := `
UPDATE fleetpace_source s SET
    queued_at            = NULL,
    queued_job_id        = NULL,
    last_status          = {status},
    last_outcome         = {outcome},
    last_error           = NULLIF({error}, ''),
    etag                 = CASE WHEN {outcome} = 'ok' THEN NULLIF({etag}, '') ELSE s.etag END,
    last_modified        = CASE WHEN {outcome} = 'ok' THEN NULLIF({last_modified}, '') ELSE s.last_modified END,
    content_hash         = CASE WHEN {outcome} = 'ok' AND {content_hash} <> '' THEN {content_hash} ELSE s.content_hash END,
    last_checked_at      = CASE WHEN {outcome} IN ('ok', 'not_modified', 'failed') THEN now() ELSE s.last_checked_at END,
    consecutive_failures = CASE {outcome} WHEN 'failed' THEN s.consecutive_failures + 1
                                          WHEN 'ok' THEN 0 WHEN 'not_modified' THEN 0
                                          ELSE s.consecutive_failures END,
    due_at = CASE
        WHEN {outcome} IN ('ok', 'not_modified') THEN now() + s.check_interval
        WHEN {outcome} = 'failed' THEN now() + LEAST(
            s.check_interval * power(2, LEAST(s.consecutive_failures + 1, 6)),
            GREATEST(s.check_interval, interval '24 hours'))
        ELSE now() END{from}
WHERE s.id = {id}
  AND ({job} = 0 OR s.queued_job_id IS NULL OR s.queued_job_id = {job})`
	if history {
		update = `
WITH u AS (` + update + `
RETURNING s.id, s.platform, {outcome} AS outcome, {status} AS status, NULLIF({error}, '') AS reason,
          {duration_ms} AS duration_ms, {bytes} AS bytes, {worker} AS worker, {multiplier} AS multiplier
)
INSERT INTO fleetpace_check (source_id, platform, outcome, status, reason, duration_ms, bytes, worker, multiplier)
SELECT id, platform, outcome, status, reason, duration_ms, bytes, worker, multiplier FROM u`
	}
	return strings.NewReplacer(
		"{id}", v.id, "{outcome}", v.outcome, "{status}", v.status, "{error}", v.error, "{etag}", v.etag,
		"{last_modified}", v.lastModified, "{content_hash}", v.contentHash, "{job}", v.job, "{from}", from,
		"{duration_ms}", v.durationMS, "{bytes}", v.bytes, "{worker}", v.worker, "{multiplier}", v.multiplier,
	).Replace(update)
}

// checkValues are the SQL expressions of one check's values.
type checkValues struct {
	id, outcome, status, error, etag, lastModified, contentHash, job string
	durationMS, bytes, worker, multiplier                            string // history only
}

// oneCheck names the values of one check: $1 the source, $2…$7 outcome,
// status, error, etag, last_modified, content_hash, $8 the job, and for the
// history $9…$12 duration (ms), bytes, worker, multiplier.
var oneCheck = checkValues{"$1::bigint", "$2::text", "$3::integer", "$4::text", "$5::text", "$6::text", "$7::text", "$8::bigint", "$9::real", "$10::bigint", "$11::text", "$12::real"}

// batchChecks names the values of a batch: the i-th element of each array is
// one check's $1…$12. The ids must be distinct (with a duplicate, UPDATE …
// FROM would apply one of its rows, unspecified which).
var batchChecks = checkValues{"r.id", "r.outcome", "r.status", "r.error", "r.etag", "r.last_modified", "r.content_hash", "r.job_id",
	"r.duration_ms", "r.bytes", "r.worker", "r.multiplier"}

const batchFrom = `
FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[]{history})
    AS r(id, outcome, status, error, etag, last_modified, content_hash, job_id{historyColumns})`

var (
	// recordCheckSQL records one check ($1…$8), recordCheckHistorySQL one
	// check and its history row ($1…$12).
	recordCheckSQL        = recordSQL(oneCheck, "", false)
	recordCheckHistorySQL = recordSQL(oneCheck, "", true)
	// recordChecksSQL and recordChecksHistorySQL are the same for a batch.
	recordChecksSQL        = recordSQL(batchChecks, strings.NewReplacer("{history}", "", "{historyColumns}", "").Replace(batchFrom), false)
	recordChecksHistorySQL = recordSQL(batchChecks, strings.NewReplacer(
		"{history}", ", $9::real[], $10::bigint[], $11::text[], $12::real[]",
		"{historyColumns}", ", duration_ms, bytes, worker, multiplier").Replace(batchFrom), true)
)

const releaseSQL = `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL WHERE id = $1`

// setCooldownSQL upserts a platform's cooldown. $2 is the Retry-After in
// seconds (0 if none), $3 the jitter factor (1 ± 0.1), $4 the reason, $5
// the cause (the latest answer's, with its Retry-After).
//   - While a cooldown is active, another rate-limited answer (likely from a
//     request sent before it began) only extends it to the longer of the two.
//   - A repeat within one platform cooldown after the last one ended doubles
//     the duration (count + 1); later, it starts again from count 1.
//   - Duration = max(platform cooldown, Retry-After) × 2^(count−1) × jitter,
//     capped at 24 h, and never shorter than the Retry-After (the jitter
//     spreads the fleet's return after it, never before).
const setCooldownSQL = `
WITH p AS (
    SELECT name, GREATEST(cooldown, make_interval(secs => $2)) AS base, cooldown
    FROM fleetpace_platform WHERE name = $1
)
INSERT INTO fleetpace_cooldown AS c (platform, until, reason, count, started_at, updated_at, cause, retry_after_s)
SELECT p.name, now() + GREATEST(LEAST(p.base * $3, interval '24 hours'), make_interval(secs => $2)), $4, 1, now(), now(), $5, $2 FROM p
ON CONFLICT (platform) DO UPDATE SET
    count = CASE
        WHEN c.until > now() THEN c.count
        WHEN c.until + (SELECT cooldown FROM p) > now() THEN c.count + 1
        ELSE 1 END,
    until = CASE
        WHEN c.until > now() THEN GREATEST(c.until,
            now() + GREATEST(LEAST((SELECT base FROM p) * power(2, c.count - 1) * $3, interval '24 hours'), make_interval(secs => $2)))
        WHEN c.until + (SELECT cooldown FROM p) > now() THEN
            now() + GREATEST(LEAST((SELECT base FROM p) * power(2, c.count) * $3, interval '24 hours'), make_interval(secs => $2))
        ELSE now() + GREATEST(LEAST((SELECT base FROM p) * $3, interval '24 hours'), make_interval(secs => $2)) END,
    reason = EXCLUDED.reason,
    cause = EXCLUDED.cause,
    retry_after_s = EXCLUDED.retry_after_s,
    started_at = CASE WHEN c.until > now() THEN c.started_at ELSE now() END,
    updated_at = now()
RETURNING until, count`

// cooldownsOfSQL is the active cooldowns of the platforms in $1.
const cooldownsOfSQL = `
SELECT platform, until, reason, count, started_at, until - now(), cause, retry_after_s
FROM fleetpace_cooldown c
WHERE platform = ANY($1::text[]) AND ` + activeCooldown + ` ORDER BY platform`

const activeCooldownsSQL = `
SELECT platform, until, reason, count, started_at, until - now(), cause, retry_after_s
FROM fleetpace_cooldown c WHERE ` + activeCooldown + ` ORDER BY platform`

// countsSQL is the per-platform summary for status: sources, enabled, queued,
// due now (the schema's definition, as `sources list --due` and the scan
// see it: none while the platform is stopped), never checked, failing, and
// how late the due ones are (max, p95).
const countsSQL = `
SELECT p.name,
       count(s.id),
       count(s.id) FILTER (WHERE s.enabled),
       count(s.id) FILTER (WHERE s.queued_at IS NOT NULL),
       CASE WHEN st.stopped THEN 0 ELSE (SELECT count(*) FROM fleetpace_due_source d WHERE d.platform = p.name) END,
       count(s.id) FILTER (WHERE s.last_checked_at IS NULL),
       count(s.id) FILTER (WHERE s.enabled AND s.consecutive_failures > 0),
       COALESCE(EXTRACT(EPOCH FROM max(now() - s.due_at) FILTER (WHERE s.enabled AND s.due_at <= now())), 0)::float8,
       COALESCE(percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM now() - s.due_at))
                FILTER (WHERE s.enabled AND s.due_at <= now()), 0)::float8
FROM fleetpace_platform p
JOIN fleetpace_platform_stop st ON st.platform = p.name
LEFT JOIN fleetpace_source s ON s.platform = p.name
GROUP BY p.name, st.stopped
ORDER BY p.name`

// historySQL is one source's last $2 checks, newest first: a backward walk
// of fleetpace_check_source_idx.
const historySQL = `
SELECT checked_at, outcome, status, duration_ms, bytes, reason, worker
FROM fleetpace_check
WHERE source_id = $1
ORDER BY checked_at DESC
LIMIT $2`

// pruneHistorySQL deletes up to $2 history rows recorded before now() − $1,
// oldest first per platform: each platform's old rows are the start of its
// range of fleetpace_check_platform_idx, so the statement costs about the
// rows it deletes plus one index descent per platform, however large the
// table is.
const pruneHistorySQL = `
DELETE FROM fleetpace_check
WHERE ctid = ANY (ARRAY(
    SELECT h.ctid
    FROM fleetpace_platform p
    CROSS JOIN LATERAL (
        SELECT c.ctid FROM fleetpace_check c
        WHERE c.platform = p.name AND c.checked_at < now() - $1::interval
        ORDER BY c.checked_at
        LIMIT $2) h
    LIMIT $2))`

// activitySQL counts checks per platform ($1: every platform when empty),
// time bucket ($3 wide, from now() − $2) and outcome, with their largest
// multiplier (NULL: none recorded). Each platform's
// window is a range of fleetpace_check_platform_idx: the cost is the rows in
// the window, not the table.
const activitySQL = `
SELECT p.name, a.bucket, a.outcome, a.n, a.mult
FROM fleetpace_platform p
CROSS JOIN LATERAL (
    SELECT date_bin($3::interval, c.checked_at, n.since) AS bucket, c.outcome, count(*) AS n,
           max(c.multiplier)::double precision AS mult
    FROM (SELECT now() - $2::interval AS since) n
    JOIN fleetpace_check c ON c.platform = p.name AND c.checked_at >= n.since
    GROUP BY 1, 2) a
WHERE $1 = '' OR p.name = $1
ORDER BY p.name, a.bucket, a.outcome`

const lockPlatformSQL = `SELECT ` + platformColumns + ` FROM fleetpace_platform WHERE name = $1 FOR UPDATE`

// deletePlatformSQL deletes a platform with its sources, their history and
// its cooldown; the pace row goes with the platform (ON DELETE CASCADE).
// It returns what it deleted: sources, history rows, cooldowns (0 or 1).
const deletePlatformSQL = `
WITH s AS (DELETE FROM fleetpace_source WHERE platform = $1 RETURNING 1),
     h AS (DELETE FROM fleetpace_check WHERE platform = $1 RETURNING 1),
     c AS (DELETE FROM fleetpace_cooldown WHERE platform = $1 RETURNING 1),
     p AS (DELETE FROM fleetpace_platform WHERE name = $1 RETURNING 1)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM h), (SELECT count(*) FROM c), (SELECT count(*) FROM p)`

const countPlatformSourcesSQL = `SELECT count(*) FROM fleetpace_source WHERE platform = $1`

// clearCooldownSQL ends a platform's cooldown and forgets its escalation
// (the next cooldown starts from the platform's own length).
const clearCooldownSQL = `
DELETE FROM fleetpace_cooldown c WHERE platform = $1
RETURNING platform, until, reason, count, started_at, GREATEST(until - now(), interval '0'), cause, retry_after_s`

// queuedJobsSQL is the fetch jobs the sources in $1 are queued for.
const queuedJobsSQL = `SELECT queued_job_id FROM fleetpace_source WHERE id = ANY($1::bigint[]) AND queued_job_id IS NOT NULL`

// countDisabledSQL counts the disabled sources among those in $1.
const countDisabledSQL = `SELECT count(*) FROM fleetpace_source WHERE id = ANY($1::bigint[]) AND NOT enabled`

// setKeyLimitSQL sets a key's own limits ($3 rate, $4 burst, $5
// max_in_flight; NULL: unchanged, for a new row the platform's) and returns
// them and whether the row is new. The schema's trigger brings the key's
// pace row, if any, in step.
const setKeyLimitSQL = `
INSERT INTO fleetpace_key_limit AS l (platform, key, rate, burst, max_in_flight)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (platform, key) DO UPDATE SET
    rate          = COALESCE(EXCLUDED.rate, l.rate),
    burst         = COALESCE(EXCLUDED.burst, l.burst),
    max_in_flight = COALESCE(EXCLUDED.max_in_flight, l.max_in_flight)
RETURNING l.rate, l.burst, l.max_in_flight, (xmax = 0)`

const deleteKeyLimitSQL = `DELETE FROM fleetpace_key_limit WHERE platform = $1 AND key = $2`

// keyStateColumns reads, for each key k.key of platform $1, what is in
// force (its pace row's settings when in use, else what its row would be
// made with: fleetpace_pace_key_settings), its own limits, and its pace
// row's state at n.now: hold left and why, the spacing of its last
// reservation, the announced spacing in force, its open leases.
const keyStateColumns = `
    k.key, COALESCE(s.rate, c.rate), COALESCE(s.burst, c.burst), COALESCE(s.max_in_flight, c.max_in_flight),
    l.key IS NOT NULL, l.rate, l.burst, l.max_in_flight, s.key IS NOT NULL,
    COALESCE(GREATEST(s.hold_until - n.now, 0), 0), COALESCE(s.hold_reason, ''), COALESCE(s.last_interval, 0),
    COALESCE(CASE WHEN n.now < s.announced_until THEN s.announced_interval END, 0),
    COALESCE((SELECT count(*) FROM unnest(s.leases) AS x WHERE x > n.now), 0)::int`

// listKeysSQL is a page of platform $1's keys after $2, at most $3: those
// with a pace row (in use) or limits of their own, in key order. Both
// tables are read by their primary key's range.
const listKeysSQL = `
WITH n AS (SELECT date_part('epoch', clock_timestamp()) AS now),
k AS (
    (SELECT key FROM fleetpace_pace WHERE platform = $1 AND key > $2 AND key <> '' ORDER BY key LIMIT $3)
    UNION
    (SELECT key FROM fleetpace_key_limit WHERE platform = $1 AND key > $2 ORDER BY key LIMIT $3)
    ORDER BY key LIMIT $3
)
SELECT ` + keyStateColumns + `
FROM k CROSS JOIN n
LEFT JOIN fleetpace_pace AS s ON s.platform = $1 AND s.key = k.key
LEFT JOIN fleetpace_key_limit AS l ON l.platform = $1 AND l.key = k.key
CROSS JOIN LATERAL fleetpace_pace_key_settings($1, k.key) AS c
ORDER BY k.key`

// keyStatsSQL aggregates every platform's keys from the pace rows: keys in
// use, held, slowed (paced more than $2 under their rate), their open
// leases and the platform's, and the top $1 keys under pressure (held,
// slowed or with open requests: held longest first, then slowed most, then
// most open), as parallel arrays. Platforms without keys in use and
// without a cap on open requests are left out.
const keyStatsSQL = `
WITH n AS (SELECT date_part('epoch', clock_timestamp()) AS now),
r AS (
    SELECT s.platform, s.key, s.rate, s.burst, s.max_in_flight,
           GREATEST(s.hold_until - n.now, 0) AS hold, s.hold_reason,
           COALESCE(LEAST(s.rate, 1 / NULLIF(GREATEST(s.last_interval,
               CASE WHEN n.now < s.announced_until THEN s.announced_interval ELSE 0 END), 0)), s.rate) AS eff,
           (SELECT count(*) FROM unnest(s.leases) AS x WHERE x > n.now)::int AS in_flight
    FROM fleetpace_pace AS s, n
),
f AS (
    SELECT r.*, r.key <> '' AND r.eff < r.rate * (1 - $2::float8) AS slowed FROM r
),
q AS (
    SELECT f.*, f.key <> '' AND (f.hold > 0 OR f.slowed OR f.in_flight > 0) AS pressed FROM f
),
g AS (
    SELECT q.*, row_number() OVER (PARTITION BY q.platform
        ORDER BY q.pressed DESC, q.hold DESC, q.eff / NULLIF(q.rate, 0), q.in_flight DESC, q.key) AS rank
    FROM q
)
SELECT g.platform,
       count(*) FILTER (WHERE g.key <> ''),
       count(*) FILTER (WHERE g.key <> '' AND g.hold > 0),
       count(*) FILTER (WHERE g.slowed),
       COALESCE(sum(g.in_flight) FILTER (WHERE g.key <> ''), 0),
       COALESCE(sum(g.in_flight) FILTER (WHERE g.key = ''), 0),
       COALESCE(array_agg(g.key ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}'),
       COALESCE(array_agg(g.rate ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}'),
       COALESCE(array_agg(g.burst ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}'),
       COALESCE(array_agg(g.max_in_flight ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}'),
       COALESCE(array_agg(g.hold ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}'),
       COALESCE(array_agg(g.hold_reason ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}'),
       COALESCE(array_agg(g.eff ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}'),
       COALESCE(array_agg(g.in_flight ORDER BY g.rank) FILTER (WHERE g.pressed AND g.rank <= $1), '{}')
FROM g
GROUP BY g.platform
HAVING count(*) FILTER (WHERE g.key <> '') > 0 OR bool_or(g.max_in_flight > 0)
ORDER BY g.platform`
