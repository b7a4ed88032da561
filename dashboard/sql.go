package dashboard

// Every SQL statement of the dashboard lives here. Each reads a bounded
// number of rows through an index: a page of platforms by primary key, and
// per platform of the page one index range (fleetpace_source_platform_due_at_idx,
// fleetpace_source_failing_idx, fleetpace_source_queued_at_idx).

// platformsPageSQL is a page of platforms after the name $1, by name, at
// most $2 rows (the primary key's order). Columns as sources.Platform.
const platformsPageSQL = `
SELECT name, rate_per_sec, burst, max_multiplier, decay_after, cooldown,
       backoff_factor, recovery_factor, probe, use_headers, respace
FROM fleetpace_platform
WHERE name > $1
ORDER BY name
LIMIT $2`

// platformPositionSQL counts the platforms, and those up to the name $1:
// where a page starts (index-only scans of the primary key).
const platformPositionSQL = `
SELECT (SELECT count(*) FROM fleetpace_platform),
       (SELECT count(*) FROM fleetpace_platform WHERE name <= $1)`

// countsOfSQL is, for each platform in $1, its sources due now (the
// schema's definition, as the scan, `sources list --due` and status see
// it: a fleetpace_due_source, none while the platform is stopped —
// fleetpace_platform_stop), queued, failing (consecutive failures), and how
// late its late enabled sources are (queued or not, as sources.Counts
// counts them), in seconds: the most, and the 95th percentile (nearest
// rank: the source 5 % of the way into the range, most overdue first, read
// with OFFSET instead of sorting the range). Each figure is one index range
// of the platform's (fleetpace_source_platform_due_at_idx, index-only);
// queued sources are counted in one pass of the (small) partial index of
// queued sources.
const countsOfSQL = `
WITH p AS (SELECT DISTINCT unnest($1::text[]) AS name),
q AS (
    SELECT s.platform, count(*) AS queued
    FROM fleetpace_source s
    WHERE s.queued_at IS NOT NULL AND s.platform = ANY($1::text[])
    GROUP BY s.platform
)
SELECT p.name, CASE WHEN COALESCE(st.stopped, false) THEN 0 ELSE du.due END, COALESCE(q.queued, 0), f.failing, d.stale_max,
       COALESCE((SELECT EXTRACT(EPOCH FROM now() - s.due_at)
                 FROM fleetpace_source s
                 WHERE s.platform = p.name AND s.enabled AND s.due_at <= now()
                 ORDER BY s.due_at
                 OFFSET floor(d.late * 0.05) LIMIT 1), 0)::float8
FROM p
LEFT JOIN fleetpace_platform_stop st ON st.platform = p.name
CROSS JOIN LATERAL (
    SELECT count(*) AS late,
           COALESCE(EXTRACT(EPOCH FROM now() - min(s.due_at)), 0)::float8 AS stale_max
    FROM fleetpace_source s
    WHERE s.platform = p.name AND s.enabled AND s.due_at <= now()
) d
CROSS JOIN LATERAL (SELECT count(*) AS due FROM fleetpace_due_source s WHERE s.platform = p.name) du
CROSS JOIN LATERAL (
    SELECT count(*) AS failing FROM fleetpace_source s
    WHERE s.platform = p.name AND s.consecutive_failures > 0
) f
LEFT JOIN q ON q.platform = p.name`

// sourceTotalsSQL counts a platform's sources and the disabled ones (an
// index-only scan of its range of the (platform, url) key, and of the
// enabled ones' range of fleetpace_source_platform_due_at_idx).
const sourceTotalsSQL = `
SELECT (SELECT count(*) FROM fleetpace_source WHERE platform = $1),
       (SELECT count(*) FROM fleetpace_source WHERE platform = $1 AND enabled)`

// sourceSummaryColumns are what lists of sources show.
const sourceSummaryColumns = `id, url, enabled, due_at, last_checked_at, consecutive_failures,
       last_status, last_outcome, last_error, queued_at, queued_job_id`

// failingPageSQL is a page of platform $1's failing sources, latest check
// first, after the keyset ($2, $3) (last_checked_at, id), at most $4.
const failingPageSQL = `
SELECT ` + sourceSummaryColumns + `
FROM fleetpace_source
WHERE platform = $1 AND consecutive_failures > 0
  AND (last_checked_at, id) < ($2, $3)
ORDER BY last_checked_at DESC, id DESC
LIMIT $4`

// overdueSQL is platform $1's most overdue enabled sources (queued or
// not), at most $2.
const overdueSQL = `
SELECT ` + sourceSummaryColumns + `
FROM fleetpace_source
WHERE platform = $1 AND enabled AND due_at <= now()
ORDER BY due_at
LIMIT $2`

// epochSQL is the sign-out epoch (session.go): 0 before the first sign-out.
const epochSQL = `SELECT COALESCE((SELECT epoch FROM fleetpace_dashboard_epoch), 0)`

// bumpEpochSQL starts a new sign-out epoch and returns it.
const bumpEpochSQL = `
INSERT INTO fleetpace_dashboard_epoch AS e (id, epoch) VALUES (true, 1)
ON CONFLICT (id) DO UPDATE SET epoch = e.epoch + 1
RETURNING epoch`

// sourceByURLSQL finds platform $1's source with the URL $2 (the
// (platform, url) key).
const sourceByURLSQL = `SELECT id FROM fleetpace_source WHERE platform = $1 AND url = $2`

// The history's statements (history.go). Each walks an index range of the
// history table per platform or source shown.

// activityOfSQL counts the checks of each platform in $1 per time bucket
// ($3 seconds wide, numbered from 0 at now() − $2 seconds). One bitmap
// scan of fleetpace_check_platform_idx for every platform of the page
// together, so each heap page of the window is read once however many of
// the page's platforms it holds (the last minutes' pages are too recent to
// be all-visible: a platform at a time would read them once each). Bucket
// numbers come from date_part (float8), not EXTRACT (numeric).
const activityOfSQL = `
SELECT c.platform, floor((date_part('epoch', c.checked_at) - n.since_s) / $3)::int, count(*)
FROM (SELECT now() - make_interval(secs => $2) AS since, date_part('epoch', now()) - $2 AS since_s) n
JOIN fleetpace_check c ON c.platform = ANY($1::text[]) AND c.checked_at >= n.since
GROUP BY 1, 2`

// recentOfSQL counts the checks of each platform in $1 by outcome over the
// last $2 seconds (status.RecentWindow): the rate used and the 429s per
// minute. One index range of fleetpace_check_platform_idx per platform.
const recentOfSQL = `
SELECT c.platform, c.outcome, count(*)
FROM fleetpace_check c
WHERE c.platform = ANY($1::text[]) AND c.checked_at >= now() - make_interval(secs => $2)
GROUP BY 1, 2`
