package integration

import (
	"strconv"
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
// uncertain by up to a round trip (the same for every process at that
// distance: TestFarDatabaseAtAHighRate).
func TestCeilingFarDatabase(t *testing.T) {
	// Not parallel, as TestCeilingEndToEnd: its largest window reads the
	// bound itself (17 of 17) alone, and beside three other scenarios on a
	// machine where starting a process is slow a stalled worker went over.
	farFleet(t, "c", 300, 15, 2, 10)
}

// At a rate whose late tolerance (the late budget, 20 ms) is shorter than
// the database's round trip, the fleet still uses the ceiling: the round
// trip delays every process alike (the network's floor) and is no lateness.
// Counted as lateness, every slot was given up as late and each job sent
// on its third (a third of the rate: `bench fleet --rates 500 --burst 1
// --rtt 20ms` read 0.32). Alone, as TestCeilingFarDatabase.
func TestFarDatabaseAtAHighRate(t *testing.T) {
	farFleet(t, "h", 2000, 100, 1, 30)
}

// farFleet runs three workers (concurrency each) whose database is 20 ms
// away on a platform of n sources at rate + burst for 12 s, and checks that
// no 1-s window holds more than rate + burst and that seconds 2–11 average
// at least 0.8 × rate.
func farFleet(t *testing.T, name string, n, rate, burst, concurrency int) {
	t.Helper()
	url := newURL(t)
	far := farURL(t, url, 20*time.Millisecond)
	d := newDest(t, nil)
	platformWithSources(t, url, name, d.URL(), n, "--rate", strconv.Itoa(rate), "--burst", strconv.Itoa(burst))
	var ws []*proc
	for i := range 3 {
		ws = append(ws, startWorker(t, far, "far"+string(rune('1'+i)), "--concurrency", strconv.Itoa(concurrency)))
	}
	prefix := "/" + name + "/"
	first := waitArrivals(t, d, prefix, 1, 60*time.Second)
	waitUntil(t, d, prefix, first.Add(12*time.Second), 60*time.Second)
	stopAll(ws)
	arrivals := d.Arrivals(prefix)
	from, to := first.Add(2*time.Second), first.Add(11*time.Second)
	mean := float64(arrivalsBetween(arrivals, from, to)) / to.Sub(from).Seconds()
	maxWin, bound := maxInWindow(arrivals, time.Second), rate+burst
	t.Logf("20 ms away: 3 workers at %d/s burst %d: steady mean %.2f/s = %.2f × ceiling, largest 1-s window %d (bound %d); per second %s",
		rate, burst, mean, mean/float64(rate), maxWin, bound, perSecond(rateSeries(arrivals, first, time.Second)))
	if maxWin > bound {
		t.Errorf("a 1-s window held %d requests; the ceiling is %d/s + burst %d", maxWin, rate, burst)
	}
	if mean < 0.8*float64(rate) {
		t.Errorf("steady mean %.2f/s < 0.8 × %d/s with the database 20 ms away", mean, rate)
	}
}
