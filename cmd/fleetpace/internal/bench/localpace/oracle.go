package localpace

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/pacer"
)

// oracle paces at fixed rates (Steps), no adaptation, on a grid of its
// spacing shifted by its phase: what a process of a fleet that knew the
// destination's allowance, its share of it and its turn would do.
type oracle struct {
	clock clock.Clock
	steps []Step
	phase float64

	mu   sync.Mutex
	next time.Time // the earliest next slot
}

func newOracle(c clock.Clock, steps []Step, phase float64) *oracle {
	return &oracle{clock: c, steps: steps, phase: phase}
}

// stepAt is the step in force at t, and its grid's origin.
func (o *oracle) stepAt(t time.Time) (rate float64, origin time.Time) {
	rate, origin = o.steps[0].Rate, time.Unix(0, 0)
	for _, st := range o.steps[1:] {
		if !t.Before(st.From) {
			rate, origin = st.Rate, st.From
		}
	}
	return rate, origin
}

// onGrid is the first slot at or after t of the grid in force at t: the
// step's origin + (k + phase) spacings, in whole nanoseconds (every
// process computes the same grid). A step that starts before that slot
// puts it on its own grid instead.
func (o *oracle) onGrid(t time.Time) time.Time {
	rate, origin := o.stepAt(t)
	spacing := int64(math.Round(float64(time.Second) / rate))
	shift := int64(o.phase * float64(spacing))
	off := t.Sub(origin).Nanoseconds() - shift
	k := off / spacing
	if k*spacing < off {
		k++
	}
	slot := origin.Add(time.Duration(shift + k*spacing))
	for _, st := range o.steps[1:] {
		if st.From.After(t) && !slot.Before(st.From) {
			return o.onGrid(st.From)
		}
	}
	return slot
}

func (o *oracle) reserve(now time.Time, maxWait time.Duration) (bool, time.Time, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	slot := o.onGrid(later(now, o.next))
	if wait := slot.Sub(now); wait > maxWait {
		return false, slot, wait
	}
	o.next = slot.Add(time.Nanosecond) // the grid's next point
	return true, slot, slot.Sub(now)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (o *oracle) sleep(ctx context.Context, slot time.Time) error {
	return clock.Sleep(ctx, o.clock, slot.Sub(o.clock.Now()))
}

func (o *oracle) report(time.Time, pacer.Feedback) {}
