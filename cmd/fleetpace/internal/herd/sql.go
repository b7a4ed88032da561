package herd

// The drill's statements. It creates nothing in the database: the claim's
// slowness during the window comes from an advisory lock.

// claimSQL is one poller's claim: it waits for the shared side of the
// drill's advisory lock (free except during the saturation window, when the
// window's holder has the exclusive side), then works for the claim time.
// The lock is released when the statement's implicit transaction ends.
const claimSQL = `SELECT pg_advisory_xact_lock_shared($1), pg_sleep($2::float8)`

// windowLockSQL and windowUnlockSQL open and close the saturation window:
// while the exclusive lock is held every claim blocks, holding its
// connection, so the pollers themselves fill max_connections.
const (
	windowLockSQL   = `SELECT pg_advisory_lock($1)`
	windowUnlockSQL = `SELECT pg_advisory_unlock($1)`
)

// sampleSQL counts the drill's backends, active (running or blocked in a
// claim) and all.
const sampleSQL = `SELECT count(*) FILTER (WHERE state = 'active'), count(*)
FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`

// maxConnectionsSQL reads the server's limit.
const maxConnectionsSQL = `SELECT current_setting('max_connections')::int`
