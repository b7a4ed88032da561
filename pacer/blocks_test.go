package pacer

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// reserveN makes n reservations that must all be granted and returns them.
func reserveN(t *testing.T, p *Pacer, platform string, n int) []Reservation {
	t.Helper()
	out := make([]Reservation, 0, n)
	for range n {
		r, err := p.Reserve(context.Background(), platform, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Granted || r.Degraded {
			t.Fatalf("reservation not granted: %+v", r)
		}
		out = append(out, r)
	}
	return out
}

// reportClean reports n clean responses for platform.
func reportClean(t *testing.T, p *Pacer, platform string, n int) {
	t.Helper()
	for range n {
		if _, err := p.Report(context.Background(), platform, Reservation{}, Feedback{Kind: Clean}); err != nil {
			t.Fatal(err)
		}
	}
}

// When the interval is shorter than a round trip, one statement reserves a
// block and later calls take its slots without a round trip — the very slots
// single reservations would have got: distinct, spaced by the interval, and
// ending where the shared cursor stands.
func TestBlocksHandOutExactSlots(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "fast", rate: 1e5})
	// The injected clock stands still, and the statements take their time
	// from it: no kept slot turns late (10 µs apart, a loaded machine would
	// otherwise discard some; TestLateBlockSlotsDiscarded). On the
	// database's clock, a block's slots were mapped to the frozen clock by
	// an offset that moved with each slow round trip, and a slow machine
	// discarded a whole block so. No refill: the blocks are taken where the
	// kept slots run out (TestBlockRefilledAhead).
	p := newPacer(t, url, func(c *Config) { c.MaxBlock = 8; c.Clock = clocktest.New(); c.TimeFromClock = true })
	p.noRefill = true

	// 1 (block size unknown: one slot) + 8 + 8 slots from three statements.
	rs := reserveN(t, p, "fast", 17)
	if st := p.Stats(); st.FromBlock != 14 || st.Granted != 17 {
		t.Fatalf("stats %+v: want 14 of 17 grants from blocks", st)
	}
	slots := make([]float64, len(rs))
	for i, r := range rs {
		slots[i] = timeToEpoch(r.Slot)
		if i > 1 && i != 9 && !r.FromBlock {
			t.Fatalf("reservation %d made a round trip", i)
		}
	}
	checkExactSlots(t, pool, "fast", slots, 1e-5)

	// MaxBlock 1: every reservation is its own statement.
	one := newPacer(t, url, func(c *Config) { c.MaxBlock = 1 })
	reserveN(t, one, "fast", 5)
	if st := one.Stats(); st.FromBlock != 0 {
		t.Fatalf("MaxBlock 1: %d grants from blocks", st.FromBlock)
	}
}

// A process takes its next block while half of the one kept is left, in
// the background, so that callers at a high rate do not wait for a round
// trip each time a block runs out; the slots are still exactly the row's,
// none handed out twice or lost. Without the refill every eighth call made
// a round trip.
func TestBlockRefilledAhead(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "fast", rate: 1e5}, platformSpec{name: "naive", rate: 1e5})
	for _, refill := range []bool{true, false} {
		platform := "fast"
		if !refill {
			platform = "naive"
		}
		p := newPacer(t, url, func(c *Config) { c.MaxBlock = 8; c.Clock = clocktest.New(); c.TimeFromClock = true })
		p.noRefill = !refill
		var trips []int
		var slots []float64
		for i := range 40 {
			r := reserveN(t, p, platform, 1)[0]
			if !r.FromBlock {
				trips = append(trips, i)
			}
			slots = append(slots, timeToEpoch(r.Slot))
			refillLanded(t, p, platform)
		}
		if !refill {
			if len(trips) < 5 {
				t.Fatalf("control without refill: round trips at calls %v, want every eighth", trips)
			}
			continue
		}
		// The first call takes one slot, the second a block; the rest come
		// from blocks taken ahead.
		if len(trips) != 2 {
			t.Fatalf("round trips at calls %v, want only the first two", trips)
		}
		if st := p.Stats(); st.Refills == 0 {
			t.Fatalf("stats %+v: no refill", st)
		}
		// Handed out and kept: every slot the row granted, none twice.
		p.mu.Lock()
		for _, b := range p.local["fast"].block {
			slots = append(slots, b.slot)
		}
		p.mu.Unlock()
		checkExactSlots(t, pool, "fast", slots, 1e-5)
	}
}

// checkExactSlots checks that slots (sorted here) are spaced at least
// interval apart and that the platform's cursor stands one interval past
// the last: nothing reserved was lost or booked twice.
func checkExactSlots(t *testing.T, pool *pgxpool.Pool, platform string, slots []float64, interval float64) {
	t.Helper()
	sort.Float64s(slots)
	const eps = 5e-7 // epoch seconds as float64 resolve about 0.25 µs
	for i := 1; i < len(slots); i++ {
		if gap := slots[i] - slots[i-1]; gap < interval-eps {
			t.Fatalf("slots %d and %d %.3gs apart, closer than the %gs interval", i-1, i, gap, interval)
		}
	}
	if row := readRow(t, pool, platform); row.cursor < slots[len(slots)-1]+interval-eps ||
		row.cursor > slots[len(slots)-1]+interval+eps {
		t.Fatalf("cursor %.6f, last slot %.6f: want one interval after it", row.cursor, slots[len(slots)-1])
	}
}

// refillLanded waits until no block statement of platform is on its way.
func refillLanded(t *testing.T, p *Pacer, platform string) {
	t.Helper()
	p.mu.Lock()
	var fetching chan struct{}
	if st := p.local[platform]; st != nil {
		fetching = st.fetching
	}
	p.mu.Unlock()
	if fetching == nil {
		return
	}
	select {
	case <-fetching:
	case <-time.After(10 * time.Second):
		t.Fatal("a block refill did not land in 10 s")
	}
}

// Rate pressure discards the slots kept from a block: they were spaced for
// the multiplier the pressure has just doubled.
func TestPressureDropsBlock(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "fast", rate: 1e6})
	p := newPacer(t, url, func(c *Config) { c.MaxBlock = 8 })
	rs := reserveN(t, p, "fast", 2) // the second took a block of 8 and kept 7
	if _, err := p.Report(context.Background(), "fast", rs[1], Feedback{Kind: Pressure}); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.BlockDiscarded != 7 {
		t.Fatalf("%d slots discarded, want the 7 kept", st.BlockDiscarded)
	}
	r := reserveN(t, p, "fast", 1)[0]
	if r.FromBlock || r.Multiplier != 2 {
		t.Fatalf("after pressure: %+v, want a fresh reservation at multiplier 2", r)
	}
}

// A kept slot later than its tolerance (by the injected clock; at 1e6/s
// half the spacing is less than MaxLate) is discarded, not handed out:
// sending late would crowd the slots after it.
func TestLateBlockSlotsDiscarded(t *testing.T) {
	t.Parallel()
	url, _ := setup(t, platformSpec{name: "fast", rate: 1e6})
	clock := clocktest.New()
	// MaxLate 20 ms, not the default 1 ms: on the database's clock the kept
	// slots' times were read up to the statement's duration before its
	// reply, and on a loaded machine that was more than 0.5 ms (a kept slot
	// then read as late before the clock moved). The statements take their
	// time from the injected clock now, so no round trip moves the kept
	// slots' mapping either.
	p := newPacer(t, url, func(c *Config) {
		c.MaxBlock = 8
		c.Clock = clock
		c.LateBudget = 20 * time.Millisecond
		c.TimeFromClock = true
	})
	reserveN(t, p, "fast", 3) // one single, one block: 6 kept
	clock.Advance(10 * time.Millisecond)
	if r := reserveN(t, p, "fast", 1)[0]; !r.FromBlock {
		t.Fatalf("10 ms late (MaxLate 20 ms): %+v, want a kept slot", r)
	}
	clock.Advance(20 * time.Millisecond)
	if r := reserveN(t, p, "fast", 1)[0]; r.FromBlock {
		t.Fatalf("30 ms late: %+v, want a fresh reservation", r)
	}
	if st := p.Stats(); st.BlockDiscarded != 5 {
		t.Fatalf("%d slots discarded, want 5", st.BlockDiscarded)
	}
}

// Clean reports are gathered and sent as one statement: the streak counts
// every one of them (several halvings at once when it must), pressure drops
// the ones gathered before it, and Close sends what is left.
func TestCleanReportsBatched(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	ctx := context.Background()
	addPlatform(t, pool, platformSpec{name: "batch", rate: 100, maxMult: 16, decayAfter: 10})
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET multiplier = 8 WHERE platform = 'batch'`); err != nil {
		t.Fatal(err)
	}
	p := newPacer(t, url, func(c *Config) { c.CleanBatch = time.Hour })
	for range 25 {
		rep, err := p.Report(ctx, "batch", Reservation{}, Feedback{Kind: Clean})
		if err != nil || !rep.Deferred {
			t.Fatalf("clean report: %+v %v, want deferred", rep, err)
		}
	}
	if row := readRow(t, pool, "batch"); row.streak != 0 || row.mult != 8 {
		t.Fatalf("before the flush: streak %d multiplier %g, want nothing sent yet", row.streak, row.mult)
	}
	p.Flush(ctx)
	if row := readRow(t, pool, "batch"); row.streak != 5 || row.mult != 2 {
		t.Fatalf("25 clean reports, decay after 10: streak %d multiplier %g, want 5 and 8/2/2 = 2", row.streak, row.mult)
	}

	// Pressure resets the streak, and clean reports gathered before it do
	// not count after it.
	reportClean(t, p, "batch", 3)
	rep, err := p.Report(ctx, "batch", Reservation{}, Feedback{Kind: Pressure})
	if err != nil || rep.Deferred || !rep.Increased {
		t.Fatalf("pressure: %+v %v, want sent at once and doubled", rep, err)
	}
	p.Flush(ctx)
	if row := readRow(t, pool, "batch"); row.streak != 0 || row.mult != 4 {
		t.Fatalf("after pressure: streak %d multiplier %g, want 0 and 4", row.streak, row.mult)
	}

	// Close sends what is pending.
	reportClean(t, p, "batch", 4)
	p.Close()
	if row := readRow(t, pool, "batch"); row.streak != 4 {
		t.Fatalf("after Close: streak %d, want the 4 pending reports sent", row.streak)
	}
}

// Without Flush, a batch goes out after CleanBatch by itself.
func TestCleanBatchTimer(t *testing.T) {
	t.Parallel()
	url, pool := setup(t, platformSpec{name: "timer", rate: 100})
	p := newPacer(t, url, func(c *Config) { c.CleanBatch = 50 * time.Millisecond })
	reportClean(t, p, "timer", 3)
	deadline := time.Now().Add(10 * time.Second)
	for readRow(t, pool, "timer").streak != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("streak %d 10 s after 3 clean reports with a 50 ms batch", readRow(t, pool, "timer").streak)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Lowering a platform's maximum multiplier caps the shared multiplier at
// once: reservations read it as it stands.
func TestLowerMaxMultiplierCapsMultiplier(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	ctx := context.Background()
	addPlatform(t, pool, platformSpec{name: "cap", rate: 10, maxMult: 16})
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_pace SET multiplier = 8 WHERE platform = 'cap'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE fleetpace_platform SET max_multiplier = 2 WHERE name = 'cap'`); err != nil {
		t.Fatal(err)
	}
	p := newPacer(t, url, nil)
	a := reserveN(t, p, "cap", 1)[0]
	b := reserveN(t, p, "cap", 1)[0]
	// (More than 205 ms apart only when the second reservation itself came
	// later than that: its slot is then immediate.)
	if gap := b.Slot.Sub(a.Slot); a.Multiplier != 2 || gap < 195*time.Millisecond || gap > 205*time.Millisecond && b.Slot.After(b.ReservedAt) {
		t.Fatalf("multiplier %g, slots %s apart: want 2 and 200 ms (10/s halved)", a.Multiplier, gap)
	}
}
