package localpace

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/pacer"
)

func TestParse(t *testing.T) {
	t.Parallel()
	sp, err := Parse("window1s-33.oracle=oracle:2.5@1750000000000:5")
	if err != nil {
		t.Fatal(err)
	}
	if sp.Platform != "window1s-33.oracle" || sp.Kind != KindOracle || len(sp.Steps) != 2 ||
		sp.Steps[0].Rate != 2.5 || sp.Steps[1].Rate != 5 || sp.Steps[1].From.UnixMilli() != 1750000000000 {
		t.Fatalf("parsed %+v", sp)
	}
	if got := sp.String(); got != "window1s-33.oracle=oracle:2.5@1750000000000:5" {
		t.Errorf("String() = %q", got)
	}
	if sp, err := Parse("p=aws:6.5"); err != nil || sp.Kind != KindAWS || sp.Steps[0].Rate != 6.5 {
		t.Errorf("aws: %+v, %v", sp, err)
	}
	for _, bad := range []string{"", "p", "=aws:1", "p=aws", "p=aws:0", "p=aws:x", "p=tcp:1", "p=oracle:1@x:2",
		"p=oracle:1@1750000000000", "p=oracle:1@1750000000000:2@1740000000000:3", "bad name=aws:1"} {
		if _, err := Parse(bad); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidSpec", bad, err)
		}
	}
	if _, err := NewRouter(nil, nil, []Spec{{Platform: "p", Kind: KindAWS, Steps: []Step{{Rate: 1}}}, {Platform: "p", Kind: KindAWS, Steps: []Step{{Rate: 1}}}}); err == nil ||
		!strings.Contains(err.Error(), "twice") {
		t.Errorf("a platform named twice: %v", err)
	}
}

// The oracle spaces slots exactly 1/rate apart, denies one beyond maxWait
// without taking it, and changes rate at its instant.
func TestOracle(t *testing.T) {
	t.Parallel()
	c := clocktest.New()
	t0 := c.Now()
	change := t0.Add(2 * time.Second)
	r, err := NewRouter(nil, c, []Spec{{Platform: "o", Kind: KindOracle, Steps: []Step{{Rate: 4}, {From: change, Rate: 10}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var slots []time.Duration
	for len(slots) < 12 {
		res, err := r.Reserve(ctx, "o", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Granted {
			if res.Wait <= time.Second {
				t.Fatalf("denied with wait %s ≤ maxWait", res.Wait)
			}
			c.Advance(500 * time.Millisecond)
			continue
		}
		slots = append(slots, res.Slot.Sub(t0))
	}
	want := []time.Duration{0, 250, 500, 750, 1000, 1250, 1500, 1750, 2000, 2100, 2200, 2300}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(slots, want) {
		t.Fatalf("slots %v, want %v", slots, want)
	}
	// Sleep ends at the slot, on the clock.
	res, _ := r.Reserve(ctx, "o", time.Hour)
	done := make(chan error, 1)
	go func() { done <- r.Sleep(ctx, &res) }()
	clocktest.WaitSleepers(t, c, 1)
	select {
	case err := <-done:
		t.Fatalf("Sleep returned before its slot: %v", err)
	default:
	}
	c.Advance(res.Slot.Sub(c.Now()))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestCubic(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	c := newCubic(t0)
	if got := c.throttled(10, t0); got != 7 {
		t.Errorf("after a throttle at 10/s: %g, want 7 (β = 0.7)", got)
	}
	k := math.Cbrt(10 * 0.3 / 0.4)
	for _, tc := range []struct {
		after, want float64
	}{
		{0, 7},                             // 0.4·(−K)³ + 10 = 10 − 3
		{k, 10},                            // back at w_max after K s
		{k + 2, 10 + 0.4*8},                // and past it, cubically
		{k / 2, 10 - 0.4*math.Pow(k/2, 3)}, // concave below it
	} {
		got := c.success(t0.Add(time.Duration(tc.after * float64(time.Second))))
		if math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("%.3f s after the throttle: %g, want %g", tc.after, got, tc.want)
		}
	}
}

func TestRateClocker(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	rc := newRateClocker(t0)
	var got float64
	// 10 answers a second for 3 s: the smoothed rate approaches 10.
	for i := 1; i <= 30; i++ {
		got = rc.record(t0.Add(time.Duration(i) * 100 * time.Millisecond))
	}
	if math.Abs(got-10) > 0.1 {
		t.Errorf("measured %g/s, want 10", got)
	}
}

// The AWS mode paces nothing but its cap until the first throttle; then its
// token bucket fills at 0.7 × the measured rate, Sleep waits for tokens,
// and the rate climbs back by CUBIC in time.
func TestAWS(t *testing.T) {
	t.Parallel()
	c := clocktest.New()
	ctx := context.Background()
	r, err := NewRouter(nil, c, []Spec{{Platform: "a", Kind: KindAWS, Steps: []Step{{Rate: 10}}}})
	if err != nil {
		t.Fatal(err)
	}
	a := r.local["a"].(*aws)
	send := func(out pacer.Feedback) {
		t.Helper()
		res, err := r.Reserve(ctx, "a", time.Second)
		if err != nil || !res.Granted {
			t.Fatalf("reserve: %+v, %v", res, err)
		}
		c.Advance(max(res.Slot.Sub(c.Now()), 0))
		if err := r.Sleep(ctx, &res); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Report(ctx, "a", res, out); err != nil {
			t.Fatal(err)
		}
	}
	t0 := c.Now()
	for range 30 {
		send(pacer.Feedback{Kind: pacer.Clean})
	}
	if el := c.Now().Sub(t0); el != 2900*time.Millisecond {
		t.Errorf("30 requests at the cap (10/s) took %s, want 2.9 s", el)
	}
	if on, _, m := a.state(); on || math.Abs(m-10) > 0.5 {
		t.Fatalf("before a throttle: pacing %v, measured %g/s (want off, ≈ 10)", on, m)
	}
	send(pacer.Feedback{Kind: pacer.Pressure, RetryAfter: time.Second})
	on, fill, m := a.state()
	if !on || math.Abs(fill-0.7*m) > 1e-9 {
		t.Fatalf("after a throttle: pacing %v, fill %g/s, measured %g/s (want on, 0.7 × measured)", on, fill, m)
	}
	// An empty bucket: the next Sleep waits for a token, 1/fill on the
	// clock, not less.
	res, _ := r.Reserve(ctx, "a", time.Hour)
	c.Advance(max(res.Slot.Sub(c.Now()), 0))
	a.mu.Lock()
	a.bucket.tokens, a.bucket.last = 0, c.Now()
	a.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- r.Sleep(ctx, &res) }()
	tokenAt := c.Now().Add(time.Duration(float64(time.Second) / fill))
	clocktest.WaitSleepers(t, c, 1)
	c.Advance(tokenAt.Sub(c.Now()) - 10*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Sleep returned 10 ms before its token: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	c.Advance(11 * time.Millisecond) // its timer, rounded up to the microsecond
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Recovery is a function of time: 10 s of answers later the fill rate
	// is back above the rate of the throttle (capped at 2 × measured).
	_, low, _ := a.state()
	for range 100 {
		c.Advance(100 * time.Millisecond)
		a.report(c.Now(), pacer.Feedback{Kind: pacer.Clean})
	}
	if _, fill, m := a.state(); fill <= low || fill < 0.99*min(2*m, low/0.7) {
		t.Errorf("10 s after the throttle: fill %g/s (after it %g/s, measured %g/s): no cubic climb", fill, low, m)
	}
}

// Three processes at 8/3 per second with phases 0, 1/3 and 2/3 interleave
// into one fleet spaced 125 ms apart, whatever their calls' order.
func TestOraclePhases(t *testing.T) {
	t.Parallel()
	c := clocktest.New()
	c.Advance(37 * time.Millisecond) // off any grid point
	var all []time.Time
	for i, spec := range []string{"p=oracle:2.6666666666666665", "p=oracle:2.6666666666666665~0.3333333333333333", "p=oracle:2.6666666666666665~0.6666666666666666"} {
		sp, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 && sp.String() != spec {
			t.Errorf("String() = %q, want %q", sp.String(), spec)
		}
		o := newOracle(c, sp.Steps, sp.Phase)
		now := c.Now()
		for k := 0; len(all) < 8*(i+1); k++ {
			if ok, slot, _ := o.reserve(now, time.Hour); ok {
				all = append(all, slot)
			}
		}
	}
	slices.SortFunc(all, func(a, b time.Time) int { return a.Compare(b) })
	for i := 1; i < len(all); i++ {
		if d := all[i].Sub(all[i-1]); d < 125*time.Millisecond-2 || d > 125*time.Millisecond+2 {
			t.Fatalf("slot %d comes %s after the one before, want 125 ms: %v", i, d, all)
		}
	}
	if _, err := Parse("p=oracle:1~1"); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("phase 1: %v, want ErrInvalidSpec", err)
	}
}

// An oracle's caller sleeps for a slot beyond its own max wait (up to
// OracleMaxWait) instead of being denied: a denied job snoozes, and the
// slots of the grid would go unused meanwhile.
func TestOracleAcquireWaitsPastMaxWait(t *testing.T) {
	t.Parallel()
	c := clocktest.New()
	t0 := c.Now()
	r, err := NewRouter(nil, c, []Spec{{Platform: "o", Kind: KindOracle, Steps: []Step{{Rate: 1}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 3 { // the slots of the next 3 s are taken
		if res, err := r.Reserve(ctx, "o", time.Hour); err != nil || !res.Granted {
			t.Fatalf("reserve: %+v, %v", res, err)
		}
	}
	if res, _ := r.Reserve(ctx, "o", time.Second); res.Granted {
		t.Fatalf("Reserve granted a slot %s away under a max wait of 1 s", res.Wait)
	}
	type result struct {
		res pacer.Reservation
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := r.Acquire(ctx, "o", time.Second)
		done <- result{res, err}
	}()
	clocktest.WaitSleepers(t, c, 1)
	c.Advance(3 * time.Second)
	got := <-done
	if got.err != nil || !got.res.Granted || !got.res.Slot.Equal(t0.Add(3*time.Second)) {
		t.Fatalf("Acquire with a max wait of 1 s: %+v, %v; want the slot at +3 s", got.res, got.err)
	}
	// Beyond OracleMaxWait it is denied, as any pacer's wait.
	for range int(OracleMaxWait / time.Second) {
		if _, err := r.Reserve(ctx, "o", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Acquire(ctx, "o", time.Second); err == nil {
		t.Fatalf("Acquire granted a slot more than %s away", OracleMaxWait)
	}
}
