package pacer

import (
	"time"
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

// sentAt is when a statement whose reply came at received left: rtt
// before, measured from the write (a connection's setup is not part of
// it). A statement given this pacer's clock (Config.TimeFromClock) read
// the local clock itself: no bracket.
func (p *Pacer) sentAt(received time.Time, rtt time.Duration) time.Time {
	if p.cfg.TimeFromClock {
		return received
	}
	return received.Add(-rtt)
}
