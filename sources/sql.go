package sources

import (
	"fmt"
	"strings"
)

// Every SQL statement of the package lives here.

const setPlatformSQL = `
INSERT INTO fleetpace_platform (name, rate_per_sec, burst, max_multiplier, decay_after, cooldown,
                                backoff_factor, recovery_factor, probe, use_headers, respace)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
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
    updated_at      = now()`

const platformColumns = `name, rate_per_sec, burst, max_multiplier, decay_after, cooldown,
    backoff_factor, recovery_factor, probe, use_headers, respace`

const listPlatformsSQL = `SELECT ` + platformColumns + ` FROM fleetpace_platform ORDER BY name`

const getPlatformSQL = `SELECT ` + platformColumns + ` FROM fleetpace_platform WHERE name = $1`

const platformNamesSQL = `SELECT name FROM fleetpace_platform`

const addSourceSQL = `
WITH ins AS (
    INSERT INTO fleetpace_source (platform, url, check_interval)
    VALUES ($1, $2, $3)
    ON CONFLICT (platform, url) DO NOTHING
    RETURNING id
)
SELECT id, true FROM ins
UNION ALL
SELECT id, false FROM fleetpace_source WHERE platform = $1 AND url = $2 AND NOT EXISTS (SELECT 1 FROM ins)`

const sourceColumns = `id, platform, url, check_interval, enabled, due_at, last_checked_at,
    consecutive_failures, last_status, last_outcome, last_error, etag, last_modified,
    content_hash, queued_at, queued_job_id`

const listSourcesSQL = `
SELECT ` + sourceColumns + `
FROM fleetpace_source s
WHERE ($1 = '' OR s.platform = $1)
  AND (NOT $2 OR (s.enabled AND s.queued_at IS NULL AND s.due_at <= now()
                  AND NOT EXISTS (SELECT 1 FROM fleetpace_cooldown c
                                  WHERE c.platform = s.platform AND c.until > now())))
ORDER BY s.last_checked_at ASC NULLS FIRST, s.id
LIMIT $3`

const getSourceSQL = `SELECT ` + sourceColumns + ` FROM fleetpace_source WHERE id = $1`

const removeSourcesSQL = `DELETE FROM fleetpace_source WHERE id = ANY($1) RETURNING id`

const importTempTableSQL = `
CREATE TEMP TABLE fleetpace_import (
    platform       text     NOT NULL,
    url            text     NOT NULL,
    check_interval interval NOT NULL
) ON COMMIT DROP`

const importInsertSQL = `
INSERT INTO fleetpace_source (platform, url, check_interval)
SELECT platform, url, check_interval FROM fleetpace_import
ON CONFLICT (platform, url) DO NOTHING`

// tickLockKey is the transaction-scoped advisory lock a scan tick takes, so
// overlapping ticks (cron plus workers) do not both scan.
const tickLockKey int64 = 0x2f1e_7ac3_5d90_4b62

const tryTickLockSQL = `SELECT pg_try_advisory_xact_lock($1), ` + useGenericPlan

// useGenericPlan makes the rest of the transaction use generic plans for
// prepared statements. The due query has an arm per platform: planning it
// afresh for every execution (PostgreSQL's choice for it, since the custom
// plan's estimate is lower) costs more than running it (3–4 ms against 2–3
// ms at 20 platforms); the generic plan is the same Merge Append.
const useGenericPlan = `set_config('plan_cache_mode', 'force_generic_plan', true)`

const platformNamesGenericSQL = `SELECT name FROM fleetpace_platform, ` + useGenericPlan + ` ORDER BY name`

// planSQL reads, per platform, its rate, how many of its sources are queued
// and whether it is cooling down: the inputs of each platform's share.
const planSQL = `
SELECT p.name, p.rate_per_sec, COALESCE(q.queued, 0), c.until
FROM fleetpace_platform p
LEFT JOIN (SELECT platform, count(*) AS queued FROM fleetpace_source
           WHERE queued_at IS NOT NULL GROUP BY platform) q ON q.platform = p.name
LEFT JOIN fleetpace_cooldown c ON c.platform = p.name AND c.until > now()
ORDER BY p.name`

// dueSQL builds the due query for n platforms. Each arm walks
// fleetpace_source_due_idx for one platform in fair order, already capped
// (LIMIT) at that platform's share and skipped entirely while the platform
// cools down; the arms are merged in the same order (PostgreSQL's Merge
// Append reads each arm only as far as the overall LIMIT needs). Arguments:
// $1 overall limit, then per arm its platform and cap. Only the number of
// arms varies; every value is a parameter.
func dueSQL(n int) string {
	var b strings.Builder
	b.WriteString("SELECT id, platform, url FROM (\n")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString("    UNION ALL\n")
		}
		p, c := 2+2*i, 3+2*i
		fmt.Fprintf(&b, `    (SELECT id, platform, url, last_checked_at FROM fleetpace_source
      WHERE platform = $%[1]d AND enabled AND queued_at IS NULL AND due_at <= now()
        AND NOT EXISTS (SELECT 1 FROM fleetpace_cooldown c WHERE c.platform = $%[1]d AND c.until > now())
      ORDER BY last_checked_at ASC NULLS FIRST, id
      LIMIT $%[2]d)
`, p, c)
	}
	b.WriteString(") d\nORDER BY last_checked_at ASC NULLS FIRST, id\nLIMIT $1")
	return b.String()
}

// claimSQL locks the sources to enqueue that are enabled and not queued yet.
// Row locks (taken in id order, so concurrent claims cannot deadlock) make a
// concurrent claim wait and then skip rows this one queued: a source is never
// queued twice. Locking instead of updating here saves a second rewrite of
// every row: markQueuedSQL writes queued_at and the job id in one update.
const claimSQL = `
SELECT id, platform, url, COALESCE(etag, ''), COALESCE(last_modified, '') FROM fleetpace_source
WHERE id = ANY($1) AND queued_at IS NULL AND enabled
ORDER BY id
FOR UPDATE`

const markQueuedSQL = `
UPDATE fleetpace_source s SET queued_at = now(), queued_job_id = j.job_id
FROM unnest($1::bigint[], $2::bigint[]) AS j(source_id, job_id)
WHERE s.id = j.source_id`

// reconcileSQL releases sources whose job finished without recording a check
// (discarded after its last attempt, cancelled, deleted), so they can be
// queued again. Sources queued in the last minute are left alone.
const reconcileSQL = `
UPDATE fleetpace_source s SET queued_at = NULL, queued_job_id = NULL
WHERE s.queued_at IS NOT NULL
  AND s.queued_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM river_job j
                  WHERE j.id = s.queued_job_id
                    AND j.state NOT IN ('completed', 'discarded', 'cancelled'))`

// recordCheckSQL records a fetch outcome and releases the source.
//   - ok, not_modified: checked now; failures reset; next due after the interval.
//   - failed: checked now; failures + 1; next due after interval × 2^failures,
//     capped at 64 × interval and at max(interval, 24 h).
//   - rate_pressure, rate_limited: not a check and not a failure; the source
//     keeps its place in the fair order and is due again at once (cooldowns
//     and the pacer decide when it actually runs).
//
// $8 is the job that made the check (0: unknown). If the source has been
// queued since for another job (released by the tick's reconciliation while
// this check was on its way), nothing is written: that job checks it.
const recordCheckSQL = `
UPDATE fleetpace_source SET
    queued_at            = NULL,
    queued_job_id        = NULL,
    last_status          = $3,
    last_outcome         = $2,
    last_error           = NULLIF($4, ''),
    etag                 = CASE WHEN $2 = 'ok' THEN NULLIF($5, '') ELSE etag END,
    last_modified        = CASE WHEN $2 = 'ok' THEN NULLIF($6, '') ELSE last_modified END,
    content_hash         = CASE WHEN $2 = 'ok' AND $7 <> '' THEN $7 ELSE content_hash END,
    last_checked_at      = CASE WHEN $2 IN ('ok', 'not_modified', 'failed') THEN now() ELSE last_checked_at END,
    consecutive_failures = CASE $2 WHEN 'failed' THEN consecutive_failures + 1
                                   WHEN 'ok' THEN 0 WHEN 'not_modified' THEN 0
                                   ELSE consecutive_failures END,
    due_at = CASE
        WHEN $2 IN ('ok', 'not_modified') THEN now() + check_interval
        WHEN $2 = 'failed' THEN now() + LEAST(
            check_interval * power(2, LEAST(consecutive_failures + 1, 6)),
            GREATEST(check_interval, interval '24 hours'))
        ELSE now() END
WHERE id = $1
  AND ($8::bigint = 0 OR queued_job_id IS NULL OR queued_job_id = $8)`

// recordChecksSQL is recordCheckSQL for many sources in one statement: the
// same rules, row by row, with the i-th element of each array as that
// source's $1…$7. The ids must be distinct (with a duplicate, UPDATE … FROM
// would apply one of its rows, unspecified which).
const recordChecksSQL = `
UPDATE fleetpace_source s SET
    queued_at            = NULL,
    queued_job_id        = NULL,
    last_status          = r.status,
    last_outcome         = r.outcome,
    last_error           = NULLIF(r.error, ''),
    etag                 = CASE WHEN r.outcome = 'ok' THEN NULLIF(r.etag, '') ELSE s.etag END,
    last_modified        = CASE WHEN r.outcome = 'ok' THEN NULLIF(r.last_modified, '') ELSE s.last_modified END,
    content_hash         = CASE WHEN r.outcome = 'ok' AND r.content_hash <> '' THEN r.content_hash ELSE s.content_hash END,
    last_checked_at      = CASE WHEN r.outcome IN ('ok', 'not_modified', 'failed') THEN now() ELSE s.last_checked_at END,
    consecutive_failures = CASE r.outcome WHEN 'failed' THEN s.consecutive_failures + 1
                                          WHEN 'ok' THEN 0 WHEN 'not_modified' THEN 0
                                          ELSE s.consecutive_failures END,
    due_at = CASE
        WHEN r.outcome IN ('ok', 'not_modified') THEN now() + s.check_interval
        WHEN r.outcome = 'failed' THEN now() + LEAST(
            s.check_interval * power(2, LEAST(s.consecutive_failures + 1, 6)),
            GREATEST(s.check_interval, interval '24 hours'))
        ELSE now() END
FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[])
    AS r(id, outcome, status, error, etag, last_modified, content_hash, job_id)
WHERE s.id = r.id
  AND (r.job_id = 0 OR s.queued_job_id IS NULL OR s.queued_job_id = r.job_id)`

const releaseSQL = `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL WHERE id = $1`

// setCooldownSQL upserts a platform's cooldown. $2 is the Retry-After in
// seconds (0 if none), $3 the jitter factor (1 ± 0.1), $4 the reason.
//   - While a cooldown is active, another rate-limited answer (likely from a
//     request sent before it began) only extends it to the longer of the two.
//   - A repeat within one platform cooldown after the last one ended doubles
//     the duration (count + 1); later, it starts again from count 1.
//   - Duration = max(platform cooldown, Retry-After) × 2^(count−1) × jitter,
//     capped at 24 h.
//
// The cooldown also becomes a fleet-wide hold of the platform's pacer row
// (fleetpace_pace.hold_until), so a fetch job already queued meets it in its
// reservation (denied, snoozed until the end) without a query of its own.
const setCooldownSQL = `
WITH p AS (
    SELECT name, GREATEST(cooldown, make_interval(secs => $2)) AS base, cooldown
    FROM fleetpace_platform WHERE name = $1
), cd AS (
INSERT INTO fleetpace_cooldown AS c (platform, until, reason, count, started_at, updated_at)
SELECT p.name, now() + LEAST(p.base * $3, interval '24 hours'), $4, 1, now(), now() FROM p
ON CONFLICT (platform) DO UPDATE SET
    count = CASE
        WHEN c.until > now() THEN c.count
        WHEN c.until + (SELECT cooldown FROM p) > now() THEN c.count + 1
        ELSE 1 END,
    until = CASE
        WHEN c.until > now() THEN GREATEST(c.until,
            now() + LEAST((SELECT base FROM p) * power(2, c.count - 1) * $3, interval '24 hours'))
        WHEN c.until + (SELECT cooldown FROM p) > now() THEN
            now() + LEAST((SELECT base FROM p) * power(2, c.count) * $3, interval '24 hours')
        ELSE now() + LEAST((SELECT base FROM p) * $3, interval '24 hours') END,
    reason = EXCLUDED.reason,
    started_at = CASE WHEN c.until > now() THEN c.started_at ELSE now() END,
    updated_at = now()
RETURNING platform, until, count
), hold AS (
    UPDATE fleetpace_pace SET hold_until = GREATEST(hold_until, EXTRACT(EPOCH FROM cd.until)::float8)
    FROM cd WHERE fleetpace_pace.platform = cd.platform
)
SELECT until, count FROM cd`

const activeCooldownsSQL = `
SELECT platform, until, reason, count, started_at, until - now()
FROM fleetpace_cooldown WHERE until > now() ORDER BY platform`

// countsSQL is the per-platform summary for status: sources, enabled, queued,
// due now, never checked, and how late the due ones are (max, p95).
const countsSQL = `
SELECT p.name,
       count(s.id),
       count(s.id) FILTER (WHERE s.enabled),
       count(s.id) FILTER (WHERE s.queued_at IS NOT NULL),
       count(s.id) FILTER (WHERE s.enabled AND s.queued_at IS NULL AND s.due_at <= now()),
       count(s.id) FILTER (WHERE s.last_checked_at IS NULL),
       COALESCE(EXTRACT(EPOCH FROM max(now() - s.due_at) FILTER (WHERE s.enabled AND s.due_at <= now())), 0)::float8,
       COALESCE(percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM now() - s.due_at))
                FILTER (WHERE s.enabled AND s.due_at <= now()), 0)::float8
FROM fleetpace_platform p
LEFT JOIN fleetpace_source s ON s.platform = p.name
GROUP BY p.name
ORDER BY p.name`

const platformSourceIDsSQL = `
SELECT id FROM fleetpace_source
WHERE platform = $1 AND enabled AND queued_at IS NULL
ORDER BY last_checked_at ASC NULLS FIRST, id`
