package pacer

import (
	"context"
	"errors"
	"fmt"
	"github.com/fleetpace/fleetpace/redact"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// ErrNoSlot is wrapped by a *WaitError: no slot was to be had within the
// wait the caller allowed (its bound, its context's deadline), or the
// platform is paused. Nothing was reserved.
var ErrNoSlot = errors.New("pacer: no slot within the wait allowed")

// WaitError says why Acquire (or a request through Transport) got no slot:
// the earliest slot lies beyond what the caller allowed. It wraps ErrNoSlot.
type WaitError struct {
	// Platform is the platform asked for.
	Platform string
	// Wait is how long until the earliest slot, when it was asked (a pause
	// without an end: MaxHold).
	Wait time.Duration
	// MaxWait is what the caller allowed then: the smaller of its bound and
	// the time left before Deadline.
	MaxWait time.Duration
	// Deadline is the context's deadline when that was the tighter bound;
	// zero otherwise.
	Deadline time.Time
	// Paused: an operator paused the platform (Wait is until the pause ends).
	Paused bool
	// Degraded: decided locally, the database being unreachable.
	Degraded bool
	// Cause is why the database was unreachable when Degraded: the last
	// error of a connection attempt or statement (a wrong role, a refused
	// port, a timeout). Error shows it with passwords removed; errors.Is
	// and errors.As see it.
	Cause error
}

func (e *WaitError) Error() string {
	wait := e.Wait.Round(time.Millisecond)
	bound := fmt.Sprintf("the max wait (%s)", e.MaxWait.Round(time.Millisecond))
	if !e.Deadline.IsZero() {
		bound = fmt.Sprintf("the deadline (in %s)", e.MaxWait.Round(time.Millisecond))
	}
	switch {
	case e.Paused && e.Wait >= MaxHold:
		return fmt.Sprintf("pacer: no slot on %q: the platform is paused until resumed", e.Platform)
	case e.Paused:
		return fmt.Sprintf("pacer: no slot on %q: the platform is paused for %s, beyond %s", e.Platform, wait, bound)
	case e.Degraded:
		cause := "no cause recorded"
		if e.Cause != nil {
			cause = redact.Error(e.Cause).Error()
		}
		return fmt.Sprintf("pacer: no slot on %q within %s: the database is unreachable, so this process paces "+
			"locally (the next local slot is in %s; a platform it has never seen gets none): %s", e.Platform, bound, wait, cause)
	}
	return fmt.Sprintf("pacer: no slot on %q within %s: the next is in %s", e.Platform, bound, wait)
}

// Unwrap returns ErrNoSlot, and Cause when there is one.
func (e *WaitError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrNoSlot, e.Cause}
	}
	return []error{ErrNoSlot}
}

// Acquire reserves a slot on platform and sleeps until it, in all waiting
// at most maxWait and never past ctx's deadline: Wait with a bound, for a
// caller that must not wait long (a River job holding a worker, an HTTP
// request with a deadline). When the fleet slows down while it sleeps and
// the slot moves beyond the bound, or it wakes too late for the slot, it
// reserves again with what is left of the bound (the third late slot in a
// row is used, as Wait does). When the earliest slot lies beyond the bound
// it returns at once, with the denied reservation (Wait, Paused) and a
// *WaitError wrapping ErrNoSlot; nothing is reserved. While the database is
// unreachable it paces locally, as Reserve does. Other errors:
// ErrUnknownPlatform, ctx's error, a database error that is not an outage.
func (p *Pacer) Acquire(ctx context.Context, platform string, maxWait time.Duration) (Reservation, error) {
	return AcquireFrom(ctx, p, p.clock, platform, maxWait)
}

// Slotter is what Acquire needs of a pacer: reservations, and a sleep until
// a granted slot. *Pacer is one; a benchmark's pacer that paces locally can
// be another, and take the same path (AcquireFrom).
type Slotter interface {
	Reserve(ctx context.Context, platform string, maxWait time.Duration) (Reservation, error)
	Sleep(ctx context.Context, res *Reservation) error
}

// AcquireFrom is Acquire for any Slotter, waiting on c.
func AcquireFrom(ctx context.Context, s Slotter, c clock.Clock, platform string, maxWait time.Duration) (Reservation, error) {
	start := c.Now()
	deadline, hasDeadline := ctx.Deadline()
	late := 0
	for {
		left := maxWait - c.Since(start)
		var byDeadline time.Time
		if hasDeadline {
			if d := time.Until(deadline); d < left {
				left, byDeadline = d, deadline
			}
		}
		left = max(left, 0)
		res, err := s.Reserve(ctx, platform, left)
		if err != nil {
			return res, err
		}
		if !res.Granted {
			if (res.Retry || res.Degraded || res.Key != "") && !res.Paused && !res.behind && res.Wait < left {
				// Denied for a moment (the key's next slot, an open-request
				// cap, a key's hold that ends within the wait, no rate known
				// while the database is unreachable): ask again after the
				// wait, as Wait does.
				if err := clock.Sleep(ctx, c, max(res.Wait, time.Millisecond)); err != nil {
					return res, fmt.Errorf("pacer: acquire %s: %w", platform, err)
				}
				continue
			}
			werr := &WaitError{Platform: platform, Wait: res.Wait, MaxWait: left, Deadline: byDeadline,
				Paused: res.Paused, Degraded: res.Degraded}
			if p, ok := s.(*Pacer); ok && res.Degraded {
				werr.Cause = p.outageCause()
			}
			return res, werr
		}
		if done, err := afterSleep(ctx, s, res, s.Sleep(ctx, &res), &late); done {
			return res, err
		}
	}
}
