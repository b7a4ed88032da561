package scan

import "strings"

// Every SQL statement of the package lives here. The scan reads the store's
// tables (package sources) and writes only the queue mark of a source
// (queued_at, queued_job_id): it sets it in the transaction that inserts
// the source's River job, and takes it back from sources whose job finished
// without a check. Recording a check clears it (package sources). It also
// keeps each key's head, and each platform's first key, in
// fleetpace_platform_due, from the change log the schema's triggers write
// (fleetpace_due_change).

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

// platformNamesSQL lists the platforms and whether each is stopped
// (cooling down or paused): DueOptions' platforms.
const platformNamesSQL = `SELECT platform, stopped FROM fleetpace_platform_stop ORDER BY platform`

// planSQL reads, per platform, its rate, how many of its sources are
// queued, whether it is cooling down, whether an operator paused it and its
// per-key rate (0: none): the inputs of each platform's share. The pause is
// read from the pacer's row through the schema's fleetpace_platform_stop,
// which `sources list --due` and the status counts read too.
const planSQL = `
SELECT p.name, p.rate_per_sec, COALESCE(q.queued, 0), st.cooling_down, st.paused, p.key_rate
FROM fleetpace_platform p
JOIN fleetpace_platform_stop st ON st.platform = p.name
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
// platform's own and never limited apart. It reads queued sources only
// when a platform limits keys (a one-time test: the queued sources' keys
// are not in fleetpace_source_queued_at_idx, so reading them costs a heap
// fetch each, ~50,000 at 10,000,000 sources), and counts those of such
// platforms.
const keyPlanSQL = `
WITH keyed AS (
    SELECT name AS platform FROM fleetpace_platform WHERE key_rate > 0
    UNION
    SELECT platform FROM fleetpace_key_limit WHERE rate IS NOT NULL
),
q AS (
    SELECT s.platform, s.key, count(*) AS queued FROM fleetpace_source s
    WHERE EXISTS (SELECT 1 FROM keyed)
      AND s.queued_at IS NOT NULL AND s.key <> '' AND s.platform IN (SELECT platform FROM keyed)
    GROUP BY s.platform, s.key
),
l AS (SELECT platform, key, rate FROM fleetpace_key_limit WHERE key <> '' AND rate IS NOT NULL)
SELECT p.name, COALESCE(q.key, l.key), COALESCE(l.rate, p.key_rate), COALESCE(q.queued, 0)
FROM q FULL JOIN l ON l.platform = q.platform AND l.key = q.key
JOIN fleetpace_platform p ON p.name = COALESCE(q.platform, l.platform)`

// fairKey is a source's place in fair order, with the id as the tie-break:
// never checked first (-infinity), then longest since checked. It is the
// third column of fleetpace_source_key_due_idx (platform, key, fair key,
// id, due_at), so a walk of one key from a place on is an index range (and
// due_at <= now() an index condition on it).
const fairKey = `COALESCE(s.last_checked_at, '-infinity'::timestamptz)`

// refreshSQL brings the heads in fleetpace_platform_due up to date, in one
// statement, and returns how many keys' rows it added or removed and the
// planner's row count of the table.
//
// It consumes the change log, lowers valid_until for keys whose sources
// fall due later (unless every one of them comes after the key's head in
// fair order: a source just checked cannot become the head), and
// recomputes the head of every key whose head may have moved (a change due
// now, or valid_until passed): its first source in fair order; only when
// that one is not due does it walk on to the first due one and take the
// earliest due_at of the sources it passed (the head is valid until then). A key left with no enabled, unqueued source loses
// its row; a key seen for the first time gets one if it has such a source
// (its first one is looked for: a change logged for a source that left
// again unlogged — a source not due yet, deleted or queued before the
// refresh — or one left in the log from before a truncation would give a
// key with no source a row until the change's due_at).
//
// Then every platform of those keys whose head moved (or that were added
// or removed) gets its first key again (first): the key with the least of
// the heads just computed and of the head of its first key not touched (a
// statement sees none of its own changes, so the keys just written are
// skipped in fleetpace_platform_due_key_head_idx). The key marked before
// is the first of that index (as it stood), so a platform of one key,
// whose key stays first, costs no row but its key's. A platform none of
// whose heads moved keeps its first key: a check (a source last checked
// now, due later) or a head whose validity only shortens costs its key's
// probe alone, and a row read and written only when its validity changes.
//
// It costs a few probes per key touched since the last tick and two per
// platform whose first key may have changed, never a pass over every key
// or platform: every row
// is found by a lateral probe of an index (LIMIT 1 keeps the planner from
// turning it into a join, which it did, hashing all 100,000 keys' rows:
// 50 ms) and written through its ctid, fetched by TID (a join on the keys
// became a hash of the whole table too).
var refreshSQL = `
WITH change AS (DELETE FROM fleetpace_due_change RETURNING platform, key, due_at, fair_key),
todo AS (
    SELECT platform, key, min(until) AS until, min(fair) AS fair, bool_or(fair IS NULL) AS unknown FROM (
        SELECT platform, key, due_at, fair_key FROM change
        UNION ALL
        SELECT platform, key, valid_until, NULL FROM fleetpace_platform_due
        WHERE valid_until < 'infinity' AND valid_until <= now()
    ) t (platform, key, until, fair)
    GROUP BY platform, key
),
fresh AS (
    SELECT t.platform, t.key, c.row, c.head_key AS was_k, c.head_id AS was_id, c.valid_until AS was_until,
           (t.until <= now() OR c.row IS NULL) AND f.id IS NULL AS empty,
           CASE WHEN t.until > now() THEN c.head_key WHEN f.due_at <= now() THEN f.k ELSE h.k END AS k,
           CASE WHEN t.until > now() THEN c.head_id WHEN f.due_at <= now() THEN f.id ELSE h.id END AS id,
           CASE WHEN t.until > now() AND c.head_id IS NOT NULL AND NOT t.unknown AND t.fair > c.head_key THEN c.valid_until
                WHEN t.until > now() THEN LEAST(c.valid_until, t.until)
                WHEN f.due_at <= now() OR f.id IS NULL THEN 'infinity'
                ELSE u.due_at END AS valid_until
    FROM todo t
    LEFT JOIN LATERAL (
        SELECT d.ctid AS row, d.head_key, d.head_id, d.valid_until FROM fleetpace_platform_due d
        WHERE d.platform = t.platform AND d.key = t.key
        LIMIT 1) c ON true
    LEFT JOIN LATERAL (
        SELECT ` + fairKey + ` AS k, s.id, s.due_at FROM fleetpace_source s
        WHERE (t.until <= now() OR c.row IS NULL) AND s.platform = t.platform AND s.key = t.key AND s.enabled AND s.queued_at IS NULL
        ORDER BY 1, 2 LIMIT 1) f ON true
    LEFT JOIN LATERAL (
        SELECT ` + fairKey + ` AS k, s.id FROM fleetpace_due_source s
        WHERE t.until <= now() AND f.due_at > now() AND s.platform = t.platform AND s.key = t.key
        ORDER BY 1, 2 LIMIT 1) h ON true
    LEFT JOIN LATERAL (
        SELECT min(p.due_at) AS due_at FROM (
            SELECT s.due_at FROM fleetpace_source s
            WHERE t.until <= now() AND f.due_at > now() AND s.platform = t.platform AND s.key = t.key AND s.enabled AND s.queued_at IS NULL
              AND ` + fairKey + ` <= COALESCE(h.k, 'infinity')
              AND (h.id IS NULL OR (` + fairKey + `, s.id) < (h.k, h.id))
            ORDER BY ` + fairKey + `, s.id) p) u ON true
),
least AS (
    SELECT DISTINCT ON (platform) platform, CASE WHEN NOT empty THEN key END AS key,
           CASE WHEN NOT empty THEN k END AS k, CASE WHEN NOT empty THEN id END AS id
    FROM fresh
    WHERE platform IN (SELECT platform FROM fresh
                       WHERE (CASE WHEN NOT empty THEN k END, CASE WHEN NOT empty THEN id END)
                             IS DISTINCT FROM (was_k, was_id))
    ORDER BY platform, empty OR id IS NULL, k, id
),
firsts AS (
    SELECT l.platform, w.row AS was_row, w.key AS was_key, o.row AS other_row, o.key AS other_key,
           CASE WHEN l.id IS NULL OR (o.id IS NOT NULL AND (o.k, o.id) < (l.k, l.id)) THEN o.key ELSE l.key END AS key
    FROM least l
    LEFT JOIN LATERAL (
        SELECT d.ctid AS row, d.key FROM fleetpace_platform_due d
        WHERE d.platform = l.platform AND d.head_id IS NOT NULL
        ORDER BY d.head_key, d.head_id
        LIMIT 1) w ON true
    LEFT JOIN LATERAL (
        SELECT d.ctid AS row, d.key, d.head_key AS k, d.head_id AS id FROM fleetpace_platform_due d
        WHERE d.platform = l.platform AND d.head_id IS NOT NULL
          AND (d.platform, d.key) NOT IN (SELECT t.platform, t.key FROM todo t)
        ORDER BY d.head_key, d.head_id
        LIMIT 1) o ON true
),
gone AS (
    DELETE FROM fleetpace_platform_due d
    WHERE d.ctid = ANY (ARRAY(SELECT f.row FROM fresh f WHERE f.empty AND f.row IS NOT NULL))
    RETURNING 1
),
moved AS (
    UPDATE fleetpace_platform_due d
    SET head_key = f.k, head_id = f.id, valid_until = f.valid_until, first = COALESCE(f.first, d.first)
    FROM (SELECT f.row, f.k, f.id, f.valid_until,
                 CASE WHEN x.platform IS NOT NULL THEN f.key IS NOT DISTINCT FROM x.key END AS first
          FROM fresh f LEFT JOIN firsts x ON x.platform = f.platform
          WHERE NOT f.empty AND f.row IS NOT NULL) f
    WHERE d.ctid = ANY (ARRAY(SELECT f.row FROM fresh f
                              WHERE NOT f.empty AND f.row IS NOT NULL
                                AND ((f.k, f.id, f.valid_until) IS DISTINCT FROM (f.was_k, f.was_id, f.was_until)
                                     OR f.platform IN (SELECT x.platform FROM firsts x))))
      AND d.ctid = f.row
      AND (d.head_key, d.head_id, d.valid_until, d.first)
          IS DISTINCT FROM (f.k, f.id, f.valid_until, COALESCE(f.first, d.first))
),
added AS (
    INSERT INTO fleetpace_platform_due (platform, key, head_key, head_id, valid_until, first)
    SELECT f.platform, f.key, f.k, f.id, f.valid_until, f.key IS NOT DISTINCT FROM x.key
    FROM fresh f LEFT JOIN firsts x ON x.platform = f.platform
    WHERE f.row IS NULL AND NOT f.empty
      AND EXISTS (SELECT 1 FROM fleetpace_platform p WHERE p.name = f.platform)
    RETURNING 1
),
flags AS (
    SELECT x.other_row AS row, true AS first FROM firsts x
    WHERE x.other_row IS NOT NULL AND x.key = x.other_key AND x.other_row IS DISTINCT FROM x.was_row
    UNION ALL
    SELECT x.was_row, false FROM firsts x
    WHERE x.was_row IS NOT NULL AND x.was_key IS DISTINCT FROM x.key
      AND (x.platform, x.was_key) NOT IN (SELECT t.platform, t.key FROM todo t)
),
flagged AS (
    UPDATE fleetpace_platform_due d SET first = g.first
    FROM flags g
    WHERE d.ctid = ANY (ARRAY(SELECT g.row FROM flags g)) AND d.ctid = g.row AND d.first IS DISTINCT FROM g.first
)
SELECT (SELECT count(*) FROM added) + (SELECT count(*) FROM gone),
       (SELECT c.reltuples FROM pg_class c WHERE c.oid = 'fleetpace_platform_due'::regclass)`

// analyzeDueSQL refreshes the planner's statistics of
// fleetpace_platform_due after a refresh that added or removed many keys
// (analyzeAfter). The walks of the due query rely on them: with the
// statistics of a table of 10,000 platforms and no key (after an upgrade,
// a large import, a truncation), the planner walked a platform's keys
// through another index and sorted them (it took a whole walk of an index
// of every key per platform: 3 s a tick at 10,000 platforms, until
// autovacuum came by).
const analyzeDueSQL = `ANALYZE fleetpace_platform_due`

// platformHeadsSQL reads the due query's candidates: the platforms in the
// order of their heads (their first keys' heads), after the head ($2, $3),
// at most $4 of them, leaving out those of $1 (the platforms that take no
// part: stopped, or no cap left) — a walk of
// fleetpace_platform_due_first_idx that stops at the limit, $1 a hashed
// subplan built once. Each row: the platform and its head. It costs the
// limit and the platforms left out before it, not the platforms.
const platformHeadsSQL = `
SELECT d.platform, d.head_key, d.head_id FROM fleetpace_platform_due d
WHERE d.first
  AND (d.head_key, d.head_id) > ($2::timestamptz, $3::bigint)
  AND d.platform NOT IN (SELECT x.platform FROM unnest($1::text[]) AS x (platform))
ORDER BY d.head_key, d.head_id
LIMIT $4`

// keyWalk is the walk of one key's due sources in fair order, from after
// the place ({q}.k, {q}.id), at most {n} of them: an index range of
// fleetpace_source_key_due_idx, due_at <= now() tested in the index (no
// heap fetch for a source passed that is not due). {q} names the row giving the platform, key
// and place; {n} the count.
const keyWalk = `
    SELECT ` + fairKey + ` AS k, s.id FROM fleetpace_due_source s
    WHERE s.platform = {q}.platform AND s.key = {q}.key
      AND (` + fairKey + `, s.id) > ({q}.k, {q}.id)
    ORDER BY 1, 2
    LIMIT {n}`

func walk(q, n string) string {
	return strings.NewReplacer("{q}", q, "{n}", n).Replace(keyWalk)
}

// dueReadSQL is one round of the due query's reads, for every platform and
// key that needs more:
//   - keys of platforms in head order ($1 the platforms, $2 and $3 the
//     head after which to read, $4 how many, $5 how many sources the
//     platform is asked for): a walk of
//     fleetpace_platform_due_key_head_idx, leaving out the keys $6/$7
//     (platforms and keys whose cap is spent; hashed). When a platform
//     has fewer keys than asked for, each key read is walked on too, far
//     enough for the platform to give the sources asked for
//     (ceil(sources / keys) − 1 past its head): a platform of one key
//     (key "") gets its batch in the same round;
//   - further due sources of single keys ($8 the platforms, $9 the keys,
//     $10 and $11 the last source read, $12 how many).
//
// Each row: whether it is a key's head, the platform, the key, the source's
// fair key and id.
var dueReadSQL = `
WITH u AS (
    SELECT q.platform, q.n, q.s, x.key, x.k, x.id, count(*) OVER (PARTITION BY q.platform) AS got
    FROM unnest($1::text[], $2::timestamptz[], $3::bigint[], $4::int[], $5::int[]) AS q (platform, k, id, n, s)
    CROSS JOIN LATERAL (
        SELECT d.key, d.head_key AS k, d.head_id AS id FROM fleetpace_platform_due d
        WHERE d.platform = q.platform AND d.head_id IS NOT NULL
          AND (d.head_key, d.head_id) > (q.k, q.id)
          AND (d.platform, d.key) NOT IN (SELECT z.platform, z.key FROM unnest($6::text[], $7::text[]) AS z (platform, key))
        ORDER BY d.head_key, d.head_id
        LIMIT q.n) x
)
SELECT true, u.platform, u.key, u.k, u.id FROM u
UNION ALL
SELECT false, u.platform, u.key, r.k, r.id FROM u
CROSS JOIN LATERAL (` + walk("u", "(u.s + u.got - 1) / u.got - 1") + `) r
WHERE u.got < u.n
UNION ALL
SELECT false, w.platform, w.key, r.k, r.id
FROM unnest($8::text[], $9::text[], $10::timestamptz[], $11::bigint[], $12::int[]) AS w (platform, key, k, id, n)
CROSS JOIN LATERAL (` + walk("w", "w.n") + `) r`

// claimSQL locks the sources to enqueue that are enabled and not queued yet.
// Row locks (taken in id order, so concurrent claims cannot deadlock) make a
// concurrent claim wait and then skip rows this one queued: a source is never
// queued twice. Locking instead of updating here saves a second rewrite of
// every row: markQueuedSQL writes queued_at and the job id in one update.
//
// With $2 (a tick) it leaves out sources of stopped platforms as well. The
// tick's plan read which platforms are stopped in an earlier statement (a
// tick runs in READ COMMITTED: each statement sees what was committed when
// it began). A worker records a check and the cooldown its 429 starts in
// one transaction; when that commits between the plan and the due query,
// the due query sees the source free again while the plan saw its
// platform running, and without this test the tick queued the source into
// a 15-minute cooldown. This statement begins after the due query, so it
// sees the cooldown of every check the due query saw.
const claimSQL = `
SELECT s.id, s.platform, s.key, s.url, COALESCE(s.etag, ''), COALESCE(s.last_modified, '') FROM fleetpace_source s
WHERE s.id = ANY($1) AND s.queued_at IS NULL AND s.enabled
  AND NOT ($2 AND EXISTS (SELECT 1 FROM fleetpace_platform_stop st WHERE st.platform = s.platform AND st.stopped))
ORDER BY s.id
FOR UPDATE OF s`

const markQueuedSQL = `
UPDATE fleetpace_source s SET queued_at = now(), queued_job_id = j.job_id
FROM unnest($1::bigint[], $2::bigint[]) AS j(source_id, job_id)
WHERE s.id = j.source_id`

// reconcileSQL releases sources whose job finished without recording a check
// (discarded after its last attempt, cancelled, deleted), so they can be
// queued again. Sources queued in the last minute are left alone. One
// statement: River's job states come from the schema's
// fleetpace_unfinished_jobs (inlined: an anti-join on river_job's primary
// key).
const reconcileSQL = `
UPDATE fleetpace_source s SET queued_at = NULL, queued_job_id = NULL
WHERE s.queued_at IS NOT NULL
  AND s.queued_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM fleetpace_unfinished_jobs() AS j(id) WHERE j.id = s.queued_job_id)`

const platformSourceIDsSQL = `
SELECT s.id FROM fleetpace_source s
WHERE s.platform = $1 AND s.enabled AND s.queued_at IS NULL
ORDER BY ` + fairKey + `, s.id`
