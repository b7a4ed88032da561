package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/fakedest"
)

// The platform is configured at 20/s but the destination allows only 10/s.
// 429s appear, the shared multiplier rises, and after 10 s fewer than 5 % of
// requests are answered 429; every one of the three processes slowed down
// (each has its own User-Agent), not only the one that saw a 429.
//
// The platform halves its multiplier only after 1000 clean responses
// (--decay-after 1000) so that no probe back towards 20/s falls inside the
// test. With the default schedule (halve after 100 clean), a fleet held at
// 10/s probes 20/s again every ~10 s, and each probe costs one burst of 429s:
// every request already granted when the first 429 arrives (up to workers ×
// concurrency of them, reserved up to --max-pacer-wait ahead) still goes out.
// Measured with the default: about 15 429s per probe, a 429 share of ~15 %
// in the 10 s after a probe — the multiplier's schedule, shared, not a bug
// of the sharing.
func TestSharedBackoff(t *testing.T) {
	t.Parallel()
	const (
		configured = 20.0
		allowed    = 10.0
		workers    = 3
		run        = 26 * time.Second // 16 s judged: a loaded machine's rare 429 is ~1 %, not 2.5 % of ~40 requests
	)
	url := newURL(t)
	d := newDest(t, map[string]fakedest.Rule{"/b/": {Rate: allowed, Burst: 3}})
	platformWithSources(t, url, "b", d.URL(), 500, "--rate", fmt.Sprint(configured), "--burst", "1", "--decay-after", "1000")
	db := pool(t, url)

	// Sample the shared multiplier while the fleet runs.
	var (
		mu    sync.Mutex
		mults []float64
	)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			var m float64
			if err := db.QueryRow(ctx, `SELECT multiplier FROM fleetpace_pace WHERE platform = 'b'`).Scan(&m); err == nil {
				mu.Lock()
				mults = append(mults, m)
				mu.Unlock()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	ws := startWorkers(t, url, "w", workers, "--concurrency", "10")
	start := waitArrivals(t, d, "/b/", 1, 30*time.Second)
	waitUntil(t, d, "/b/", start.Add(run), 30*time.Second)
	stopAll(ws)
	cancel()
	wg.Wait()

	reqs := d.Requests()
	first := reqs[0].Time
	end := first.Add(run)

	// The 429 share, second by second.
	var series []string
	var late, late429 int
	for s := 0; s < int(run/time.Second); s++ {
		from, to := first.Add(time.Duration(s)*time.Second), first.Add(time.Duration(s+1)*time.Second)
		n, n429 := 0, 0
		for _, r := range reqs {
			if !r.Time.Before(from) && r.Time.Before(to) {
				n++
				if r.Status == http.StatusTooManyRequests {
					n429++
				}
			}
		}
		series = append(series, fmt.Sprintf("%d/%d", n429, n))
		if s >= 10 {
			late += n
			late429 += n429
		}
	}
	total429 := 0
	for _, r := range reqs {
		if r.Status == http.StatusTooManyRequests {
			total429++
		}
	}
	maxMult := 0.0
	mu.Lock()
	multSeries := make([]string, 0, len(mults)/10+1)
	for i, m := range mults {
		maxMult = max(maxMult, m)
		if i%10 == 0 {
			multSeries = append(multSeries, fmt.Sprint(m))
		}
	}
	mu.Unlock()
	share := float64(late429) / float64(max(late, 1))
	t.Logf("backoff: configured %.0f/s, destination allows %.0f/s; 429s/requests per second: %s", configured, allowed, strings.Join(series, " "))
	t.Logf("backoff: multiplier every ~1 s: %v (max %g); 429 share after 10 s: %d/%d = %.1f %%; 429s overall %d/%d",
		multSeries, maxMult, late429, late, 100*share, total429, len(reqs))

	if total429 == 0 {
		t.Fatalf("the destination never answered 429: the scenario does not exercise backoff")
	}
	if maxMult < 2 {
		t.Errorf("the shared multiplier never rose above %g", maxMult)
	}
	if share >= 0.05 {
		t.Errorf("after 10 s, %.1f %% of requests were answered 429; want < 5 %%", 100*share)
	}
	// Backed off, the fleet still runs at the rate the shared multiplier
	// allows (configured / multiplier), not slower.
	if lateRate, floor := float64(late)/(run-10*time.Second).Seconds(), 0.8*configured/maxMult; lateRate < floor {
		t.Errorf("after 10 s the fleet ran at %.1f/s; the multiplier (at most %g) allows %.1f/s: backoff starved it", lateRate, maxMult, configured/maxMult)
	}

	// Every process slowed: unthrottled, each would get about a third of
	// 20/s (6.7/s); after 10 s each must be well under that.
	perWorker := configured / workers
	ua := byUA(reqs)
	for i := range workers {
		name := fmt.Sprintf("w%d", i+1)
		ts := times(ua[name])
		early := float64(arrivalsBetween(ts, first, first.Add(2*time.Second))) / 2
		lateRate := float64(arrivalsBetween(ts, first.Add(10*time.Second), end)) / (run - 10*time.Second).Seconds()
		t.Logf("backoff: %s: %.1f/s in the first 2 s, %.1f/s after 10 s (unthrottled share %.1f/s)", name, early, lateRate, perWorker)
		if lateRate >= 0.75*perWorker {
			t.Errorf("%s still ran at %.1f/s after 10 s; its unthrottled share is %.1f/s: it did not slow down", name, lateRate, perWorker)
		}
		if lateRate == 0 {
			t.Errorf("%s sent nothing after 10 s", name)
		}
	}
}
