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

// platformNamesSQL lists the platforms that take new jobs now (neither
// cooling down nor paused): DueOptions' platforms.
var platformNamesSQL = `SELECT p.name FROM fleetpace_platform p WHERE NOT ` + sources.StoppedSQL("p.name") + ` ORDER BY p.name`

// planSQL reads, per platform, its rate, how many of its sources are
// queued, whether it is cooling down, whether an operator paused it and its
// per-key rate (0: none): the inputs of each platform's share. The pause is
// read from the pacer's row (fleetpace_pace, written only by package pacer)
// through sources.PausedSQL, the condition `sources list --due` and the
// status counts use too.
var planSQL = `
SELECT p.name, p.rate_per_sec, COALESCE(q.queued, 0),
       ` + sources.CoolingDownSQL("p.name") + `, ` + sources.PausedSQL("p.name") + `, p.key_rate
FROM fleetpace_platform p
LEFT JOIN (SELECT platform, count(*) AS queued FROM fleetpace_source
           WHERE queued_at IS NOT NULL GROUP BY platform) q ON q.platform = p.name
ORDER BY p.name`

// keyPlanSQL reads the keys whose share differs from their platform's
// per-key share: keys with queued sources on platforms that limit keys
// (fleetpace_platform.key_rate, or a rate in fleetpace_key_limit), and keys
// with a rate of their own. Each row: the platform, the key, its rate (as
// the pacer takes it, fleetpace_pace_key_settings: the key's own, else the
// platform's per-key rate; 0: the key is not limited apart from its
// platform) and how many of its sources are queued. Key "" is the
// platform's own and never limited apart. It reads the queued sources of
// platforms that limit keys only.
const keyPlanSQL = `
WITH keyed AS (
    SELECT name AS platform FROM fleetpace_platform WHERE key_rate > 0
    UNION
    SELECT platform FROM fleetpace_key_limit WHERE rate IS NOT NULL
),
q AS (
    SELECT s.platform, s.key, count(*) AS queued FROM fleetpace_source s
    WHERE s.queued_at IS NOT NULL AND s.key <> '' AND s.platform IN (SELECT platform FROM keyed)
    GROUP BY s.platform, s.key
),
l AS (SELECT platform, key, rate FROM fleetpace_key_limit WHERE key <> '' AND rate IS NOT NULL)
SELECT p.name, COALESCE(q.key, l.key), COALESCE(l.rate, p.key_rate), COALESCE(q.queued, 0)
FROM q FULL JOIN l ON l.platform = q.platform AND l.key = q.key
JOIN fleetpace_platform p ON p.name = COALESCE(q.platform, l.platform)`

// fairKey is a source's place in fair order, with the id as the tie-break:
// never checked first (-infinity), then longest since checked. It is the
// third column of fleetpace_source_key_fair_idx (platform, key, fair key,
// id), so a walk of one key from a place on is an index range.
const fairKey = `COALESCE(s.last_checked_at, '-infinity'::timestamptz)`

// refreshSQL brings the keys' heads in fleetpace_platform_due up to date, in
// one statement: it consumes the change log, lowers valid_until for keys
// whose sources fall due later, and recomputes the head of every key whose
// head may have moved (a change due now, or valid_until passed). A
// recomputation reads the key's first source in fair order; only when that
// one is not due does it walk on to the first due one and take the
// earliest due_at of the sources it passed (the head is valid until then).
// A key left with no enabled, unqueued source loses its row; a key seen for
// the first time gets one. It costs about a probe per key touched since the
// last tick, not per key or platform. It returns the platforms whose keys
// it changed: their own heads are refreshed next (refreshPlatformsSQL; a
// statement sees none of its own changes).
var refreshSQL = `
WITH change AS (DELETE FROM fleetpace_due_change RETURNING platform, key, due_at),
todo AS (
    SELECT platform, key, min(until) AS until FROM (
        SELECT platform, key, due_at FROM change
        UNION ALL
        SELECT platform, key, valid_until FROM fleetpace_platform_due WHERE per_key AND valid_until <= now()
    ) t (platform, key, until)
    GROUP BY platform, key
),
fresh AS (
    SELECT t.platform, t.key, t.until, t.until <= now() AS recompute,
           t.until <= now() AND f.id IS NULL AS empty,
           CASE WHEN f.due_at <= now() THEN f.k ELSE h.k END AS k,
           CASE WHEN f.due_at <= now() THEN f.id ELSE h.id END AS id,
           CASE WHEN f.due_at <= now() OR f.id IS NULL THEN 'infinity' ELSE u.due_at END AS valid_until
    FROM todo t
    LEFT JOIN LATERAL (
        SELECT ` + fairKey + ` AS k, s.id, s.due_at FROM fleetpace_source s
        WHERE t.until <= now() AND s.platform = t.platform AND s.key = t.key AND s.enabled AND s.queued_at IS NULL
        ORDER BY 1, 2 LIMIT 1) f ON true
    LEFT JOIN LATERAL (
        SELECT ` + fairKey + ` AS k, s.id FROM fleetpace_source s
        WHERE f.due_at > now() AND s.platform = t.platform AND s.key = t.key AND ` + sources.DueSQL + `
        ORDER BY 1, 2 LIMIT 1) h ON true
    LEFT JOIN LATERAL (
        SELECT min(p.due_at) AS due_at FROM (
            SELECT s.due_at FROM fleetpace_source s
            WHERE f.due_at > now() AND s.platform = t.platform AND s.key = t.key AND s.enabled AND s.queued_at IS NULL
              AND ` + fairKey + ` <= COALESCE(h.k, 'infinity')
              AND (h.id IS NULL OR (` + fairKey + `, s.id) < (h.k, h.id))
            ORDER BY ` + fairKey + `, s.id) p) u ON true
),
gone AS (
    DELETE FROM fleetpace_platform_due d USING fresh f
    WHERE d.per_key AND d.platform = f.platform AND d.key = f.key AND f.empty
    RETURNING d.platform
),
moved AS (
    UPDATE fleetpace_platform_due d SET
        head_key    = CASE WHEN f.recompute THEN f.k ELSE d.head_key END,
        head_id     = CASE WHEN f.recompute THEN f.id ELSE d.head_id END,
        valid_until = CASE WHEN f.recompute THEN f.valid_until ELSE LEAST(d.valid_until, f.until) END
    FROM fresh f
    WHERE d.per_key AND d.platform = f.platform AND d.key = f.key AND NOT f.empty
    RETURNING d.platform
),
added AS (
    INSERT INTO fleetpace_platform_due (platform, per_key, key, head_key, head_id, valid_until)
    SELECT f.platform, true, f.key,
           CASE WHEN f.recompute THEN f.k END, CASE WHEN f.recompute THEN f.id END,
           CASE WHEN f.recompute THEN f.valid_until ELSE f.until END
    FROM fresh f
    WHERE NOT f.empty
      AND NOT EXISTS (SELECT 1 FROM fleetpace_platform_due d WHERE d.per_key AND d.platform = f.platform AND d.key = f.key)
      AND EXISTS (SELECT 1 FROM fleetpace_platform p WHERE p.name = f.platform)
    RETURNING platform
)
SELECT DISTINCT platform FROM (
    SELECT platform FROM gone UNION ALL SELECT platform FROM moved UNION ALL SELECT platform FROM added
) x`

// refreshPlatformsSQL sets the head of each platform of $1 to the first of
// its keys' heads: one probe of fleetpace_platform_due_key_head_idx each.
const refreshPlatformsSQL = `
UPDATE fleetpace_platform_due d SET (head_key, head_id) = (
    SELECT k.head_key, k.head_id FROM fleetpace_platform_due k
    WHERE k.per_key AND k.platform = d.platform AND k.head_id IS NOT NULL
    ORDER BY k.head_key, k.head_id
    LIMIT 1)
WHERE NOT d.per_key AND d.platform = ANY($1::text[])`

// platformHeadsSQL reads the due query's candidates: the platforms of $1
// (those taking part: a cap > 0, not stopped) in the order of their heads,
// after the head ($2, $3), at most $4 of them — a walk of
// fleetpace_platform_due_platform_head_idx that stops at the limit, the
// membership in $1 tested by hashing (the plan is custom: $1 is a constant
// array). Each row: the platform and its head.
const platformHeadsSQL = `
SELECT d.platform, d.head_key, d.head_id FROM fleetpace_platform_due d
WHERE NOT d.per_key AND d.head_id IS NOT NULL
  AND (d.head_key, d.head_id) > ($2::timestamptz, $3::bigint)
  AND d.platform = ANY($1::text[])
ORDER BY d.head_key, d.head_id
LIMIT $4`

// keyWalk is the walk of one key's due sources in fair order, from after
// the place ({q}.k, {q}.id), at most {n} of them: an index range of
// fleetpace_source_key_fair_idx. {q} names the row giving the platform, key
// and place; {n} the count.
const keyWalk = `
    SELECT ` + fairKey + ` AS k, s.id FROM fleetpace_source s
    WHERE s.platform = {q}.platform AND s.key = {q}.key AND ` + sources.DueSQL + `
      AND (` + fairKey + `, s.id) > ({q}.k, {q}.id)
    ORDER BY 1, 2
    LIMIT {n}`

func walk(q, n string) string {
	return strings.NewReplacer("{q}", q, "{n}", n).Replace(keyWalk)
}

// dueReadSQL is one round of the due query's reads, for every platform and
// key that needs more:
//   - keys of platforms in head order ($1 the platforms, $2 and $3 the
//     head after which to read, $4 how many): a walk of
//     fleetpace_platform_due_key_head_idx, leaving out the keys $5/$6
//     (platforms and keys whose cap is spent; hashed). When a platform
//     has fewer keys than asked for, each key read is walked on too, far
//     enough for the platform to give as many sources as asked for
//     (ceil(n / keys) − 1 past its head): a platform of one key (key "")
//     gets its batch in the same round;
//   - further due sources of single keys ($7 the platforms, $8 the keys,
//     $9 and $10 the last source read, $11 how many).
//
// Each row: whether it is a key's head, the platform, the key, the source's
// fair key and id.
var dueReadSQL = `
WITH u AS (
    SELECT q.platform, q.n, x.key, x.k, x.id, count(*) OVER (PARTITION BY q.platform) AS got
    FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::int[]) AS q (platform, k, id, n)
    CROSS JOIN LATERAL (
        SELECT d.key, d.head_key AS k, d.head_id AS id FROM fleetpace_platform_due d
        WHERE d.per_key AND d.platform = q.platform AND d.head_id IS NOT NULL
          AND (d.head_key, d.head_id) > (q.k, q.id)
          AND (d.platform, d.key) NOT IN (SELECT z.platform, z.key FROM unnest($5::text[], $6::text[]) AS z (platform, key))
        ORDER BY d.head_key, d.head_id
        LIMIT q.n) x
)
SELECT true, u.platform, u.key, u.k, u.id FROM u
UNION ALL
SELECT false, u.platform, u.key, r.k, r.id FROM u
CROSS JOIN LATERAL (` + walk("u", "(u.n + u.got - 1) / u.got - 1") + `) r
WHERE u.got < u.n
UNION ALL
SELECT false, w.platform, w.key, r.k, r.id
FROM unnest($7::text[], $8::text[], $9::timestamptz[], $10::bigint[], $11::int[]) AS w (platform, key, k, id, n)
CROSS JOIN LATERAL (` + walk("w", "w.n") + `) r`

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
