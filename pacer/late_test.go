package pacer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// A caller that wakes up later than half its slot's spacing gives the slot
// up: at 40/s (25 ms apart) 13 ms late is too late — a request sent then
// lands closer to the next slot than to its own, and a destination counting
// 41 a second (rate + burst 1) would see 42 — while 12 ms is not. The burst
// gives no more room (see lateTolerance): at burst 4 the same. Judged on
// the injected clock, against the slot's time mapped from the database.
func TestLateToleranceIsHalfTheInterval(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "forty", rate: 40, burst: 1})
	addPlatform(t, pool, platformSpec{name: "forty-b4", rate: 40, burst: 4})
	for _, tc := range []struct {
		platform string
		late     time.Duration
		want     bool // ErrLate
	}{
		{"forty", 12 * time.Millisecond, false}, {"forty", 13 * time.Millisecond, true},
		{"forty-b4", 12 * time.Millisecond, false}, {"forty-b4", 13 * time.Millisecond, true},
	} {
		clock := clocktest.New()
		p := newPacer(t, url, func(c *Config) { c.Clock = clock; c.MaxBlock = 1 })
		r, err := p.Reserve(context.Background(), tc.platform, time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("reserve: %+v %v", r, err)
		}
		clock.Advance(r.Wait + tc.late)
		err = p.Sleep(context.Background(), &r)
		if got := errors.Is(err, ErrLate); got != tc.want {
			t.Fatalf("%s: woke %s late at a 25-ms spacing: err %v, want ErrLate %v (late %s)", tc.platform, tc.late, err, tc.want, r.Late)
		}
	}
}

// A block covers this process's share of a round trip: the fleet's slots
// are split among its processes, so a process of a large fleet takes no
// block at all where a process alone takes MaxBlock — slots it would not
// hand out before they are late would be lost to every process.
func TestBlockSizeFollowsFleetShare(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "share", rate: 1e6})
	alone := newPacer(t, url, func(c *Config) { c.MaxBlock = 8 })
	reserveN(t, alone, "share", 2) // the first learns the interval
	if kept := alone.blockSlots.Load(); kept != 7 {
		t.Fatalf("alone: %d slots kept, want a block of 8 (7 kept)", kept)
	}
	many := newPacer(t, url, func(c *Config) { c.MaxBlock = 8 })
	many.SetFleetSize(1_000_000) // a million processes share 1e6/s: 1 s each
	reserveN(t, many, "share", 2)
	if kept := many.blockSlots.Load(); kept != 0 {
		t.Fatalf("in a large fleet: %d slots kept, want no block", kept)
	}
}
