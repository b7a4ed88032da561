package sources

import "strings"

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

// DueSQL is the condition "source s is due now": enabled, not queued, and
// past its due_at. It is written once, here, for every statement that asks
// it: `sources list --due`, the status counts and the scan's due query
// (package scan), each aliasing fleetpace_source as s. The partial index
// fleetpace_source_due_idx holds exactly the enabled, unqueued sources.
const DueSQL = `s.enabled AND s.queued_at IS NULL AND s.due_at <= now()`

// CoolingDownSQL returns the condition "the platform named by the SQL
// expression platform is cooling down now". platform is an expression of
// the caller's statement (a column such as s.platform, or a parameter such as
// $2), never input.
func CoolingDownSQL(platform string) string {
	return `EXISTS (SELECT 1 FROM fleetpace_cooldown c WHERE c.platform = ` + platform + ` AND ` + activeCooldown + `)`
}

// activeCooldown is the condition "cooldown c has not ended".
const activeCooldown = `c.until > now()`

var listSourcesSQL = `
SELECT ` + sourceColumns + `
FROM fleetpace_source s
WHERE ($1 = '' OR s.platform = $1)
  AND (NOT $2 OR (` + DueSQL + ` AND NOT ` + CoolingDownSQL("s.platform") + `))
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

// recordSQL builds the statement that records checks, one definition for
// both forms (one check, a batch), so they cannot drift apart. The rules:
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
// v names the check's values in the statement; from adds the batch's rows.
func recordSQL(v checkValues, from string) string {
	return strings.NewReplacer(
		"{id}", v.id, "{outcome}", v.outcome, "{status}", v.status, "{error}", v.error, "{etag}", v.etag,
		"{last_modified}", v.lastModified, "{content_hash}", v.contentHash, "{job}", v.job, "{from}", from,
	).Replace(`
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
  AND ({job} = 0 OR s.queued_job_id IS NULL OR s.queued_job_id = {job})`)
}

// checkValues are the SQL expressions of one check's values.
type checkValues struct {
	id, outcome, status, error, etag, lastModified, contentHash, job string
}

// recordCheckSQL records one check: $1 the source, $2…$7 outcome, status,
// error, etag, last_modified, content_hash, $8 the job.
var recordCheckSQL = recordSQL(checkValues{"$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8::bigint"}, "")

// recordChecksSQL records many checks in one statement: the same rules, row
// by row, the i-th element of each array being that source's $1…$8. The ids
// must be distinct (with a duplicate, UPDATE … FROM would apply one of its
// rows, unspecified which).
var recordChecksSQL = recordSQL(checkValues{"r.id", "r.outcome", "r.status", "r.error", "r.etag", "r.last_modified", "r.content_hash", "r.job_id"}, `
FROM unnest($1::bigint[], $2::text[], $3::integer[], $4::text[], $5::text[], $6::text[], $7::text[], $8::bigint[])
    AS r(id, outcome, status, error, etag, last_modified, content_hash, job_id)`)

const releaseSQL = `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL WHERE id = $1`

// setCooldownSQL upserts a platform's cooldown. $2 is the Retry-After in
// seconds (0 if none), $3 the jitter factor (1 ± 0.1), $4 the reason.
//   - While a cooldown is active, another rate-limited answer (likely from a
//     request sent before it began) only extends it to the longer of the two.
//   - A repeat within one platform cooldown after the last one ended doubles
//     the duration (count + 1); later, it starts again from count 1.
//   - Duration = max(platform cooldown, Retry-After) × 2^(count−1) × jitter,
//     capped at 24 h.
const setCooldownSQL = `
WITH p AS (
    SELECT name, GREATEST(cooldown, make_interval(secs => $2)) AS base, cooldown
    FROM fleetpace_platform WHERE name = $1
)
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
RETURNING until, count`

const activeCooldownsSQL = `
SELECT platform, until, reason, count, started_at, until - now()
FROM fleetpace_cooldown c WHERE ` + activeCooldown + ` ORDER BY platform`

// countsSQL is the per-platform summary for status: sources, enabled, queued,
// due now, never checked, and how late the due ones are (max, p95).
const countsSQL = `
SELECT p.name,
       count(s.id),
       count(s.id) FILTER (WHERE s.enabled),
       count(s.id) FILTER (WHERE s.queued_at IS NOT NULL),
       count(s.id) FILTER (WHERE ` + DueSQL + `),
       count(s.id) FILTER (WHERE s.last_checked_at IS NULL),
       COALESCE(EXTRACT(EPOCH FROM max(now() - s.due_at) FILTER (WHERE s.enabled AND s.due_at <= now())), 0)::float8,
       COALESCE(percentile_cont(0.95) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM now() - s.due_at))
                FILTER (WHERE s.enabled AND s.due_at <= now()), 0)::float8
FROM fleetpace_platform p
LEFT JOIN fleetpace_source s ON s.platform = p.name
GROUP BY p.name
ORDER BY p.name`
