package integration

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// SIGTERM while fetches are in flight (the destination answers after a
// delay). The worker exits 0 within the soft-stop timeout plus a margin.
//   - soft stop longer than the delay: the running fetches finish and are
//     recorded by the stopping worker itself;
//   - soft stop shorter than the delay: the running fetches are cancelled
//     (the destination sees the connections dropped) and their jobs run
//     again later — here, `fleetpace drain` checks every source, including
//     the interrupted ones.
func TestSIGTERMDuringFetches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		softStop time.Duration
		delay    time.Duration
		finish   bool // running fetches finish within the soft stop
	}{
		{name: "finish", softStop: 6 * time.Second, delay: 2 * time.Second, finish: true},
		{name: "cancel", softStop: time.Second, delay: 3 * time.Second, finish: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const (
				sources     = 20
				concurrency = 5
				margin      = 4 * time.Second
			)
			url := newURL(t)
			d := newDest(t, map[string]fakedest.Rule{"/t/": {Delay: tc.delay}})
			platformWithSources(t, url, "t", d.URL(), sources, "--rate", "50")
			w := startWorker(t, url, "w1", "--concurrency", fmt.Sprint(concurrency), "--soft-stop", tc.softStop.String(),
				"--job-timeout", "10s", "--rescue-after", "15s")
			waitArrivals(t, d, "/t/", concurrency, 30*time.Second)
			flying := 0
			for deadline := time.Now().Add(10 * time.Second); flying == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				flying = inFlight(d.Requests(), "w1")
			}
			if flying == 0 {
				t.Fatal("no fetch in flight at SIGTERM")
			}
			w.signal(syscall.SIGTERM)
			termAt := time.Now()
			code := w.wait(tc.softStop + margin + 10*time.Second)
			took := time.Since(termAt)
			if code != 0 {
				t.Errorf("exit code %d after SIGTERM, want 0", code)
			}
			if took > tc.softStop+margin {
				t.Errorf("exited %s after SIGTERM; soft stop %s + margin %s", took.Round(10*time.Millisecond), tc.softStop, margin)
			}

			// The fetches that were in flight at SIGTERM.
			var inflight []fakedest.Request
			for _, r := range d.Requests() {
				if r.Time.Before(termAt) && (r.Done.IsZero() || r.Done.After(termAt)) {
					inflight = append(inflight, r)
				}
			}
			db := pool(t, url)
			recorded := 0
			for _, r := range inflight {
				var checked bool
				err := db.QueryRow(context.Background(),
					`SELECT last_checked_at IS NOT NULL FROM fleetpace_source WHERE url = $1`, d.URL()+r.Path).Scan(&checked)
				if err != nil {
					t.Fatal(err)
				}
				if checked {
					recorded++
				}
				if tc.finish && (r.Status != 200 || !checked) {
					t.Errorf("%s was in flight at SIGTERM: answered %d, recorded %v; want it finished within the soft stop", r.Path, r.Status, checked)
				}
				if !tc.finish && (r.Status != 0 || checked) {
					t.Errorf("%s was in flight at SIGTERM: answered %d, recorded %v; want it cancelled after the soft stop", r.Path, r.Status, checked)
				}
			}
			t.Logf("sigterm/%s: %d fetch(es) in flight (delay %s), soft stop %s: exit %d after %s; %d of them recorded by the stopping worker",
				tc.name, len(inflight), tc.delay, tc.softStop, code, took.Round(10*time.Millisecond), recorded)

			// Interrupted and never-started jobs run afterwards.
			if err := d.SetRule("/t/", fakedest.Rule{}); err != nil {
				t.Fatal(err)
			}
			drainStart := time.Now()
			out := cli(t, url, "drain", "--max-duration", "60s", "--allow-private-networks", "--job-timeout", "10s", "--rescue-after", "15s")
			waitAllChecked(t, db, 5*time.Second)
			t.Logf("sigterm/%s: drain after the stop took %s: %s", tc.name, time.Since(drainStart).Round(10*time.Millisecond), out)
		})
	}
}
