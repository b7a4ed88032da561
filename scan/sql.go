package scan

import (
	"fmt"
	"strings"

	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

// Every SQL statement of the package lives here. The scan reads the store's
// tables (package sources) and writes only the queue mark of a source
// (queued_at, queued_job_id): it sets it in the transaction that inserts
// the source's River job, and takes it back from sources whose job finished
// without a check. Recording a check clears it (package sources).

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
// cools down (the cooldown test names the platform by its parameter, so it
// is evaluated once per arm); the arms are merged in the same order
// (PostgreSQL's Merge Append reads each arm only as far as the overall LIMIT
// needs). Arguments: $1 overall limit, then per arm its platform and cap.
// Only the number of arms varies; every value is a parameter.
func dueSQL(n int) string {
	var b strings.Builder
	b.WriteString("SELECT id, platform, url FROM (\n")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString("    UNION ALL\n")
		}
		p, c := 2+2*i, 3+2*i
		fmt.Fprintf(&b, `    (SELECT s.id, s.platform, s.url, s.last_checked_at FROM fleetpace_source s
      WHERE s.platform = $%[1]d AND %[3]s
        AND NOT %[4]s
      ORDER BY s.last_checked_at ASC NULLS FIRST, s.id
      LIMIT $%[2]d)
`, p, c, sources.DueSQL, sources.CoolingDownSQL(fmt.Sprintf("$%d", p)))
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
// queued again. Sources queued in the last minute are left alone. One
// statement: River's job states come from package queue's relation of
// unfinished jobs (an anti-join on river_job's primary key).
const reconcileSQL = `
UPDATE fleetpace_source s SET queued_at = NULL, queued_job_id = NULL
WHERE s.queued_at IS NOT NULL
  AND s.queued_at < now() - interval '1 minute'
  AND NOT EXISTS (SELECT 1 FROM ` + queue.UnfinishedJobsSQL + ` j WHERE j.id = s.queued_job_id)`

const platformSourceIDsSQL = `
SELECT id FROM fleetpace_source
WHERE platform = $1 AND enabled AND queued_at IS NULL
ORDER BY last_checked_at ASC NULLS FIRST, id`

// existingSourceIDsSQL returns which of the ids $1 name a source.
const existingSourceIDsSQL = `SELECT id FROM fleetpace_source WHERE id = ANY($1)`
