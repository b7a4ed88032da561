package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/nginxrun"
)

// Three workers against a real nginx (limit_req rate=8r/s, limit_req_status
// 429), once without burst and once with burst=5 nodelay, each a platform of
// its own with a ceiling of 20/s, serving static files that are fetched
// again and again (nginx's ETag: 304s). Judged from nginx's access log: no
// 1-s window above the ceiling + burst (21), and over the last 30 s goodput
// ≥ 0.75 × 8/s with ≤ 5 % 429s — a floor a loaded 2-core machine meets;
// the targets (≥ 0.9 and ≤ 1 % without burst) are measured by `fleetpace
// bench adapt --nginx`.
func TestRealNginxLimitReq(t *testing.T) {
	// Not parallel: nginx refuses a request a few ms early, and beside
	// three other scenarios on a machine where starting a process is slow
	// the jitter took its goodput just under its bar of 0.75 in a fresh-clone run.
	if _, err := nginxrun.Binary(); errors.Is(err, nginxrun.ErrNotInstalled) {
		t.Skip("nginx is not installed (apt-get install nginx; .ci/run installs it)")
	}
	const (
		rate    = 8
		ceiling = 20
		files   = 100
		run     = 45 * time.Second
		judged  = 30 * time.Second
	)
	cases := []struct {
		platform string
		burst    int
	}{{"nginx", 0}, {"nginxburst", 5}}
	var locs []nginxrun.Location
	for _, c := range cases {
		locs = append(locs, nginxrun.Location{Prefix: "/" + c.platform + "/", Rate: rate, Burst: c.burst, Files: files})
	}
	ngx, err := nginxrun.Start(context.Background(), nginxrun.Config{Dir: t.TempDir(), Locations: locs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ngx.Stop() })

	url := newURL(t)
	var csv strings.Builder
	csv.WriteString("platform,url,interval\n")
	for _, c := range cases {
		setPlatform(t, url, c.platform, "--rate", fmt.Sprint(ceiling))
		for i := range files {
			fmt.Fprintf(&csv, "%s,%s/%s/%d,5s\n", c.platform, ngx.URL(), c.platform, i) // 20/s offered
		}
	}
	f := filepath.Join(t.TempDir(), "sources.csv")
	if err := os.WriteFile(f, []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cli(t, url, "sources", "import", f)
	ws := startWorkers(t, url, "n", 3, "--concurrency", "20")

	// The run starts with nginx's first request and ends once both
	// platforms have a request logged at or after start + run.
	entries := func() []nginxrun.Entry {
		t.Helper()
		es, err := ngx.Entries()
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
	var start time.Time
	waitFor(t, 30*time.Second, "nginx's first request", func() bool {
		if es := entries(); len(es) > 0 {
			start = es[0].Time
			return true
		}
		return false
	})
	end := start.Add(run)
	for _, c := range cases {
		waitFor(t, run+30*time.Second, "a request of "+c.platform+" after the run", func() bool {
			for _, e := range entries() {
				if strings.HasPrefix(e.URI, "/"+c.platform+"/") && !e.Time.Before(end) {
					return true
				}
			}
			return false
		})
	}
	stopAll(ws)
	es := entries()
	for _, c := range cases {
		var all []time.Time
		var ok, notModified, limited, total int
		from := end.Add(-judged)
		for _, e := range es {
			if !strings.HasPrefix(e.URI, "/"+c.platform+"/") {
				continue
			}
			all = append(all, e.Time)
			if e.Status == 304 {
				notModified++
			}
			if e.Time.Before(from) || !e.Time.Before(end) {
				continue
			}
			total++
			switch {
			case e.Status == 429:
				limited++
			case e.Status == 200 || e.Status == 304:
				ok++
			}
		}
		goodput := float64(ok) / (rate * judged.Seconds())
		share := float64(limited) / float64(max(total, 1))
		w := maxInWindow(all, time.Second)
		t.Logf("%s (rate=%dr/s burst=%d): last %s: %d requests, %d accepted, %d refused: goodput %.2f × %d/s, 429 share %.1f %%; 304s in the run %d; largest 1-s window %d; accepted per second %s",
			c.platform, rate, c.burst, judged, total, ok, limited, goodput, rate, 100*share, notModified, w, perSecond(okPerSecond(es, c.platform, start)))
		if w > ceiling+1 {
			t.Errorf("%s: a 1-s window held %d requests; the ceiling is %d/s with burst 1", c.platform, w, ceiling)
		}
		if goodput < 0.75 {
			t.Errorf("%s: goodput %.2f × %d/s over the last %s, want ≥ 0.75", c.platform, goodput, rate, judged)
		}
		if share > 0.05 {
			t.Errorf("%s: 429 share %.1f %% over the last %s, want ≤ 5 %%", c.platform, 100*share, judged)
		}
		if notModified == 0 {
			t.Errorf("%s: no 304 in the run: the sources fetched again sent no validators nginx accepted", c.platform)
		}
	}
}

// okPerSecond is a platform's accepted requests (200 and 304) per second
// from origin.
func okPerSecond(es []nginxrun.Entry, platform string, origin time.Time) []float64 {
	var ts []time.Time
	for _, e := range es {
		if strings.HasPrefix(e.URI, "/"+platform+"/") && (e.Status == 200 || e.Status == 304) {
			ts = append(ts, e.Time)
		}
	}
	return rateSeries(ts, origin, time.Second)
}

// waitFor polls cond every 100 ms until it holds, failing the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
