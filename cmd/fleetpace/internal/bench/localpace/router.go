package localpace

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/worker"
)

// local is one platform's local pacer.
type local interface {
	// reserve grants a slot at most maxWait away, or denies it with the
	// wait.
	reserve(now time.Time, maxWait time.Duration) (granted bool, slot time.Time, wait time.Duration)
	// sleep waits for the granted slot (and whatever else the pacer
	// waits for before a request).
	sleep(ctx context.Context, slot time.Time) error
	// report learns from an answer.
	report(now time.Time, out pacer.Feedback)
}

// Router paces the platforms of its specs locally and every other platform
// through the shared pacer. It implements worker.Pacer.
type Router struct {
	shared worker.Pacer
	clock  clock.Clock
	local  map[string]local
}

// NewRouter returns a Router in front of shared, on c (nil: the real
// clock). Two specs of one platform are an error.
func NewRouter(shared worker.Pacer, c clock.Clock, specs []Spec) (*Router, error) {
	r := &Router{shared: shared, clock: clock.Or(c), local: map[string]local{}}
	for _, sp := range specs {
		if _, dup := r.local[sp.Platform]; dup {
			return nil, fmt.Errorf("%w: platform %s named twice", ErrInvalidSpec, sp.Platform)
		}
		switch sp.Kind {
		case KindOracle:
			r.local[sp.Platform] = newOracle(r.clock, sp.Steps, sp.Phase)
		case KindAWS:
			r.local[sp.Platform] = newAWS(r.clock, sp.Steps[0].Rate)
		default:
			return nil, fmt.Errorf("%w: kind %q", ErrInvalidSpec, sp.Kind)
		}
	}
	return r, nil
}

// Acquire takes a slot and sleeps until it: locally for a local platform
// (never in the database, never degraded; pacer.AcquireFrom's rules over
// Reserve and Sleep), else through the shared pacer.
func (r *Router) Acquire(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error) {
	l, ok := r.local[platform]
	if !ok {
		return r.shared.Acquire(ctx, platform, maxWait)
	}
	if _, ok := l.(*oracle); ok {
		maxWait = max(maxWait, OracleMaxWait)
	}
	return pacer.AcquireFrom(ctx, r, r.clock, platform, maxWait)
}

// OracleMaxWait is the longest an oracle's caller sleeps for its slot,
// whatever its own max wait (but never past its context's deadline). With
// the workers' 1 s, a denied job snoozed and came back through River's
// scheduler while the oracle's slots went unused (at 10/s it delivered
// 7.8/s, with nothing refused). With 30 s, one process took more of the
// platform's jobs than its share of slots could serve in time, while
// another ran short of jobs and left its share unused (0.78–0.84 of
// strict-40 in two runs of three, with three times the others' sources).
// With 5 s, a process holds at most 5 s of its share: the rest goes back
// to River, to whichever process fetches next (0.96–0.97 of strict-40,
// 0.92–0.96 of bucket10-50, 2 runs each). A reference has a caller for
// every slot.
const OracleMaxWait = 5 * time.Second

// Reserve reserves a slot of a local platform.
func (r *Router) Reserve(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error) {
	l, ok := r.local[platform]
	if !ok {
		return pacer.Reservation{}, fmt.Errorf("localpace: %s is not paced locally", platform)
	}
	if err := ctx.Err(); err != nil {
		return pacer.Reservation{}, err
	}
	granted, slot, wait := l.reserve(r.clock.Now(), maxWait)
	return pacer.Reservation{Platform: platform, Granted: granted, Wait: wait, Slot: slot}, nil
}

// Sleep waits for a granted slot of a local platform.
func (r *Router) Sleep(ctx context.Context, res *pacer.Reservation) error {
	l, ok := r.local[res.Platform]
	if !ok {
		return fmt.Errorf("localpace: %s is not paced locally", res.Platform)
	}
	if !res.Granted {
		return fmt.Errorf("localpace: sleep %s: the reservation was not granted", res.Platform)
	}
	if err := l.sleep(ctx, res.Slot); err != nil {
		return fmt.Errorf("localpace: sleep %s: %w", res.Platform, err)
	}
	if late := r.clock.Now().Sub(res.Slot); late > 0 {
		res.Late = late
	}
	return nil
}

// Report tells the platform's pacer what the destination answered.
func (r *Router) Report(ctx context.Context, platform string, res pacer.Reservation, out pacer.Feedback) (pacer.ReportResult, error) {
	l, ok := r.local[platform]
	if !ok {
		return r.shared.Report(ctx, platform, res, out)
	}
	l.report(r.clock.Now(), out)
	return pacer.ReportResult{}, nil
}

// gcra spaces slots 1/rate apart, never two at once (burst 1).
type gcra struct {
	tat time.Time // the earliest next slot
}

// next is the slot a request arriving at now would get.
func (g *gcra) next(now time.Time) time.Time {
	if g.tat.After(now) {
		return g.tat
	}
	return now
}

// take takes slot, spacing the next one 1/rate after it.
func (g *gcra) take(slot time.Time, rate float64) {
	g.tat = slot.Add(time.Duration(float64(time.Second) / rate))
}
