package scan

import (
	"strings"

	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

// Every SQL statement of the package lives here. The scan reads the store's
// tables (package sources) and writes only the queue mark of a source
// (queued_at, queued_job_id): it sets it in the transaction that inserts
// the source's River job, and takes it back from sources whose job finished
// without a check. Recording a check clears it (package sources). It also
// keeps each platform's head in fleetpace_platform_due, from the change log
// the schema's triggers write (fleetpace_due_change).

// tickLockKey is the transaction-scoped advisory lock a scan tick takes, so
// overlapping ticks (cron plus workers) do not both scan.
const tickLockKey int64 = 0x2f1e_7ac3_5d90_4b62

const tryTickLockSQL = `SELECT pg_try_advisory_xact_lock($1), ` + tickSettings

// tickLockSQL waits for the tick lock: the due query refreshes the heads
// only while holding it (a tick holds it already).
const tickLockSQL = `SELECT pg_advisory_xact_lock($1), ` + tickSettings

// tickSettings are the planner settings of a tick's transaction. Custom
// plans: the due query's arguments are arrays, one element per platform,
// and only a plan made for the actual arrays (thousands of platforms: hash
// joins; twenty: nested loops) fits both; planning costs a few ms. No JIT:
// the estimated cost of a walk per platform easily passes jit_above_cost,
// and compiling costs far more than the statements take to run.
const tickSettings = `set_config('plan_cache_mode', 'force_custom_plan', true), set_config('jit', 'off', true)`

const platformNamesSQL = `SELECT name FROM fleetpace_platform ORDER BY name`

// planSQL reads, per platform, its rate, how many of its sources are queued,
// whether it is cooling down and whether an operator paused it: the inputs
// of each platform's share. The pause is read from the pacer's row
// (fleetpace_pace, written only by package pacer) through
// sources.PausedSQL, the condition `sources list --due` and the status
// counts use too.
var planSQL = `
SELECT p.name, p.rate_per_sec, COALESCE(q.queued, 0),
       ` + sources.CoolingDownSQL("p.name") + `, ` + sources.PausedSQL("p.name") + `
FROM fleetpace_platform p
LEFT JOIN (SELECT platform, count(*) AS queued FROM fleetpace_source
           WHERE queued_at IS NOT NULL GROUP BY platform) q ON q.platform = p.name
ORDER BY p.name`

// fairKey is a source's place in fair order, with the id as the tie-break:
// never checked first (-infinity), then longest since checked. It is the
// second column of fleetpace_source_fair_idx, so a walk from a key and up to
// a bound is an index range.
const fairKey = `COALESCE(s.last_checked_at, '-infinity'::timestamptz)`

// refreshSQL brings the heads in fleetpace_platform_due up to date, in one
// statement: it consumes the change log, lowers valid_until for sources that
// fall due later, and recomputes the head of every platform whose head may
// have moved (a change due now, or valid_until passed). A recomputation
// reads the platform's first source in fair order; only when that one is not
// due does it walk on to the first due one and take the earliest due_at of
// the sources it passed (the head is valid until then). It costs about a
// probe per platform touched since the last tick, not per platform.
var refreshSQL = `
WITH change AS (DELETE FROM fleetpace_due_change RETURNING platform, due_at),
todo AS (
    SELECT platform, min(until) AS until FROM (
        SELECT platform, due_at FROM change
        UNION ALL
        SELECT platform, valid_until FROM fleetpace_platform_due WHERE valid_until <= now()
    ) t (platform, until)
    GROUP BY platform
),
fresh AS (
    SELECT t.platform, t.until, t.until <= now() AS recompute,
           CASE WHEN f.due_at <= now() THEN f.k ELSE h.k END AS k,
           CASE WHEN f.due_at <= now() THEN f.id ELSE h.id END AS id,
           CASE WHEN f.due_at <= now() OR f.id IS NULL THEN 'infinity' ELSE u.due_at END AS valid_until
    FROM todo t
    LEFT JOIN LATERAL (
        SELECT ` + fairKey + ` AS k, s.id, s.due_at FROM fleetpace_source s
        WHERE t.until <= now() AND s.platform = t.platform AND s.enabled AND s.queued_at IS NULL
        ORDER BY 1, 2 LIMIT 1) f ON true
    LEFT JOIN LATERAL (
        SELECT ` + fairKey + ` AS k, s.id FROM fleetpace_source s
        WHERE f.due_at > now() AND s.platform = t.platform AND ` + sources.DueSQL + `
        ORDER BY 1, 2 LIMIT 1) h ON true
    LEFT JOIN LATERAL (
        SELECT min(p.due_at) AS due_at FROM (
            SELECT s.due_at FROM fleetpace_source s
            WHERE f.due_at > now() AND s.platform = t.platform AND s.enabled AND s.queued_at IS NULL
              AND ` + fairKey + ` <= COALESCE(h.k, 'infinity')
              AND (h.id IS NULL OR (` + fairKey + `, s.id) < (h.k, h.id))
            ORDER BY ` + fairKey + `, s.id) p) u ON true
)
UPDATE fleetpace_platform_due d SET
    head_key    = CASE WHEN f.recompute THEN f.k ELSE d.head_key END,
    head_id     = CASE WHEN f.recompute THEN f.id ELSE d.head_id END,
    valid_until = CASE WHEN f.recompute THEN f.valid_until ELSE LEAST(d.valid_until, f.until) END
FROM fresh f
WHERE d.platform = f.platform`

// dueFetch is the walk of one platform's due sources in fair order, from
// after (key, id) q.k, q.id up to the bound key $bound, at most q.n of them:
// an index range of fleetpace_source_fair_idx. {bound} names the bound.
const dueFetch = `
    SELECT ` + fairKey + ` AS k, s.id, s.url FROM fleetpace_source s
    WHERE s.platform = q.platform AND ` + sources.DueSQL + `
      AND (` + fairKey + `, s.id) > (q.k, q.id)
      AND ` + fairKey + ` <= {bound}
    ORDER BY 1, 2
    LIMIT q.n`

// dueFirstSQL is the due query's first round. The candidates are the
// platforms with the $1 earliest heads (with a cap > 0, not cooling down):
// the first $1 sources in fair order come from them alone, and none comes
// after the last candidate's head when there are $1 of them (each candidate
// brings at least its head). From each candidate it reads a batch of due
// sources from its head on. Arguments: $1 the overall limit, $2 and $3 the
// platforms and their caps. Each row: the platform, its cap (at most $1),
// the batch read, the bound, and a source (NULL if none).
var dueFirstSQL = `
WITH cand AS (
    SELECT d.platform, LEAST(c.cap, $1) AS cap, d.head_key, d.head_id
    FROM fleetpace_platform_due d
    JOIN unnest($2::text[], $3::int[]) AS c (platform, cap) ON c.platform = d.platform
    WHERE d.head_id IS NOT NULL AND c.cap > 0
      AND NOT ` + sources.StoppedSQL("d.platform") + `
    ORDER BY d.head_key, d.head_id
    LIMIT $1
),
b AS MATERIALIZED (
    SELECT CASE WHEN count(*) = $1 THEN max(head_key) ELSE 'infinity' END AS bound,
           GREATEST(2, ceil(2.0 * $1 / GREATEST(count(*), 1)))::int AS batch
    FROM cand
),
q AS (
    SELECT cand.platform, cand.cap, b.bound, b.batch, cand.head_key AS k, cand.head_id - 1 AS id,
           LEAST(cand.cap, b.batch) AS n
    FROM cand, b
)
SELECT q.platform, q.cap, q.n, q.bound, r.k, r.id, r.url
FROM q LEFT JOIN LATERAL (` + strings.ReplaceAll(dueFetch, "{bound}", "q.bound") + `) r ON true`

// dueMoreSQL reads further due sources of some platforms: $1 the platforms,
// $2 and $3 the key and id of the last source read from each, $4 how many
// more, $5 the bound.
var dueMoreSQL = `
SELECT q.platform, r.k, r.id, r.url
FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::int[]) AS q (platform, k, id, n)
CROSS JOIN LATERAL (` + strings.ReplaceAll(dueFetch, "{bound}", "$5::timestamptz") + `) r`

// claimSQL locks the sources to enqueue that are enabled and not queued yet.
// Row locks (taken in id order, so concurrent claims cannot deadlock) make a
// concurrent claim wait and then skip rows this one queued: a source is never
// queued twice. Locking instead of updating here saves a second rewrite of
// every row: markQueuedSQL writes queued_at and the job id in one update.
const claimSQL = `
SELECT id, platform, key, url, COALESCE(etag, ''), COALESCE(last_modified, '') FROM fleetpace_source
WHERE id = ANY($1) AND queued_at IS NULL AND enabled
ORDER BY id
FOR UPDATE`

const markQueuedSQL = `
UPDATE fleetpace_source s SET queued_at = now(), queued_job_id = j.job_id
FROM unnest($1::bigint[], $2::bigint[]) AS j(source_id, job_id)
WHERE s.id = j.source_id`

// reconcileSQL releases sources whose job finished without recording a check
// (discarded after its last attempt, cancelled, deleted), so they can be
// queued again. Sources queued in the last minute are left alone. One
// statement: River's job states come from package queue's relation of
// unfinished jobs (an anti-join on river_job's primary key).
const reconcileSQL = `
UPDATE fleetpace_source s SET queued_at = NULL, queued_job_id = NULL
WHERE s.queued_at IS NOT NULL
  AND s.queued_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM ` + queue.UnfinishedJobsSQL + ` j WHERE j.id = s.queued_job_id)`

const platformSourceIDsSQL = `
SELECT s.id FROM fleetpace_source s
WHERE s.platform = $1 AND s.enabled AND s.queued_at IS NULL
ORDER BY ` + fairKey + `, s.id`
