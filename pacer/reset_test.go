package pacer

import (
	"context"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/ratelimit"
)

// Reset puts a platform back at its configured pace from whatever
// adaptation learnt: after backoff (the multiplier at its maximum), a
// destination's announced quota and a hold, the next reservation goes
// now and the one after it one configured spacing later (1/20 s), where
// ClearHold (the control) keeps the announced quota in force.
func TestResetGoesAtTheConfiguredPace(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	clk := clocktest.New() // slots spaced by the pace alone, however long a reservation takes
	p := fakePacer(t, url, clk, nil)
	ctx := p.withTime(context.Background())
	slowDown := func(platform string) {
		t.Helper()
		for range 5 { // to the maximum multiplier (×8)
			r, err := p.Reserve(ctx, platform, time.Hour)
			if err != nil || !r.Granted {
				t.Fatalf("%+v %v", r, err)
			}
			if _, err := p.Report(ctx, platform, r, Feedback{Kind: Pressure}); err != nil {
				t.Fatal(err)
			}
		}
		r, err := p.Reserve(ctx, platform, time.Hour)
		if err != nil || !r.Granted {
			t.Fatalf("%+v %v", r, err)
		}
		// The destination announces 1 request left for 60 s.
		q := ratelimit.Info{Limit: 10, Remaining: 1, HasRemaining: true, Reset: time.Minute, HasReset: true}
		if _, err := p.Report(ctx, platform, r, Feedback{Kind: Clean, Quota: q}); err != nil {
			t.Fatal(err)
		}
		p.Flush(ctx)
		if err := Hold(ctx, pool, platform, clk.Now().Add(time.Minute), "Retry-After"); err != nil {
			t.Fatal(err)
		}
		st := state(t, p, platform)
		if st.Multiplier < 7.9 || st.AnnouncedRate <= 0 || st.Hold <= 0 {
			t.Fatalf("%s before: %+v; want backed off, a quota announced, held", platform, st)
		}
	}
	for _, name := range []string{"reset", "cleared"} {
		addPlatform(t, pool, platformSpec{name: name, rate: 20, maxMult: 8})
		slowDown(name)
	}
	if err := Reset(ctx, pool, "reset"); err != nil {
		t.Fatal(err)
	}
	if err := ClearHold(ctx, pool, "cleared"); err != nil {
		t.Fatal(err)
	}
	if st := state(t, p, "reset"); st.Multiplier != 1 || st.Estimate != 0 || st.AnnouncedRate != 0 || st.Hold != 0 ||
		st.PacedBy != PacedByCeiling || st.EffectiveRate != 20 {
		t.Errorf("after Reset: %+v; want the configured pace (20/s), nothing announced, no hold", st)
	}
	if st := state(t, p, "cleared"); st.PacedBy != PacedByAnnounced {
		t.Errorf("the control: after ClearHold, paced by %q; want the announced quota still in force", st.PacedBy)
	}
	// Two reservations in a row: the first within one spacing, the second one spacing of
	// the configured pace later (no burst: burst 1).
	first, err := p.Reserve(ctx, "reset", time.Hour)
	if err != nil || !first.Granted || first.Wait > 50*time.Millisecond {
		t.Fatalf("first reservation after Reset: %+v %v; want a slot now", first, err)
	}
	second, err := p.Reserve(ctx, "reset", time.Hour)
	if err != nil || !second.Granted {
		t.Fatalf("second reservation after Reset: %+v %v", second, err)
	}
	if gap := second.Slot.Sub(first.Slot); gap < 49*time.Millisecond || gap > 51*time.Millisecond {
		t.Errorf("after Reset, two slots %s apart; want 50ms (20/s)", gap)
	}
	if err := Reset(ctx, pool, "nope"); err == nil {
		t.Error("Reset of an unknown platform: no error")
	}
}

func state(t *testing.T, p *Pacer, platform string) State {
	t.Helper()
	st, err := StatesOf(p.withTime(context.Background()), p.pool, []string{platform})
	if err != nil || len(st) != 1 {
		t.Fatalf("state of %s: %v %v", platform, st, err)
	}
	return st[0]
}
