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
		r, err := sleepLate(t, url, tc.platform, tc.late)
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

// A fast platform pays for lateness with its burst: at 500/s (2 ms apart)
// and burst 10 a reservation holds 2 burst slots back (LateSlack 5 ms ÷ 2
// ms, rounded to half a spacing), so after an idle spell 8 slots are
// immediate and the 10th is two spacings out — and a request may leave 5 ms
// late (2.5 spacings) instead of 1 ms: a 1-s window still counts at most
// rate + burst. Judged on database times and on the injected clock.
func TestFastPlatformHoldsBurstForLateness(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "fast500", rate: 500, burst: 10})
	p := newPacer(t, url, func(c *Config) { c.MaxBlock = 1 })
	rs := reserveN(t, p, "fast500", 10)
	if r := rs[7]; r.Slot.After(r.ReservedAt) {
		t.Fatalf("slot 8 is %s after its reservation, want immediate (burst 10, 2 held back)", r.Slot.Sub(r.ReservedAt))
	}
	if gap := rs[9].Slot.Sub(rs[0].ReservedAt); gap < 3500*time.Microsecond {
		t.Fatalf("slot 10 only %s after the first reservation, want ≥ 2 spacings (4 ms): the burst was not held back", gap)
	}
	for _, tc := range []struct {
		late time.Duration
		want bool // ErrLate
	}{{4900 * time.Microsecond, false}, {5100 * time.Microsecond, true}} {
		r, err := sleepLate(t, url, "fast500", tc.late)
		if got := errors.Is(err, ErrLate); got != tc.want {
			t.Fatalf("woke %s late at 500/s, burst 10: err %v, want ErrLate %v (late %s)", tc.late, err, tc.want, r.Late)
		}
	}
}

// An idle process closes its listener after ListenIdle (no reservation, no
// caller sleeping on a slot), and its next reservation starts it again at
// once (no latch period: closing while idle is not a failure).
func TestListenerClosesWhileIdle(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "idle", rate: 10})
	p := newPacer(t, url, func(c *Config) { c.ListenIdle = 300 * time.Millisecond })
	reserveN(t, p, "idle", 1)
	waitFor(t, "the listener", func() bool { return p.Stats().Listening })
	waitFor(t, "the listener to close while idle", func() bool { return !p.Stats().Listening })
	reserveN(t, p, "idle", 1)
	waitFor(t, "the listener again", func() bool { return p.Stats().Listening })
}

// sleepLate reserves a slot on platform with a fresh pacer on the injected
// clock, advances the clock to late after the slot and returns what Sleep
// says. Lateness counts from the slot's database time, and the statement
// reads the database clock for the slot before it reads it for ReservedAt:
// an immediate slot is already ReservedAt − Slot late when the reply comes
// (Wait is 0 then; on a loaded machine that can be a tenth of a
// millisecond). The clock is advanced by Slot − ReservedAt + late, so the
// caller wakes exactly late after the slot; a reservation whose reply alone
// came later than that is tried again.
func sleepLate(t *testing.T, url, platform string, late time.Duration) (Reservation, error) {
	t.Helper()
	for range 10 {
		clock := clocktest.New()
		p := newPacer(t, url, func(c *Config) { c.Clock = clock; c.MaxBlock = 1 })
		r, err := p.Reserve(context.Background(), platform, time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("reserve: %+v %v", r, err)
		}
		d := r.Slot.Sub(r.ReservedAt) + late
		if d < 0 {
			t.Logf("the reply came %s after the slot, more than %s: again", r.ReservedAt.Sub(r.Slot), late)
			continue
		}
		clock.Advance(d)
		err = p.Sleep(context.Background(), &r)
		return r, err
	}
	t.Fatalf("ten replies came more than %s after their slots", late)
	return Reservation{}, nil
}
