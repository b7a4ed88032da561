package pacer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// The offset bracket: a slow round trip leaves a wide bracket, whose width
// beyond the network's floor (the narrowest round trip of the last minutes)
// is lateness a caller woken on time may have (the slot is mapped at its
// latest); a tight round trip narrows it; a sample outside the bracket (a
// clock stepped) or a minute later restarts it. A database far away widens
// every round trip alike: that is the floor, no lateness (counted, every
// request of a fleet 20 ms from its database was late).
func TestClockOffsetBracket(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	db := func(d time.Duration) float64 { return timeToEpoch(base.Add(d)) } // the database's clock: the local one + 10 ms
	var o clockOffset
	ms := func(d time.Duration) string { return d.Round(time.Microsecond).String() }
	near := func(d, want time.Duration) bool { return (d - want).Abs() < time.Microsecond }

	// A 2-ms round trip: the network's floor, no lateness.
	o.observe(db(11*time.Millisecond), base, base.Add(2*time.Millisecond))
	if u := o.uncertainty(); !near(u, 0) {
		t.Fatalf("after a 2-ms round trip: uncertainty %s, want 0", ms(u))
	}
	// A minute later, sent at 0, read by the database at 1 ms, received at
	// 50 ms (a loaded machine): the bracket restarts, 48 ms wider than the
	// floor.
	m := time.Minute + time.Second
	o.observe(db(m+11*time.Millisecond), base.Add(m), base.Add(m+50*time.Millisecond))
	if u := o.uncertainty(); !near(u, 48*time.Millisecond) {
		t.Fatalf("after a 50-ms round trip: uncertainty %s, want 48ms", ms(u))
	}
	if got := o.local(db(m + 100*time.Millisecond)); got.Before(base.Add(m + 90*time.Millisecond)) {
		t.Fatalf("a slot mapped to %s before its true local time (90ms): early", got.Sub(base.Add(m)))
	}
	// A 2-ms round trip a second later narrows it to 2 ms around the truth.
	m += time.Second
	o.observe(db(m+11*time.Millisecond), base.Add(m), base.Add(m+2*time.Millisecond))
	if u := o.uncertainty(); !near(u, 0) {
		t.Fatalf("after a 2-ms round trip: uncertainty %s, want 0", ms(u))
	}
	if got := o.local(db(m + 100*time.Millisecond)).Sub(base.Add(m)); got < 90*time.Millisecond-time.Microsecond || got > 92*time.Millisecond+time.Microsecond {
		t.Fatalf("a slot mapped to %s, want within [90ms, 92ms]", ms(got))
	}
	// The local clock steps 1 s back: the sample is outside the bracket and
	// restarts it.
	o.observe(db(m+time.Second+10*time.Millisecond), base.Add(m), base.Add(m+time.Millisecond))
	if got := o.local(db(m + time.Second + 10*time.Millisecond)).Sub(base.Add(m)); got < -time.Microsecond || got > time.Millisecond+time.Microsecond {
		t.Fatalf("after a step: mapped to %s, want within [0, 1ms]", ms(got))
	}

	// A database 20 ms away (10 ms each way): every round trip is 20 ms,
	// the floor; nothing counts as lateness, and the slot is mapped at
	// most the return's 10 ms after its true local time, never before it.
	var far clockOffset
	for i := range 5 {
		at := base.Add(time.Duration(i) * 10 * time.Second)
		far.observe(db(at.Sub(base)+20*time.Millisecond), at, at.Add(20*time.Millisecond))
		if u := far.uncertainty(); !near(u, 0) {
			t.Fatalf("far database, round trip %d: uncertainty %s, want 0 (the floor)", i, ms(u))
		}
	}
	if got := far.local(db(time.Second)).Sub(base); got < 990*time.Millisecond || got > time.Second {
		t.Fatalf("far database: a slot mapped to %s, want within [990ms, 1s]", ms(got))
	}
	// The floor remembers 5–10 minutes: after a 2-ms era, 20-ms round trips
	// count 18 ms for a while, then are the network's new floor.
	var moved clockOffset
	moved.observe(db(11*time.Millisecond), base, base.Add(2*time.Millisecond))
	for i := 1; i <= 12; i++ {
		at := base.Add(time.Duration(i) * time.Minute)
		moved.observe(db(at.Sub(base)+20*time.Millisecond), at, at.Add(20*time.Millisecond))
		want := 18 * time.Millisecond
		if i > 10 {
			want = 0
		}
		if u := moved.uncertainty(); !near(u, want) {
			t.Fatalf("minute %d of 20-ms round trips after 2-ms ones: uncertainty %s, want %s", i, ms(u), ms(want))
		}
	}
}

// A slot is mapped to the local clock with the bracket Sleep counts its
// lateness with: when the bracket moved after the reservation (a slow first
// round trip left it wide and later ones narrowed it, or a clock stepped),
// the caller wakes at the slot's newest local time and its SendBy is that
// plus the tolerance. Mapped with the reservation's bracket, the caller
// woke and sent up to the bracket's change past its true slot (46 ms after
// a slot at 40/s + burst 2, SendBy 65 ms after it, in a 1-s window of 43).
func TestSleepMapsTheSlotWithTheNewestBracket(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: "eight", rate: 8, burst: 1}) // spacing 125 ms, tolerance 62 ms
	clk := clocktest.New()
	// The database's own clock: the bracket maps it to clk.
	p := newPacer(t, url, func(c *Config) { c.Clock, c.MaxBlock = clk, 1 })
	ctx := context.Background()
	first, err := p.Reserve(ctx, "eight", time.Minute)
	if err != nil || !first.Granted {
		t.Fatalf("%+v %v", first, err)
	}
	second, err := p.Reserve(ctx, "eight", time.Minute)
	if err != nil || !second.Granted || second.Slot.Sub(first.Slot) != 125*time.Millisecond {
		t.Fatalf("%+v %v", second, err)
	}
	// The bracket now says the database's clock is 100 ms further ahead
	// than it said: the slots are 100 ms earlier in local time than mapped.
	const ahead = 100 * time.Millisecond
	p.mu.Lock()
	p.offset.lo += ahead.Seconds()
	p.offset.hi += ahead.Seconds()
	unsure := p.offset.uncertainty()
	p.mu.Unlock()
	tol := p.tuning.lateTolerance(8, 1, 0.125)

	// The first slot is 100 ms past at its old mapping: later than its
	// tolerance.
	clk.Advance(max(first.due.Sub(clk.Now()), 0))
	if err := p.Sleep(ctx, &first); !errors.Is(err, ErrLate) {
		t.Fatalf("a slot 100 ms past (tolerance %s): Sleep %v, SendBy %s after the slot; want ErrLate",
			tol, err, first.SendBy.Sub(first.due.Add(-ahead)))
	}
	// The second goes 5 ms after its new local time, by that time + the
	// tolerance (less the bracket's width).
	due := second.due.Add(-ahead)
	clk.Advance(max(due.Add(5*time.Millisecond).Sub(clk.Now()), 0))
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a caller asleep on the old mapping never wakes on the fake clock
	defer cancel()
	if err := p.Sleep(sctx, &second); err != nil {
		t.Fatalf("5 ms after the slot's new local time: %v", err)
	}
	if want := due.Add(tol - unsure); second.SendBy.Sub(want).Abs() > time.Microsecond {
		t.Fatalf("SendBy %s after the slot, want %s", second.SendBy.Sub(due), tol-unsure)
	}
}

// The clock bracket of a reservation is read where its statement is
// written and its reply read, not where the caller runs again: a caller
// woken late after a key batch's reply (a loaded machine; here the clock
// moves 50 ms in between) would bracket an offset that excludes the true
// one and map its slot, and every slot of the next minute, 50 ms late.
func TestBracketIsReadAtTheReply(t *testing.T) {
	t.Parallel()
	url, _, clk := keyed(t, "api", 40, 1000)
	// The database's own clock: the bracket maps it to clk.
	p := newPacer(t, url, func(c *Config) { c.Clock, c.MaxBlock = clk, 1 })
	ctx := context.Background()
	if _, err := p.ReserveKey(ctx, "api", "k", time.Minute); err != nil { // the key's row
		t.Fatal(err)
	}
	p.batchAnswered = func() { clk.Advance(50 * time.Millisecond) }
	for i := range 3 {
		sent := clk.Now()
		r, err := p.ReserveKey(ctx, "api", "k", time.Minute)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		// The slot's local time: its distance from the database's reading,
		// from when the statement left (the fake clock stood still while it ran).
		if got, want := r.due, sent.Add(r.Slot.Sub(r.ReservedAt)); got.Sub(want).Abs() > time.Millisecond {
			t.Fatalf("reservation %d: slot mapped %s from where it is", i, got.Sub(want))
		}
	}
}
