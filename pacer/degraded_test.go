package pacer

import (
	"context"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/fakedest"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

// Three processes pacing when the PostgreSQL server stops mid-run: the
// aggregate stays within the ceiling, each process dials at most once per
// 5-s latch while the server is down, and after the restart shared pacing
// resumes in the same processes.
func TestDegradedProcessesKeepTheCeiling(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own PostgreSQL cluster and runs for ~25 s")
	}
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgembed.Start(ctx, pgembed.Config{InitCache: testdb.InitCache()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Close(context.Background()) })
	url := cluster.URL("postgres")
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleetpace.Apply(ctx, pool, nil); err != nil {
		t.Fatal(err)
	}
	const ratePerSec, burst, procs = 20.0, 1, 3
	addPlatform(t, pool, platformSpec{name: "outage", rate: ratePerSec, burst: burst})
	pool.Close()

	start := time.Now().Add(2 * time.Second)
	stopAt, restartAt := start.Add(3*time.Second), start.Add(11*time.Second)
	type marks struct{ stopBegin, stopEnd, restartBegin, restartEnd time.Time }
	done := make(chan error, 1)
	var m marks
	go func() {
		time.Sleep(time.Until(stopAt))
		m.stopBegin = time.Now()
		if err := cluster.Stop(ctx); err != nil {
			done <- err
			return
		}
		m.stopEnd = time.Now()
		time.Sleep(time.Until(restartAt))
		m.restartBegin = time.Now()
		err := cluster.Restart(ctx)
		m.restartEnd = time.Now()
		done <- err
	}()
	res := runChildren(t, procs, map[string]string{
		"PACER_MODE":     "pace",
		"PACER_URL":      url,
		"PACER_PLATFORM": "outage",
		"PACER_FLEET":    strconv.Itoa(procs),
		"PACER_START":    strconv.FormatInt(start.UnixNano(), 10),
		"PACER_DURATION": strconv.FormatInt(int64(20*time.Second), 10),
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	all := merged(res)
	t.Logf("largest 1-s window across the run: %d", fakedest.MaxInWindow(all, time.Second))
	if w := fakedest.MaxInWindow(all, time.Second); w > int(ratePerSec)+burst {
		logTimeline(t, res, start, map[string]time.Time{"stopBegin": m.stopBegin, "stopEnd": m.stopEnd, "restartBegin": m.restartBegin, "restartEnd": m.restartEnd})
		t.Fatalf("a 1-s window held %d grants across the outage, ceiling+burst is %d", w, int(ratePerSec)+burst)
	}
	outageFires := 0
	for i, r := range res {
		// While the server is down, one attempt per latch period (the pool's
		// probe; the slow-down listener only reconnects after a probe got
		// through). After the restart, the probe and the listener reconnect.
		var dials, outageDials []time.Time
		for _, d := range r.Dials {
			ts := time.Unix(0, d)
			if ts.Before(m.stopBegin) {
				continue
			}
			dials = append(dials, ts)
			if ts.Before(m.restartBegin) {
				outageDials = append(outageDials, ts)
			}
		}
		sort.Slice(outageDials, func(a, b int) bool { return outageDials[a].Before(outageDials[b]) })
		for j := 1; j < len(outageDials); j++ {
			if gap := outageDials[j].Sub(outageDials[j-1]); gap < 4900*time.Millisecond {
				t.Fatalf("process %d dialled twice within %s while the server was down (latch is 5s); dials %v", i, gap, outageDials)
			}
		}
		if len(dials) < 2 {
			t.Fatalf("process %d made %d connection attempts after the stop; it should probe during the outage and reconnect after it", i, len(dials))
		}
		degradedDuring, sharedAfter := 0, 0
		for k, f := range r.fireTimes() {
			switch {
			case r.Degraded[k] && f.After(m.stopEnd) && f.Before(m.restartBegin):
				degradedDuring++
			case !r.Degraded[k] && f.After(m.restartEnd):
				sharedAfter++
			}
		}
		outageFires += degradedDuring
		if degradedDuring == 0 || sharedAfter == 0 || r.Stats.Degraded == 0 {
			t.Fatalf("process %d: %d degraded grants during the outage, %d shared grants after the restart (stats %+v)",
				i, degradedDuring, sharedAfter, r.Stats)
		}
		t.Logf("process %d: dials after stop %d, degraded grants %d during outage, shared after restart %d, stats %+v",
			i, len(dials), degradedDuring, sharedAfter, r.Stats)
	}
	// Not fail-closed: about rate × procs / (procs + 1) during the outage.
	outage := m.restartBegin.Sub(m.stopEnd).Seconds()
	if want := 0.5 * ratePerSec * procs / (procs + 1) * outage; float64(outageFires) < want {
		t.Fatalf("%d degraded grants in %.1fs of outage, want at least %.0f", outageFires, outage, want)
	}
}

func logTimeline(t *testing.T, res []childResult, start time.Time, marks map[string]time.Time) {
	type ev struct {
		at   time.Time
		what string
	}
	var evs []ev
	for i, r := range res {
		for k, f := range r.fireTimes() {
			evs = append(evs, ev{f, "p" + strconv.Itoa(i) + map[bool]string{true: " degraded", false: " shared"}[r.Degraded[k]]})
		}
		for _, d := range r.Dials {
			evs = append(evs, ev{time.Unix(0, d), "p" + strconv.Itoa(i) + " DIAL"})
		}
	}
	for k, v := range marks {
		evs = append(evs, ev{v, "== " + k})
	}
	sort.Slice(evs, func(a, b int) bool { return evs[a].at.Before(evs[b].at) })
	for _, e := range evs {
		t.Logf("%8.3f %s", e.at.Sub(start).Seconds(), e.what)
	}
}
