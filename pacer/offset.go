package pacer

import (
	"math"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// clockOffset maps database times (the slots) to the local clock (what a
// process sleeps on). Each round trip brackets the offset (database minus
// local): the database read its clock at some instant between sending and
// receiving, so at − received ≤ offset ≤ at − sent. The tightest bracket
// is kept. A slot is mapped with the lower bound — the latest local instant
// it can be, so nothing is sent early. The bracket restarts from the newest
// sample every offsetWindow, to follow clock drift and steps.
//
// How much later than its true slot a caller woken on time may then be is
// the return part of the bracket's round trip. The part of it that is the
// network's — the floor, the narrowest round trip of the last 5–10
// minutes — delays every process at the database's distance alike: the
// whole schedule moves later, no window gets more. What a process must count
// as lateness is the bracket's width beyond that floor (uncertainty): a
// process whose round trips were slow on a loaded machine (a 50-ms first
// round trip where the network takes 0.3 ms) would otherwise send up to
// 50 ms after its slot, beyond the late budget, while the others send on
// time. Counting the whole width made every request of a fleet whose
// database is 20 ms away late (a third of its slots used: each fetch gave
// two slots back and sent on the third; `bench fleet --rtt 20ms`, goodput
// 0.32). Processes at unequal distances from the database are apart by
// half the difference of their floors, uncounted. Call its methods with the
// pacer's mutex held.
type clockOffset struct {
	lo, hi float64   // seconds: database clock minus local clock, lower and upper bound
	since  time.Time // local time the bracket was restarted
	set    bool

	// The network's floor: the narrowest round trip (seconds) since
	// floorSince and in the period before it (floorPeriod each).
	floor, prevFloor float64
	floorSince       time.Time
}

// offsetWindow is how long a bracket is kept before it restarts.
const offsetWindow = time.Minute

// floorPeriod is how long a period of the floor is: it remembers the
// narrowest round trip of the last 5–10 minutes.
const floorPeriod = 5 * time.Minute

// observe folds one round trip into the bracket: at is the database's
// clock read during the statement, sent and received the local times the
// statement left and its reply came.
func (o *clockOffset) observe(at float64, sent, received time.Time) {
	lo, hi := at-timeToEpoch(received), at-timeToEpoch(sent)
	o.observeFloor(hi-lo, received)
	if !o.set || received.Sub(o.since) > offsetWindow || lo > o.hi || hi < o.lo {
		// New, old, or inconsistent with this one (a clock stepped).
		o.lo, o.hi, o.since, o.set = lo, hi, received, true
		return
	}
	o.lo, o.hi = max(o.lo, lo), min(o.hi, hi)
}

// observeFloor folds a round trip of width seconds into the floor.
func (o *clockOffset) observeFloor(width float64, at time.Time) {
	width = max(width, 0)
	switch d := at.Sub(o.floorSince); {
	case o.floorSince.IsZero() || d < 0 || d > 2*floorPeriod:
		o.floor, o.prevFloor, o.floorSince = width, math.Inf(1), at
	case d > floorPeriod:
		o.prevFloor, o.floor, o.floorSince = o.floor, width, at
	default:
		o.floor = min(o.floor, width)
	}
}

// local maps a database time to the local clock.
func (o *clockOffset) local(db float64) time.Time {
	return epochToTime(db - o.lo)
}

// uncertainty is how much earlier than local maps it a slot may truly be,
// beyond what delays every process at the database's distance alike: the
// bracket's width beyond the network's floor.
func (o *clockOffset) uncertainty() time.Duration {
	if !o.set {
		return 0
	}
	return secondsToDuration(max(o.hi-o.lo-min(o.floor, o.prevFloor), 0))
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
