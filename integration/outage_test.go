package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/worker"
)

// PostgreSQL stops for 8 s while three workers run. The workers stay up, the
// destination never sees more than the ceiling, /readyz answers 503 with
// Retry-After while the database is down (once its snapshot of before the
// stop, at most worker.ReadyMaxAge old, has expired), work resumes by itself once it is
// back, and every source is eventually checked. (This is also the
// end-to-end form of the "Connections (c)" test: /readyz while the database
// is down.)
func TestDatabaseOutage(t *testing.T) {
	// Not parallel: its bound (ceiling + burst in every 1-s window at the
	// destination) leaves one request for delivery jitter, so it runs alone,
	// before the parallel tests load the machine.
	const (
		rate    = 10
		burst   = 2
		sources = 150
		outage  = 8 * time.Second
	)
	ctx := context.Background()
	c := testdb.Private(t, pgembed.Config{})
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE DATABASE outage`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	url := c.URL("outage")
	cli(t, url, "schema", "apply")

	d := newDest(t, nil)
	platformWithSources(t, url, "o", d.URL(), sources, "--rate", fmt.Sprint(rate), "--burst", fmt.Sprint(burst))
	var ws []*proc
	for i := range 3 {
		ws = append(ws, startWorker(t, url, fmt.Sprintf("w%d", i+1), "--concurrency", "5",
			"--job-timeout", "2s", "--rescue-after", "3s"))
	}
	waitArrivals(t, d, "/o/", 30, 30*time.Second)
	for _, w := range ws {
		if code, _, err := getReady(w.http()); err != nil || code != 200 {
			t.Fatalf("%s /readyz before the outage: %d %v", w.name, code, err)
		}
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	before := d.Count("/o/")

	// While the database is down: every worker's /readyz is 503 with a
	// Retry-After, probed every 500 ms.
	var (
		mu      sync.Mutex
		probes  int
		badness []string
	)
	for time.Since(stoppedAt) < outage-time.Second {
		for _, w := range ws {
			code, retry, err := getReady(w.http())
			if err == nil && code == 200 && time.Since(stoppedAt) < worker.ReadyMaxAge+time.Second {
				continue // the readiness snapshot taken before the stop, at most ReadyMaxAge old
			}
			mu.Lock()
			probes++
			if err != nil || code != 503 || retry == "" {
				badness = append(badness, fmt.Sprintf("%s: %d Retry-After %q err %v", w.name, code, retry, err))
			}
			mu.Unlock()
		}
		time.Sleep(500 * time.Millisecond)
	}
	for time.Since(stoppedAt) < outage {
		time.Sleep(50 * time.Millisecond)
	}
	duringOutage := d.Count("/o/") - before
	for _, w := range ws {
		if !w.alive() {
			t.Fatalf("%s exited during the outage\n%s", w.name, tail(w.log.String(), 4096))
		}
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restartedAt := time.Now()

	// Readiness comes back without restarting anything.
	var readyAgain time.Duration
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ok := 0
		for _, w := range ws {
			if code, _, err := getReady(w.http()); err == nil && code == 200 {
				ok++
			}
		}
		if ok == len(ws) {
			readyAgain = time.Since(restartedAt)
			break
		}
	}
	if readyAgain == 0 {
		t.Errorf("/readyz not 200 on every worker 30 s after the database came back")
	}
	db := pool(t, url)
	allDone := waitAllChecked(t, db, 90*time.Second)
	for _, w := range ws {
		if !w.alive() {
			t.Errorf("%s is not running at the end", w.name)
		}
		w.stop()
	}

	arrivals := d.Arrivals("/o/")
	var resumed time.Duration
	for _, a := range arrivals {
		if a.After(restartedAt) {
			resumed = a.Sub(restartedAt)
			break
		}
	}
	maxWin := maxInWindow(arrivals, time.Second)
	t.Logf("outage: PostgreSQL down %s; /readyz probes %d (all 503 + Retry-After: %v); %d request(s) during the outage; after restart: /readyz 200 in %s, first request in %s, all %d sources checked %s after the restart; max %d requests in a 1-s window (bound %d)",
		outage, probes, len(badness) == 0, duringOutage, readyAgain.Round(10*time.Millisecond), resumed.Round(10*time.Millisecond),
		sources, allDone.Sub(restartedAt).Round(100*time.Millisecond), maxWin, rate+burst)
	t.Logf("outage: per second from the first request: %s", perSecond(rateSeries(arrivals, arrivals[0], time.Second)))
	if len(badness) > 0 {
		t.Errorf("/readyz during the outage: %s", strings.Join(badness, "; "))
	}
	if maxWin > rate+burst {
		t.Errorf("a 1-s window held %d requests; ceiling %d/s + burst %d", maxWin, rate, burst)
	}
	if resumed == 0 {
		t.Errorf("no request after the database came back")
	}
}
