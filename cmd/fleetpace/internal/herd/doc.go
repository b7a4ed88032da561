// Package herd reproduces the poll herd of a large fleet against a capped
// database pool, two ways: Simulate, a discrete-event simulation in virtual
// time of up to 100,000 pollers driven by the real poller package's
// schedule, jitter and startup delay; and Drill, a real saturation drill of
// thousands of pollers against a real PostgreSQL whose max_connections is
// lowered. Both compare fleetpace's polling (startup jitter, per-cycle
// jitter, one connection attempt and fail fast) with the deterministic
// schedule and retry-on-acquire that turned a 30-second herd into a
// multi-hour outage (the fleet of 11,543 pollers and a 368-backend pool that
// Simulate's defaults come from).
//
// # The simulation's model
//
// N pollers each run poller.Run's loop: an optional startup delay
// (poller.StartupDelay over Max), then, the schedule settled at its top
// (poller.Schedule.Settle), a cycle, then a sleep of
// poller.Jitter(Schedule.Next(found)), forever. The fleet is idle, as the
// outage's was: a claim never finds work, so every cycle backs the schedule
// off to Max (an empty and a failed cycle back off alike).
//
// A cycle is one claim: acquire one of K backends, hold it for the claim
// time S, release it. A poll that finds every backend busy (or the database
// down) is refused. Fail-fast (fleetpace): the refused cycle ends at once as
// a failed cycle. Retry-on-acquire (the outage's baseline): the poller holds
// its place — a pending client connection — and knocks again every
// RetryDelay; a freed backend goes to the longest-waiting knocker at once;
// after RetryFor without a backend the cycle fails and the loop backs off.
//
// Claims in flight share the server: each needs S of work and they all
// progress at one rate, 1 on an idle server, divided by Slowdown in a
// saturation window, and times 1 − u where u is the share of the server's
// CPU that connection attempts take. Connection attempts are not free: each
// one, granted or refused, costs AttemptCost of CPU (a PostgreSQL backend
// fork and authentication, or a pooler's TLS handshake) out of Cores, over a
// sliding second; u is capped at 0.95. This is the feedback that can make
// retry-on-acquire a wall instead of a queue: thousands of pending clients
// knocking ten times a second eat the capacity the backlog needs to drain.
// With AttemptCost NoAttemptCost the model is a plain queue with
// abandonment; a deterministic fleet with retry still does not drain there,
// because serving the pending retriers together re-synchronizes it.
//
// Scenarios: a mass restart (every poller starts at t=0, a fresh schedule);
// a database restart (a warm fleet; at At every claim in flight fails and
// every attempt is refused for For); a saturation window (a warm fleet; from
// At for For every claim takes Slowdown × S and Hold backends are taken). A
// warm fleet's schedules are at Max and its next polls spread uniformly
// over [0, Max).
package herd
