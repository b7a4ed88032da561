package pacer

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetpace/fleetpace/internal/clocktest"
)

// Degraded pacing books a local slot at most half a latch period ahead (a
// later one is denied with the wait until it comes that close), and after
// the database answers again the process honours its local share for a
// period and a half: concurrent callers each book their own next local
// slot, and no slot is pushed past the end of that recovery (from then on
// the shared row paces everyone). Exact times, local and shared, on an
// injected clock the statements take too, with a proxy to cut.
func TestRecoveryAfterAnOutage(t *testing.T) {
	ctx := context.Background()
	_, px, clk, p := outageFleet(t, "rec") // local spacing (3+1) / 20 = 200ms; horizon 500ms; recovery 1.5s

	if r, err := p.Reserve(ctx, "rec", time.Minute); err != nil || !r.Granted || r.Degraded {
		t.Fatalf("shared reservation: %+v %v", r, err)
	}
	px.setCut(true)
	for i, w := range []time.Duration{200 * time.Millisecond, 400 * time.Millisecond} {
		if r, err := p.Reserve(ctx, "rec", time.Minute); err != nil || !r.Granted || !r.Degraded || r.Wait != w {
			t.Fatalf("degraded reservation %d: %+v %v, want granted after %s", i, r, err, w)
		}
	}
	// The next local slot is 600ms away, beyond the 500ms horizon: not
	// booked; come back in 100ms.
	if r, _ := p.Reserve(ctx, "rec", time.Minute); r.Granted || !r.Degraded || r.Wait != 100*time.Millisecond {
		t.Fatalf("degraded reservation beyond the horizon: %+v, want denied with wait 100ms", r)
	}
	clk.Advance(100 * time.Millisecond)
	if r, _ := p.Reserve(ctx, "rec", time.Minute); !r.Granted || r.Wait != 500*time.Millisecond {
		t.Fatalf("degraded reservation once within the horizon: %+v, want granted after 500ms", r)
	}

	// The database answers again; the latch has passed. The probe books
	// the first local slot (now: the last local slot is 600ms ahead of the
	// last grant, the latch 1s).
	px.setCut(false)
	clk.Advance(time.Second)
	probe, err := p.Reserve(ctx, "rec", time.Minute)
	if err != nil || !probe.Granted || probe.Degraded || probe.Wait > 50*time.Millisecond {
		t.Fatalf("probe: %+v %v, want a shared slot within the row's spacing (50ms)", probe, err)
	}
	// Seven callers at once while recovering: each books its own local
	// slot, 200ms apart after the probe's, not the row's next ones 50ms
	// apart.
	waits := make([]time.Duration, 7)
	var g errgroup.Group
	for i := range waits {
		g.Go(func() error {
			r, err := p.Reserve(ctx, "rec", time.Minute)
			waits[i] = r.Wait
			if err == nil && (!r.Granted || r.Degraded) {
				t.Errorf("recovering reservation: %+v, want a shared grant", r)
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(waits)
	for i, w := range waits {
		if want := probe.Wait + time.Duration(i+1)*200*time.Millisecond; w < want-time.Millisecond || w > want+time.Millisecond {
			t.Fatalf("concurrent recovering reservations waited %v; want one local slot each, 200ms apart after the probe's (%s)", waits, probe.Wait)
		}
	}
	// The next local slots (1.6s, 1.8s) lie past the recovery's end
	// (1.5s): they go at the row's pace from there, 1.5s and 1.55s.
	for i, want := range []time.Duration{1500 * time.Millisecond, 1550 * time.Millisecond} {
		r, err := p.Reserve(ctx, "rec", time.Minute)
		if err != nil || !r.Granted || r.Wait < want-time.Millisecond || r.Wait > want+time.Millisecond {
			t.Fatalf("recovering reservation %d past the recovery's end: %+v %v, want a shared slot after %s", i, r, err, want)
		}
	}
	// Recovered: blocks and the row's pace only.
	clk.Advance(1500 * time.Millisecond)
	if r, err := p.Reserve(ctx, "rec", time.Minute); err != nil || !r.Granted || r.Degraded {
		t.Fatalf("after the recovery: %+v %v", r, err)
	}
}

// behindProxy starts a proxy to dbURL's server and returns it with the URL
// that goes through it.
func behindProxy(t *testing.T, dbURL string) (*proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.addr()
	return px, u.String()
}

// A process that goes degraded starts pacing locally only after every slot
// the row had granted when it last reached it (the others' too), and as
// many more as were then ahead of now: the others may still reserve until
// the database goes, and their slots go out. Starting from its own last
// slot instead, a process put 22 requests in a 1-s window under a bound of
// 21 (TestDegradedProcessesKeepTheCeiling, under load).
func TestDegradedStartsAfterTheRowsSlots(t *testing.T) {
	// keyed: the same for a key's reservations, each of the others' of a
	// key of its own (a keyed process once set no start and granted its
	// first local slot at once).
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			ctx := context.Background()
			dbURL, pool := setup(t, platformSpec{name: "gone", rate: 20, burst: 1})
			setKeyLimits(t, pool, "gone", 100, 1, 0, 0)
			px, proxied := behindProxy(t, dbURL)
			clk := clocktest.New()
			p := fakePacer(t, proxied, clk, func(c *Config) { c.PollOnly = true; c.Latch = time.Second })
			p.SetFleetSize(3) // local spacing 200 ms, horizon 500 ms
			reserve := func(p *Pacer, i int) (Reservation, error) {
				if keyed {
					return p.ReserveKey(ctx, "gone", fmt.Sprintf("k%d", i), time.Minute)
				}
				return p.Reserve(ctx, "gone", time.Minute)
			}
			start := clk.Now()
			other := fakePacer(t, dbURL, clk, nil)
			for i := range 10 { // the row's slots 0–450 ms
				if r, err := reserve(other, i); err != nil || !r.Granted {
					t.Fatalf("another process's reservation: %+v %v", r, err)
				}
			}
			r, err := reserve(p, 10)
			if err != nil || !r.Granted || r.Degraded || (r.Wait-500*time.Millisecond).Abs() > time.Millisecond {
				t.Fatalf("shared reservation: %+v %v, want the slot at 500 ms", r, err)
			}
			// The row's cursor was 550 ms ahead: no local slot before 1.1 s
			// (its own last slot + the local spacing would be 700 ms).
			px.setCut(true)
			for {
				r, err := reserve(p, 10)
				if err != nil || !r.Degraded {
					t.Fatalf("reservation with the database gone: %+v %v, want degraded", r, err)
				}
				if r.Granted {
					if at := clk.Now().Add(r.Wait).Sub(start); (at - 1100*time.Millisecond).Abs() > time.Millisecond {
						t.Fatalf("the first local slot at %s, want at 1.1 s, after the row's slots and as many more", at)
					}
					return
				}
				clk.Advance(r.Wait)
			}
		})
	}
}

// outageFleet is a platform of 20/s (burst 1) and a pacer on the fake clock
// reaching the database through a proxy to cut (latch 1 s, no listener),
// one of a fleet of three.
func outageFleet(t *testing.T, platform string) (dbURL string, px *proxy, clk *clocktest.Fake, p *Pacer) {
	dbURL, pool := setup(t)
	addPlatform(t, pool, platformSpec{name: platform, rate: 20, burst: 1})
	px, proxied := behindProxy(t, dbURL)
	clk = clocktest.New()
	p = fakePacer(t, proxied, clk, func(c *Config) { c.PollOnly = true; c.Latch = time.Second })
	p.SetFleetSize(3)
	return dbURL, px, clk, p
}
