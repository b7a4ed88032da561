package integration

import (
	"fmt"
	"testing"
	"time"
)

const (
	ceilingRate  = 15.0
	ceilingBurst = 2
)

// ceilingScenario starts one worker per database URL (all fetching from
// dest under /c/), lets them fetch until the destination has seen run pass
// since the first arrival (by its own clock), stops them, and returns the
// destination's arrival times and the first of them.
func ceilingScenario(t *testing.T, urls []string, run time.Duration) (arrivals []time.Time, first time.Time) {
	t.Helper()
	d := newDest(t, nil)
	for _, url := range urls {
		platformWithSources(t, url, "c", d.URL(), 300, "--rate", fmt.Sprint(ceilingRate), "--burst", fmt.Sprint(ceilingBurst))
	}
	var ws []*proc
	for i, url := range urls {
		ws = append(ws, startWorker(t, url, fmt.Sprintf("w%d", i+1), "--concurrency", "10"))
	}
	first = waitArrivals(t, d, "/c/", 1, 30*time.Second)
	waitUntil(t, d, "/c/", first.Add(run), 30*time.Second)
	stopAll(ws)
	return d.Arrivals("/c/"), first
}

// Three worker processes share one platform at 15/s: the destination never
// sees more than rate + burst requests in any 1-s window, and the steady
// part runs at ≥ 90 % of the ceiling (the pacer neither overshoots nor
// starves).
func TestCeilingEndToEnd(t *testing.T) {
	// Not parallel: its bound (ceiling + burst in every 1-s window at the
	// destination) leaves one request for delivery jitter, so it runs alone,
	// before the parallel tests load the machine.
	url := newURL(t)
	arrivals, first := ceilingScenario(t, []string{url, url, url}, 12*time.Second)

	// Steady part: skip the first second (workers still starting, the burst)
	// and stop 1 s before the workers were stopped.
	from, to := first.Add(time.Second), first.Add(11*time.Second)
	mean := float64(arrivalsBetween(arrivals, from, to)) / to.Sub(from).Seconds()
	maxWin := maxInWindow(arrivals, time.Second)
	t.Logf("ceiling: 3 workers, rate %.0f/s burst %d: %d requests; steady mean %.2f/s = %.2f × ceiling; max in any 1-s window %d (bound %d); per second %s",
		ceilingRate, ceilingBurst, len(arrivals), mean, mean/ceilingRate, maxWin, int(ceilingRate)+ceilingBurst,
		perSecond(rateSeries(arrivals, first, time.Second)))
	if maxWin > int(ceilingRate)+ceilingBurst {
		t.Errorf("a 1-s window held %d requests; the ceiling is %.0f/s + burst %d", maxWin, ceilingRate, ceilingBurst)
	}
	if mean < 0.9*ceilingRate {
		t.Errorf("steady mean %.2f/s < 0.9 × %.0f/s: the fleet under-uses its ceiling", mean, ceilingRate)
	}
}

// The naive setup: the same three workers, but each on its own database, so
// each has its own pacer row and enforces 15/s alone. The destination sees
// the ceiling multiplied by the fleet size. This is what the shared pacer
// prevents; if this test ever fails, the ceiling test above proves nothing.
func TestCeilingNaiveSeparateDatabases(t *testing.T) {
	t.Parallel()
	urls := []string{newURL(t), newURL(t), newURL(t)}
	arrivals, first := ceilingScenario(t, urls, 8*time.Second)

	from, to := first.Add(time.Second), first.Add(7*time.Second)
	mean := float64(arrivalsBetween(arrivals, from, to)) / to.Sub(from).Seconds()
	maxWin := maxInWindow(arrivals, time.Second)
	t.Logf("naive: 3 workers on 3 databases, each at %.0f/s: steady mean %.2f/s = %.2f × ceiling; max in a 1-s window %d; per second %s",
		ceilingRate, mean, mean/ceilingRate, maxWin, perSecond(rateSeries(arrivals, first, time.Second)))
	if mean <= 2*ceilingRate {
		t.Errorf("naive fleet ran at %.2f/s; expected > 2 × %.0f/s (each process paces alone)", mean, ceilingRate)
	}
}
