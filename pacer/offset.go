package pacer

import (
	"time"
)

// clockOffset maps database times (the slots) to the local clock (what a
// process sleeps on). Each round trip bounds the offset (database minus
// local): the database read its clock at some instant between sending and
// receiving, so offset ≥ at − received. The largest such bound is kept — it
// maps every slot to the latest local instant it can be, so nothing is sent
// early — and it restarts from the newest sample every offsetWindow, to
// follow clock drift and steps. Call its methods with the pacer's mutex
// held.
type clockOffset struct {
	lo    float64   // seconds: database clock minus local clock, lower bound
	since time.Time // local time lo was restarted
	set   bool
}

// offsetWindow is how long a bound is kept before it restarts.
const offsetWindow = time.Minute

// observe folds one round trip into the bound: at is the database's clock
// read during the statement, received the local time the reply came.
func (o *clockOffset) observe(at float64, received time.Time) {
	sample := at - timeToEpoch(received)
	if !o.set || received.Sub(o.since) > offsetWindow {
		o.lo, o.since, o.set = sample, received, true
		return
	}
	o.lo = max(o.lo, sample)
}

// local maps a database time to the local clock.
func (o *clockOffset) local(db float64) time.Time {
	return epochToTime(db - o.lo)
}
