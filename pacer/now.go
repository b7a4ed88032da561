package pacer

import (
	"context"
	"time"
)

// The shared statements read the time from the database's clock, one clock
// for the whole fleet, unless they are given one: a Pacer with
// Config.TimeFromClock passes its Clock's time with every statement, and
// the package's functions (Pause, Hold, ClearHold, States…) take the time
// from their context (WithTime), so that tests run the whole fleet on one
// fake clock.

type timeKey struct{}

// WithTime returns ctx carrying now as the time the package's functions
// (Pause, PauseFor, Hold, ClearHold, States, StatesOf) give their
// statements instead of the database's clock: for tests on a fake clock
// (Config.TimeFromClock). Production code never needs it.
func WithTime(ctx context.Context, now time.Time) context.Context {
	return context.WithValue(ctx, timeKey{}, now)
}

// statementTime is the time ctx carries for a statement: epoch seconds, or
// nil for the database's clock.
func statementTime(ctx context.Context) any {
	if t, ok := ctx.Value(timeKey{}).(time.Time); ok {
		return timeToEpoch(t)
	}
	return nil
}

// stmtNow is the time this pacer gives its statements: its clock's with
// Config.TimeFromClock, else nil (the database's clock).
func (p *Pacer) stmtNow() any {
	if p.cfg.TimeFromClock {
		return timeToEpoch(p.clock.Now())
	}
	return nil
}

// withTime is ctx carrying this pacer's statement time, if it has one.
func (p *Pacer) withTime(ctx context.Context) context.Context {
	if p.cfg.TimeFromClock {
		return WithTime(ctx, p.clock.Now())
	}
	return ctx
}
