package integration

import (
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/netdelay"
)

// farURL returns url reached through a proxy that adds rtt to every round
// trip (netdelay); the proxy stops when the test ends.
func farURL(t *testing.T, dbURL string, rtt time.Duration) string {
	t.Helper()
	p, far, err := netdelay.StartURL(dbURL, rtt/2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return far
}

// The ceiling holds with the database 20 ms away: three workers whose every
// statement (reservations, scans, River) crosses a 20-ms round trip never
// put more than rate + burst requests in a 1-s window at the destination,
// and still use most of the ceiling. Slots are judged late against the
// database's clock mapped to each process's own, which a far database makes
// uncertain by up to a round trip.
func TestCeilingFarDatabase(t *testing.T) {
	// Not parallel, as TestCeilingEndToEnd: its largest window reads the
	// bound itself (17 of 17) alone, and beside three other scenarios on a
	// machine where starting a process is slow a stalled worker went over.
	url := newURL(t)
	far := farURL(t, url, 20*time.Millisecond)
	d := newDest(t, nil)
	platformWithSources(t, url, "c", d.URL(), 300, "--rate", "15", "--burst", "2")
	var ws []*proc
	for i := range 3 {
		ws = append(ws, startWorker(t, far, "far"+string(rune('1'+i)), "--concurrency", "10"))
	}
	first := waitArrivals(t, d, "/c/", 1, 60*time.Second)
	waitUntil(t, d, "/c/", first.Add(12*time.Second), 60*time.Second)
	stopAll(ws)
	arrivals := d.Arrivals("/c/")
	from, to := first.Add(2*time.Second), first.Add(11*time.Second)
	mean := float64(arrivalsBetween(arrivals, from, to)) / to.Sub(from).Seconds()
	maxWin := maxInWindow(arrivals, time.Second)
	t.Logf("20 ms away: 3 workers at 15/s burst 2: steady mean %.2f/s = %.2f × ceiling, largest 1-s window %d (bound 17); per second %s",
		mean, mean/15, maxWin, perSecond(rateSeries(arrivals, first, time.Second)))
	if maxWin > 17 {
		t.Errorf("a 1-s window held %d requests; the ceiling is 15/s + burst 2", maxWin)
	}
	if mean < 0.8*15 {
		t.Errorf("steady mean %.2f/s < 0.8 × 15/s with the database 20 ms away", mean)
	}
}
