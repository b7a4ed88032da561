package pacer

import (
	"testing"
	"time"
)

// The offset bracket: a slow first round trip leaves a wide bracket, whose
// width is lateness a caller woken on time may have (the slot is mapped at
// its latest); a tight round trip narrows it; a sample outside the bracket
// (a clock stepped) or a minute later restarts it.
func TestClockOffsetBracket(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	db := func(d time.Duration) float64 { return timeToEpoch(base.Add(d)) } // the database's clock: the local one + 10 ms
	var o clockOffset
	ms := func(d time.Duration) string { return d.Round(time.Microsecond).String() }
	near := func(d, want time.Duration) bool { return (d - want).Abs() < time.Microsecond }

	// Sent at 0, read by the database at 1 ms (local), received at 50 ms.
	o.observe(db(11*time.Millisecond), base, base.Add(50*time.Millisecond))
	if u := o.uncertainty(); !near(u, 50*time.Millisecond) {
		t.Fatalf("after a 50-ms round trip: uncertainty %s, want 50ms", ms(u))
	}
	if got := o.local(db(100 * time.Millisecond)); got.Before(base.Add(90 * time.Millisecond)) {
		t.Fatalf("a slot mapped to %s before its true local time (90ms): early", got.Sub(base))
	}
	// A 2-ms round trip a second later narrows it to 2 ms around the truth.
	o.observe(db(time.Second+11*time.Millisecond), base.Add(time.Second), base.Add(time.Second+2*time.Millisecond))
	if u := o.uncertainty(); !near(u, 2*time.Millisecond) {
		t.Fatalf("after a 2-ms round trip: uncertainty %s, want 2ms", ms(u))
	}
	if got := o.local(db(100 * time.Millisecond)).Sub(base); got < 90*time.Millisecond-time.Microsecond || got > 92*time.Millisecond+time.Microsecond {
		t.Fatalf("a slot mapped to %s, want within [90ms, 92ms]", ms(got))
	}
	// The local clock steps 1 s back: the sample is outside the bracket and
	// restarts it.
	o.observe(db(2*time.Second+10*time.Millisecond), base.Add(time.Second), base.Add(time.Second+time.Millisecond))
	if got := o.local(db(2*time.Second + 10*time.Millisecond)).Sub(base); got < time.Second-time.Microsecond || got > time.Second+time.Millisecond+time.Microsecond {
		t.Fatalf("after a step: mapped to %s, want within [1s, 1.001s]", ms(got))
	}
	// A minute later, a slow sample restarts it too.
	o.observe(db(2*time.Minute+time.Millisecond), base.Add(2*time.Minute-10*time.Millisecond), base.Add(2*time.Minute+30*time.Millisecond))
	if u := o.uncertainty(); !near(u, 40*time.Millisecond) {
		t.Fatalf("a minute later: uncertainty %s, want 40ms (restarted)", ms(u))
	}
}
