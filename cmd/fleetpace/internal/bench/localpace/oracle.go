package localpace

import (
	"context"
	"sync"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/pacer"
)

// oracle paces at fixed rates (Steps), no adaptation: what a process of a
// fleet that knew the destination's allowance, and its share of it, would
// do.
type oracle struct {
	clock clock.Clock
	steps []Step

	mu   sync.Mutex
	gcra gcra
}

func newOracle(c clock.Clock, steps []Step) *oracle { return &oracle{clock: c, steps: steps} }

// rateAt is the rate in force at t.
func (o *oracle) rateAt(t time.Time) float64 {
	r := o.steps[0].Rate
	for _, st := range o.steps[1:] {
		if !t.Before(st.From) {
			r = st.Rate
		}
	}
	return r
}

func (o *oracle) reserve(now time.Time, maxWait time.Duration) (bool, time.Time, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	slot := o.gcra.next(now)
	if wait := slot.Sub(now); wait > maxWait {
		return false, slot, wait
	}
	o.gcra.take(slot, o.rateAt(slot))
	return true, slot, slot.Sub(now)
}

func (o *oracle) sleep(ctx context.Context, slot time.Time) error {
	return clock.Sleep(ctx, o.clock, slot.Sub(o.clock.Now()))
}

func (o *oracle) report(time.Time, pacer.Feedback) {}
