// Package clock is the one clock of fleetpace: every time-based package
// (pacer, poller, fetch, worker, queue) reads the time, sleeps and sets
// timers through a Clock, so tests drive all of them with one fake
// (internal/clocktest) instead of sleeping.
//
// Clock is github.com/jonboulle/clockwork's interface; Real is the system
// clock. Sleep adds what clockwork lacks: a sleep that ends with its context.
package clock

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"
)

// Clock reads the time and makes timers. The zero value of a Config field of
// this type means Real().
type Clock = clockwork.Clock

// Timer is a timer made by a Clock.
type Timer = clockwork.Timer

// Real returns the system clock.
func Real() Clock { return real }

var real = clockwork.NewRealClock()

// Or returns c, or the system clock when c is nil: for Config defaults.
func Or(c Clock) Clock {
	if c == nil {
		return real
	}
	return c
}

// Sleep blocks for d on c or until ctx ends. It returns ctx.Err() if ctx
// ended first (checked before sleeping, so a cancelled ctx never sleeps)
// and nil otherwise; d ≤ 0 returns at once.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.Chan():
		return nil
	}
}
