// Package clocktest is the fake clock of fleetpace's tests: a
// clockwork.FakeClock with a helper that waits for sleepers, so a test
// advances time only once the code under test is waiting on the clock.
package clocktest

import (
	"context"
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
