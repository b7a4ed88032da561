package pacer

import (
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// clockOffset maps database times (the slots) to the local clock (what a
// process sleeps on). Each round trip brackets the offset (database minus
// local): the database read its clock at some instant between sending and
// receiving, so at − received ≤ offset ≤ at − sent. The tightest bracket
// is kept. A slot is mapped with the lower bound — the latest local instant
// it can be, so nothing is sent early — and the bracket's width is how much
// later than its true slot a caller woken on time may be: Sleep counts it
// as lateness (a process whose first round trip took 50 ms on a loaded
// machine would otherwise send up to 50 ms after its slot, beyond the late
// budget, and no one would know). The bracket restarts from the newest
// sample every offsetWindow, to follow clock drift and steps. Call its
// methods with the pacer's mutex held.
type clockOffset struct {
	lo, hi float64   // seconds: database clock minus local clock, lower and upper bound
	since  time.Time // local time the bracket was restarted
	set    bool
}

// offsetWindow is how long a bracket is kept before it restarts.
const offsetWindow = time.Minute

// observe folds one round trip into the bracket: at is the database's
// clock read during the statement, sent and received the local times the
// statement left and its reply came.
func (o *clockOffset) observe(at float64, sent, received time.Time) {
	lo, hi := at-timeToEpoch(received), at-timeToEpoch(sent)
	if !o.set || received.Sub(o.since) > offsetWindow || lo > o.hi || hi < o.lo {
		// New, old, or inconsistent with this one (a clock stepped).
		o.lo, o.hi, o.since, o.set = lo, hi, received, true
		return
	}
	o.lo, o.hi = max(o.lo, lo), min(o.hi, hi)
}

// local maps a database time to the local clock.
func (o *clockOffset) local(db float64) time.Time {
	return epochToTime(db - o.lo)
}

// uncertainty is how much earlier than local maps it a slot may truly be.
func (o *clockOffset) uncertainty() time.Duration {
	if !o.set {
		return 0
	}
	return secondsToDuration(max(o.hi-o.lo, 0))
}

// trip is one statement's round trip: rtt on the monotonic system clock
// (blocks are sized by network time, whatever Config.Clock is), sent and
// received on the pacer's clock, read where the statement is written and
// where its reply has been read. The bracket must be read there: a caller
// that reads the clock when it runs again, after a goroutine handed it the
// reply late on a loaded machine, brackets an offset that excludes the
// true one, and maps every slot of the next minute that much later than
// it is (a key's requests 35 ms past their slots, a 1-s window of 44 at
// 40/s + burst 2).
type trip struct {
	rtt            time.Duration
	sent, received time.Time
	mono           time.Time
}

// startTrip is a round trip starting now.
func (p *Pacer) startTrip() trip {
	return trip{sent: p.clock.Now(), mono: time.Now()}
}

// end ends t now.
func (t *trip) end(clk clock.Clock) {
	t.received = clk.Now()
	t.rtt = time.Since(t.mono)
}

// sentAt is when the statement of rt left, for the offset's bracket. A
// statement given this pacer's clock (Config.TimeFromClock) read the local
// clock itself: no bracket.
func (p *Pacer) sentAt(rt trip) time.Time {
	if p.cfg.TimeFromClock {
		return rt.received
	}
	return rt.sent
}
