package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// conns counts the connections pid holds, by the application names a
// worker gives its connections ("fleetpace-worker PID", "fleetpace-pacer
// PID").
func conns(t *testing.T, db *pgxpool.Pool, pid int) (worker, pacer int) {
	t.Helper()
	worker, pacer, _ = connsStale(t, db, pid)
	return worker, pacer
}

// staleAfter is how long a pool connection may sit idle before the test
// calls it kept: the pools close a connection idle for 5 s at their next
// check (every 7.5 s), so none should be idle for 12.5 s; 20 s leaves a
// loaded machine's late check room.
const staleAfter = 20 * time.Second

// connsStale counts pid's connections as conns does, and how many of its
// main pool's connections have been idle for longer than staleAfter —
// connections the pool should have closed.
func connsStale(t *testing.T, db *pgxpool.Pool, pid int) (worker, pacer, stale int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := db.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE application_name = $1),
       count(*) FILTER (WHERE application_name = $2),
       count(*) FILTER (WHERE application_name = $1 AND state = 'idle' AND state_change < now() - $3::interval)
FROM pg_stat_activity`, fmt.Sprintf("fleetpace-worker %d", pid), fmt.Sprintf("fleetpace-pacer %d", pid), staleAfter.String()).Scan(&worker, &pacer, &stale)
	if err != nil {
		t.Fatal(err)
	}
	return worker, pacer, stale
}

// connSampler samples a process's connection count every 50 ms until
// stopped.
type connSampler struct {
	stop    chan struct{}
	done    chan struct{}
	samples []int
	pacer   []int // the pacer's share of each sample
	stale   int   // the most main-pool connections seen idle past staleAfter
}

func sampleConns(t *testing.T, db *pgxpool.Pool, pid int) *connSampler {
	s := &connSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		for {
			w, p, st := connsStale(t, db, pid)
			s.samples = append(s.samples, w+p)
			s.pacer = append(s.pacer, p)
			s.stale = max(s.stale, st)
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
		}
	}()
	return s
}

// Stop stops sampling and returns the median and the largest count.
func (s *connSampler) Stop() (median, most int) {
	close(s.stop)
	<-s.done
	sorted := slices.Sorted(slices.Values(s.samples))
	return sorted[len(sorted)/2], sorted[len(sorted)-1]
}

// Pacer returns the largest number of pacer connections seen while
// sampling; call it after Stop.
func (s *connSampler) Pacer() int { return slices.Max(s.pacer) }

// waitConns waits until pid holds at most n connections and returns how
// long that took; it fails the test after timeout.
func waitConns(t *testing.T, db *pgxpool.Pool, pid, n int, timeout time.Duration) time.Duration {
	t.Helper()
	return waitConnsUntil(t, db, pid, timeout, fmt.Sprintf("at most %d connections", n),
		func(worker, pacer int) bool { return worker+pacer <= n })
}

// waitPacerIdle waits until pid holds no pacer connection (its pool's idle
// connections and its listener closed) and returns how long that took; it
// fails the test after timeout.
func waitPacerIdle(t *testing.T, db *pgxpool.Pool, pid int, timeout time.Duration) time.Duration {
	t.Helper()
	return waitConnsUntil(t, db, pid, timeout, "no pacer connection (its listener closed while idle)",
		func(_, pacer int) bool { return pacer == 0 })
}

// waitConnsUntil polls pid's connections (main pool, pacer) every 100 ms
// until ok holds and returns how long that took; after timeout it fails
// the test, naming what it waited for.
func waitConnsUntil(t *testing.T, db *pgxpool.Pool, pid int, timeout time.Duration, what string, ok func(worker, pacer int) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		w, p := conns(t, db, pid)
		if ok(w, p) {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("worker %d holds %d main and %d pacer connections after %s, want %s", pid, w, p, timeout, what)
		}
		time.Sleep(100 * time.Millisecond) // the poll interval; the deadline decides
	}
}

// A worker's connections stay within its budget: idle, a worker keeps only
// what its periodic queries use (River's poll, its leader election and
// maintenance, the heartbeat, the scan): 1–2 on a quiet machine, a third
// while slow queries coincide (a loaded machine keeps a third alive all the
// time), and never a connection idle past the pool's idle timeout; busy, at
// most --max-conns — a worker with a small budget (--poll-only --max-conns
// 4) stays within it under the load that takes the default worker above
// it; and once the work is done, the busy spell's pool connections close,
// and what stays is an idle worker's. Counted in pg_stat_activity by the
// application names the worker gives its connections, which carry its pid,
// every 50 ms over 5-s windows. The idle workers run with the default
// heartbeat and scan schedule.
func TestConnectionBudget(t *testing.T) {
	t.Parallel()
	url := newURL(t)
	db := pool(t, url)
	d := newDest(t, map[string]fakedest.Rule{"/b/": {Delay: 50 * time.Millisecond}})
	idleFlags := []string{"--heartbeat", "5s", "--poll-max", "30s", "--listen-idle", "5s"}
	a := startWorker(t, url, "budget-default", append(idleFlags, "--concurrency", "50")...)
	b := startWorker(t, url, "budget-small", append(idleFlags, "--concurrency", "50", "--poll-only", "--max-conns", "4")...)
	pa, pb := a.cmd.Process.Pid, b.cmd.Process.Pid

	// Fresh and idle: the startup's connections close after the idle
	// timeout (5 s, checked every 7.5 s), and the pacer's listener, which
	// the worker opens before River starts, after 5 s without a
	// reservation (--listen-idle; 30 s by default).
	waitPacerIdle(t, db, pa, 60*time.Second)
	waitConns(t, db, pa, idleMost, 60*time.Second)
	waitConns(t, db, pb, idleMost, 60*time.Second)
	checkIdle(t, db, pa, pb, "idle, fresh")

	platformWithSources(t, url, "b", d.URL(), 3000, "--rate", "300", "--burst", "10")
	sa, sb := sampleConns(t, db, pa), sampleConns(t, db, pb)
	waitAllChecked(t, db, 2*time.Minute)
	_, busyA := sa.Stop()
	_, busyB := sb.Stop()
	byWorker := byUA(d.Requests())
	t.Logf("busy (3,000 fetches at 300/s, 50 ms each, concurrency 50): default worker %d connections at most (budget 10, %d fetches), small budget %d (budget 4, %d fetches)",
		busyA, len(byWorker["budget-default"]), busyB, len(byWorker["budget-small"]))
	if busyA > 10 || busyB > 4 {
		t.Errorf("busy workers held %d and %d connections, budgets 10 and 4", busyA, busyB)
	}
	if busyA <= 4 {
		t.Errorf("the default worker held only %d connections: the load does not show that a budget of 4 binds", busyA)
	}
	if len(byWorker["budget-small"]) < 300 {
		t.Errorf("the worker with 4 connections fetched %d sources: a small budget should slow it, not stop it", len(byWorker["budget-small"]))
	}

	// After the busy spell the pool's extra connections close (5 s idle),
	// and the pacer's listener after 5 s without a reservation
	// (--listen-idle): what stays is what an idle worker holds.
	settleA := waitPacerIdle(t, db, pa, 60*time.Second)
	settleA += waitConns(t, db, pa, idleMost, 60*time.Second)
	settleB := waitConns(t, db, pb, idleMost, 60*time.Second)
	t.Logf("after the busy spell: default worker ≤ %d in %s, --poll-only in %s", idleMost, settleA.Round(time.Second), settleB.Round(time.Second))
	checkIdle(t, db, pa, pb, "after the busy spell")
}

// idleMost is the most connections an idle worker keeps (median of a 5-s
// window): 1–2 for its periodic queries, a third while they coincide.
const idleMost = 3

// checkIdle samples two idle workers and fails the test if either keeps
// more than idleMost connections (median) or any connection idle past
// staleAfter.
func checkIdle(t *testing.T, db *pgxpool.Pool, pa, pb int, what string) {
	t.Helper()
	medA, mostA, staleA, medB, mostB, staleB := idleConns(t, db, pa, pb, what)
	if medA > idleMost || medB > idleMost {
		t.Errorf("%s: idle workers kept %d and %d connections (at most %d and %d), want ≤ %d", what, medA, medB, mostA, mostB, idleMost)
	}
	if staleA > 0 || staleB > 0 {
		t.Errorf("%s: idle workers kept %d and %d connections idle for more than %s: the pools' idle timeout (5 s) did not close them", what, staleA, staleB, staleAfter)
	}
}

// idleConns samples two idle workers' connections over 5-s windows: the
// medians of the last window, the most seen in any, and the most main-pool
// connections seen idle past staleAfter. A window whose median is above
// idleMost is sampled again, up to three windows (15 s): a third connection
// opened when periodic queries coincided lives until the pool's idle check
// closes it (5 s idle, checked every 7.5 s).
func idleConns(t *testing.T, db *pgxpool.Pool, pa, pb int, what string) (medA, mostA, staleA, medB, mostB, staleB int) {
	t.Helper()
	for round := 1; ; round++ {
		sa, sb := sampleConns(t, db, pa), sampleConns(t, db, pb)
		time.Sleep(5 * time.Second) // a sampling window, not a wait for anything
		ma, xa := sa.Stop()
		mb, xb := sb.Stop()
		medA, medB, mostA, mostB = ma, mb, max(mostA, xa), max(mostB, xb)
		staleA, staleB = max(staleA, sa.stale), max(staleB, sb.stale)
		t.Logf("%s, window %d: default worker %d connections (median), %d at most (pacer's at most %d, idle > %s %d); --poll-only %d, %d at most (pacer's %d, idle > %s %d)",
			what, round, ma, xa, sa.Pacer(), staleAfter, sa.stale, mb, xb, sb.Pacer(), staleAfter, sb.stale)
		if medA <= idleMost && medB <= idleMost || round == 3 {
			return medA, mostA, staleA, medB, mostB, staleB
		}
	}
}
