package pacer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/ratelimit"
)

// A report that slows a platform down gates the process that sends it: no
// slot of the platform goes until the report's answer has re-spaced it.
// With the platform's row locked elsewhere, the report waits; a caller
// whose slot (granted at the old pace) comes meanwhile waits too, and
// sleeps afterwards until its re-spaced, later slot. Both kinds of slow-down
// are checked: pressure, and an announcement of a slower pace (seen under
// load: a worker sent four more requests at 20/s during the 250 ms its
// report of "4 left, reset in 0.98 s" took, and the last was refused). The
// control, without the gate, sends at the old slot while the report is on
// its way.
func TestSlowDownGatesTheProcess(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		out  Feedback
	}{
		{"pressure", Feedback{Kind: Pressure}},
		{"announcement", Feedback{Kind: Clean, Quota: ratelimit.Info{Limit: 5, Remaining: 4, HasRemaining: true,
			Reset: time.Second, HasReset: true}}},
	} {
		for _, gated := range []bool{true, false} {
			name := tc.name + map[bool]string{true: "/gated", false: "/naive"}[gated]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				url, pool := setup(t, platformSpec{name: "api", rate: 20})
				clk := clocktest.New()
				p := fakePacer(t, url, clk, nil)
				p.noGate = !gated
				ctx := context.Background()
				var rs [3]Reservation
				for i := range rs {
					r, err := p.Reserve(ctx, "api", time.Minute)
					if err != nil || !r.Granted {
						t.Fatalf("reservation %d: %+v %v", i, r, err)
					}
					rs[i] = r
				}
				release := lockPlatformRow(t, pool, "api")
				reported := make(chan error, 1)
				go func() {
					_, err := p.Report(ctx, "api", rs[0], tc.out)
					reported <- err
				}()
				waitFor(t, "the report waiting for the locked row", func() bool { return lockWaiters(t, pool) > 0 })
				res := rs[2]
				slot := res.Slot
				slept := make(chan error, 1)
				go func() { slept <- p.Sleep(ctx, &res) }()
				clk.Advance(res.Wait + 5*time.Millisecond) // past the old slot
				if !gated {
					select {
					case err := <-slept:
						if err != nil {
							t.Fatalf("naive: %v", err)
						}
						t.Logf("naive: the slot went at the old pace while the report was on its way")
					case <-time.After(10 * time.Second):
						t.Fatal("naive: the caller did not wake at its slot")
					}
					release()
					if err := <-reported; err != nil {
						t.Fatal(err)
					}
					return
				}
				waitFor(t, "the caller to reach its slot behind the gate", func() bool { return p.gated.Load() > 0 })
				select {
				case err := <-slept:
					t.Fatalf("the slot went (%v) while the report that slows the platform down was on its way", err)
				default:
				}
				release()
				if err := <-reported; err != nil {
					t.Fatal(err)
				}
				for done := false; !done; {
					select {
					case err := <-slept:
						if err != nil {
							t.Fatalf("after the report: %v", err)
						}
						done = true
					case <-time.After(5 * time.Millisecond):
						// In steps finer than the margin's late tolerance
						// at the slower pace (4 ms at 10/s): a step past
						// the re-spaced slot by more would make it late.
						clk.Advance(2 * time.Millisecond)
					}
				}
				if moved := res.Slot.Sub(slot); moved < 50*time.Millisecond {
					t.Fatalf("the slot moved %s; re-spaced at the slower pace it moves at least one old spacing", moved)
				}
			})
		}
	}
}

// lockWaiters is how many statements of the test's database wait for a
// lock.
func lockWaiters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
