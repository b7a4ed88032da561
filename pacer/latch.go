package pacer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/dbconn"
)

// latch is the pacer's memory of an outage. After a round trip finds the
// database unreachable, no connection is attempted for one period (calls
// pace locally instead, booking a local slot at most one horizon — half a
// period — ahead); once it passes, one caller at a time probes. After the
// probe succeeds, for one period and one horizon more the process also
// honours its local share: another process may still grant local slots
// until its own latch expires (at most a period after this one's success),
// each at most a horizon ahead. See docs/design.md, "Degraded mode".
//
// The common path (no outage, not recovering) is two atomic loads.
type latch struct {
	clock  clock.Clock
	period time.Duration

	down         atomic.Bool  // the last probe or round trip failed
	recoverNanos atomic.Int64 // after a resume, honour the local share until then (Unix ns; 0: never)

	mu      sync.Mutex
	until   time.Time // no connection attempt before this
	probing bool      // one caller is probing the database
}

// admit decides whether a call may use the database. While a failure is
// latched, or while another caller probes after the latch expired, it may
// not; otherwise, if the database was down, this caller becomes the one
// probe. recovering: shared pacing resumed less than a period ago.
func (l *latch) admit() (shared, probe, recovering bool) {
	if !l.down.Load() {
		return true, false, l.recovering()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down.Load() { // resumed meanwhile
		return true, false, l.recovering()
	}
	if l.probing || l.clock.Now().Before(l.until) {
		return false, false, false
	}
	l.probing = true
	return true, true, false
}

// recovering: shared pacing resumed less than a period ago.
func (l *latch) recovering() bool {
	r := l.recoverNanos.Load()
	return r != 0 && l.clock.Now().UnixNano() < r
}

// horizon is how far ahead a local slot may be booked: half a period.
func (l *latch) horizon() time.Duration { return l.period / 2 }

// recovery is how long after a resume the local share is honoured: until
// every other process's local slots have passed.
func (l *latch) recovery() time.Duration { return l.period + l.horizon() }

// recoverLeft is how long the local share is still honoured: the rest of
// the recovering period, or, for a probe (which starts one if it
// succeeds), a whole one.
func (l *latch) recoverLeft(probe bool) time.Duration {
	if probe {
		return l.recovery()
	}
	return max(time.Duration(l.recoverNanos.Load()-l.clock.Now().UnixNano()), 0)
}

// latched: no connection may be attempted now.
func (l *latch) latched() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.clock.Now().Before(l.until)
}

// isDown: shared pacing is unavailable.
func (l *latch) isDown() bool { return l.down.Load() }

// fail latches an outage for one period; wasDown tells whether one was
// already latched.
func (l *latch) fail(probe bool) (wasDown bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	wasDown = l.down.Swap(true)
	l.until = l.clock.Now().Add(l.period)
	if probe {
		l.probing = false
	}
	return wasDown
}

// succeed ends a probe that reached the database: shared pacing resumes
// (resumed is true if it was down), and the local share is honoured for
// the recovery period.
func (l *latch) succeed(probe bool) (resumed bool) {
	if !probe {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probing = false
	resumed = l.down.Swap(false)
	l.recoverNanos.Store(l.clock.Now().Add(l.recovery()).UnixNano())
	return resumed
}

// endProbe ends a probe that was interrupted by the caller's context.
func (l *latch) endProbe(probe bool) {
	if !probe {
		return
	}
	l.mu.Lock()
	l.probing = false
	l.mu.Unlock()
}

// unreachable reports whether err means the database could not be reached,
// as opposed to a server-side error from a reachable database (a missing
// schema, a platform without a rate): only the former latches an outage.
func unreachable(err error) bool {
	return errors.Is(err, errLatched) || errors.Is(err, errNoCancel) || dbconn.IsUnavailable(err)
}

// slowConnectAttempts is how many times a call is made in all while its
// failures are slow connects (see slowConnect).
const slowConnectAttempts = 3

// slowConnect reports whether err is a new connection that could not be
// made in time while round trips on the pool's other connections reached
// the database since succeededBefore (Pacer.succeeded before the call). The
// server is up and slow to start a backend (a loaded machine: 2 s and
// more): no outage. Pacing locally then would be a partition of one
// process, which may take the fleet beyond its ceiling (a worker alone in
// degraded mode sent its local share beside two paced by the row: 43 in a
// 1-s window under a bound of 42), so the call goes again, on a pooled
// connection if one is idle by then.
func (p *Pacer) slowConnect(err error, succeededBefore uint64) bool {
	var ce *pgconn.ConnectError
	return !p.noSlowConnect && errors.As(err, &ce) && p.succeeded.Load() != succeededBefore
}

// retrySlowConnect runs fn, again (slowConnectAttempts in all) while it
// fails with a slow connect.
func retrySlowConnect[T any](ctx context.Context, p *Pacer, fn func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		before := p.succeeded.Load()
		v, err := fn()
		if err == nil || ctx.Err() != nil || attempt == slowConnectAttempts || !p.slowConnect(err, before) {
			return v, err
		}
		p.slowConnects.Add(1)
	}
}
