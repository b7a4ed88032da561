package queue

// Every SQL statement of the package lives here: the only statements of
// fleetpace that name River's tables, with the schema's
// fleetpace_unfinished_jobs (the scan's reconciliation reads it).

const pendingSQL = `
SELECT count(*) FROM river_job
WHERE queue = $1
  AND (state IN ('available', 'running', 'pending')
       OR (state IN ('scheduled', 'retryable')
           AND scheduled_at <= now() + make_interval(secs => $2)))`

// wakeFetchesSQL makes a platform's scheduled fetch jobs available now, as
// River's JobRetry does for one job, and sends River's insert notification
// for the queue (topic <schema>.river_insert, payload {"queue": …}), so
// every client fetches at once rather than at its next poll (1 s). River
// takes available jobs in (priority, scheduled_at, id) order: a woken job
// is scheduled at its creation, so it takes its turn among the jobs queued
// with it instead of waiting behind every job queued since (another
// platform's backlog of a whole look-ahead).
const wakeFetchesSQL = `
WITH woken AS (
    UPDATE river_job SET state = 'available', scheduled_at = LEAST(created_at, now())
    WHERE queue = $1 AND kind = $2 AND state = 'scheduled' AND args->>'platform' = $3
    RETURNING 1
)
SELECT count(*), CASE WHEN count(*) > 0 THEN
    pg_notify(current_schema() || '.river_insert', json_build_object('queue', $1::text)::text) END IS NULL
FROM woken`

// wakeJobsSQL is wakeFetchesSQL for the jobs whose ids are in $3.
const wakeJobsSQL = `
WITH woken AS (
    UPDATE river_job SET state = 'available', scheduled_at = LEAST(created_at, now())
    WHERE queue = $1 AND kind = $2 AND state = 'scheduled' AND id = ANY($3::bigint[])
    RETURNING 1
)
SELECT count(*), CASE WHEN count(*) > 0 THEN
    pg_notify(current_schema() || '.river_insert', json_build_object('queue', $1::text)::text) END IS NULL
FROM woken`

const cancelFetchesSQL = `
DELETE FROM river_job
WHERE queue = $1 AND kind = $2 AND args->>'platform' = $3
  AND state IN ('available', 'scheduled', 'retryable', 'pending')`

// countJobsSQL counts unfinished jobs by kind and state (River's
// prioritized fetching index leads with state: one range per state).
const countJobsSQL = `
SELECT kind, state::text, count(*) FROM river_job
WHERE state IN ('available', 'running', 'scheduled', 'retryable', 'pending')
GROUP BY kind, state ORDER BY kind, state`

// wakeHeldSQL is wakeFetchesSQL for the jobs a hold ending at $5 snoozed:
// the fetch jobs of platform $3 (of key $4 unless it is empty) that are
// scheduled, or available but not yet due, up to $5 (River brought a
// snooze shorter than its scheduler's interval back as available with its
// time ahead). Each takes its place in due order again, by its creation,
// instead of behind every job queued while it was held.
const wakeHeldSQL = `
WITH woken AS (
    UPDATE river_job SET state = 'available', scheduled_at = LEAST(created_at, now())
    WHERE queue = $1 AND kind = $2 AND state IN ('scheduled', 'available')
      AND scheduled_at <= $5 AND scheduled_at > LEAST(created_at, now())
      AND args->>'platform' = $3 AND ($4 = '' OR args->>'key' = $4)
    RETURNING 1
)
SELECT count(*), CASE WHEN count(*) > 0 THEN
    pg_notify(current_schema() || '.river_insert', json_build_object('queue', $1::text)::text) END IS NULL
FROM woken`
