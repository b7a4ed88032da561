// Package clocktest is the fake clock of fleetpace's tests: a
// clockwork.FakeClock with a helper that waits for sleepers, so a test
// advances time only once the code under test is waiting on the clock.
package clocktest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// Fake is a fake clock; it implements clock.Clock.
type Fake = clockwork.FakeClock

// New returns a fake clock set to a fixed, arbitrary instant.
func New() *Fake {
	return clockwork.NewFakeClockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// WaitSleepers blocks until n timers, sleeps or tickers wait on c, failing
// the test if that does not happen within 10 s (real time).
func WaitSleepers(t testing.TB, c *Fake, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.BlockUntilContext(ctx, n); err != nil {
		t.Fatalf("clocktest: %d sleeper(s) did not appear on the fake clock: %v", n, err)
	}
}

// Auto is a fake clock that advances itself, at once, to the end of every
// timer made on it, and records each timer's duration: code that sleeps on
// it in one goroutine (a polling loop) runs its whole schedule without
// waiting, in virtual time. Timers made by other goroutines fire early
// with it; use a Fake and advance it by hand there.
type Auto struct {
	*Fake
	start time.Time

	mu     sync.Mutex
	sleeps []time.Duration
}

// NewAuto returns an Auto clock set to New's instant.
func NewAuto() *Auto {
	f := New()
	return &Auto{Fake: f, start: f.Now()}
}

// NewTimer makes a timer of d and advances the clock by d, so the timer has
// fired when NewTimer returns.
func (a *Auto) NewTimer(d time.Duration) clockwork.Timer {
	a.mu.Lock()
	a.sleeps = append(a.sleeps, d)
	a.mu.Unlock()
	t := a.Fake.NewTimer(d)
	a.Fake.Advance(d)
	return t
}

// Sleeps returns the duration of every timer made so far, in order.
func (a *Auto) Sleeps() []time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.sleeps)
}

// Elapsed is the virtual time since the clock was made.
func (a *Auto) Elapsed() time.Duration { return a.Now().Sub(a.start) }
