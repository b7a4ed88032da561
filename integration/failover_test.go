package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

// Failover to a synchronous streaming standby while three workers run on a
// multi-host URL (primary, standby; target_session_attrs=read-write): the
// primary is killed (pg_ctl stop -m immediate, as a crash), the standby
// promoted 3 s later. Nothing is lost — every source is checked, every
// River job completes, and every check the old primary showed is on the
// new one (with --recorder-sync-commit the recorder honours synchronous
// replication; by default its commits wait for neither the disk nor the
// standby, and a check lost so is fetched again) —, no 1-s window
// at the destination holds more than rate + burst, the workers resume by
// themselves, and the fleet is back at full speed within 3 s of the new
// primary accepting writes.
func TestFailover(t *testing.T) {
	// Not parallel: its bound (ceiling + burst in every 1-s window at the
	// destination) leaves one request for delivery jitter, so it runs alone,
	// before the parallel tests load the machine.
	const (
		rate, burst = 20, 2
		sources     = 400
		outage      = 3 * time.Second // from the kill to the promotion
		fullSpeed   = 0.9 * rate      // a 1-s window at full speed holds at least this many
		sustained   = 3 * time.Second // … from the moment full speed is back, for this long
		maxBack     = 3 * time.Second
	)
	ctx := context.Background()
	// Durable commits (the temporary clusters' default is off), so that
	// synchronous replication means something.
	settings := map[string]string{"synchronous_commit": "on", "wal_sender_timeout": "5s"}
	primary, err := pgembed.Start(ctx, pgembed.Config{Settings: settings, InitCache: testdb.InitCache()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Close(context.Background()) })
	execSQL(t, primary.URL("postgres"), `CREATE DATABASE failover`)
	standby, err := primary.StartStandby(ctx, pgembed.Config{Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close(context.Background()) })
	// Synchronous from now on: a commit returns once the standby has it.
	execSQL(t, primary.URL("postgres"), `ALTER SYSTEM SET synchronous_standby_names = '*'`)
	execSQL(t, primary.URL("postgres"), `SELECT pg_reload_conf()`)
	waitSQL(t, primary.URL("postgres"), `SELECT count(*) = 1 FROM pg_stat_replication WHERE sync_state = 'sync'`, 30*time.Second)

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/failover?sslmode=disable&target_session_attrs=read-write",
		primary.Port(), standby.Port())
	cli(t, url, "schema", "apply")
	d := newDest(t, nil)
	platformWithSources(t, url, "f", d.URL(), sources, "--rate", fmt.Sprint(rate), "--burst", fmt.Sprint(burst))
	// A job River hands out as the primary dies can be committed running
	// (the standby has it) while its worker never got it: River's rescuer
	// takes it after --rescue-after (5 min by default), beyond this test's
	// 2-min wait (a fresh-clone run left one source unchecked so; its job's
	// state was not recorded). A short rescue keeps that within the wait.
	ws := startWorkers(t, url, "f", 3, "--concurrency", "10", "--recorder-sync-commit",
		"--job-timeout", "30s", "--rescue-after", "40s")
	waitArrivals(t, d, "/f/", 3*rate, 30*time.Second)

	// Readiness of every worker, every 100 ms, until the end.
	ready := &readiness{}
	stopWatch := ready.watch(ws)
	defer stopWatch()

	// What the old primary shows: committed, so (synchronous) on the standby.
	before := checkedAt(t, primary.URL("failover"))
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	<-time.After(time.Until(killedAt.Add(outage)))
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	writable := waitWritable(t, standby.URL("failover"))

	db := pool(t, standby.URL("failover"))
	allDone := waitAllChecked(t, db, 2*time.Minute)
	waitSQL(t, standby.URL("failover"), `SELECT count(*) = 0 FROM river_job WHERE state <> 'completed'`, time.Minute)
	stopWatch()
	for _, w := range ws {
		if !w.alive() {
			t.Errorf("%s is not running at the end", w.name)
		}
		w.stop()
	}

	after := checkedAt(t, standby.URL("failover"))
	lost := 0
	for id, at := range before {
		if got, ok := after[id]; !ok || got.Before(at) {
			lost++
		}
	}
	arrivals := d.Arrivals("/f/")
	distinct := map[string]bool{}
	for _, r := range d.Requests() {
		distinct[r.Path] = true
	}
	maxWin := maxInWindow(arrivals, time.Second)
	back, ok := fullSpeedAt(arrivals, writable, fullSpeed, sustained)
	notReady, readyAgain := ready.after(killedAt, writable)
	t.Logf("failover: primary killed, standby promoted %s later, writable %s after the kill; /readyz 503 on every worker %s after the kill, 200 again %s after writable; "+
		"full speed (≥ %.0f/s for %s) back %s after writable; %d checks on the old primary, %d missing on the new one; "+
		"%d requests for %d sources (%d fetched twice); all checked %s after writable; largest 1-s window %d (bound %d)",
		outage, writable.Sub(killedAt).Round(10*time.Millisecond), notReady.Round(10*time.Millisecond), readyAgain.Round(10*time.Millisecond),
		fullSpeed, sustained, back.Sub(writable).Round(10*time.Millisecond), len(before), lost,
		len(arrivals), sources, len(arrivals)-len(distinct), allDone.Sub(writable).Round(100*time.Millisecond), maxWin, rate+burst)
	t.Logf("failover: per second from 5 s before the kill: %s", perSecond(rateSeries(arrivals, killedAt.Add(-5*time.Second), time.Second)))
	var sliding []float64
	for s := writable; s.Before(writable.Add(6 * time.Second)); s = s.Add(250 * time.Millisecond) {
		sliding = append(sliding, float64(arrivalsBetween(arrivals, s, s.Add(time.Second))))
	}
	t.Logf("failover: requests in the 1-s window starting every 250 ms from writable: %s", perSecond(sliding))
	if len(distinct) != sources {
		t.Errorf("%d distinct sources fetched, want %d", len(distinct), sources)
	}
	if lost > 0 {
		t.Errorf("%d check(s) the old primary showed are missing on the new one", lost)
	}
	if maxWin > rate+burst {
		t.Errorf("a 1-s window held %d requests; the ceiling is %d/s + burst %d", maxWin, rate, burst)
		for _, a := range arrivals {
			if n := arrivalsBetween(arrivals, a, a.Add(time.Second)); n > rate+burst {
				t.Logf("%d requests in the 1-s window from %s after the kill (writable at %s)", n,
					a.Sub(killedAt).Round(time.Millisecond), writable.Sub(killedAt).Round(time.Millisecond))
			}
		}
	}
	if !ok || back.Sub(writable) > maxBack {
		t.Errorf("full speed back %s after the new primary accepted writes (found: %v), want ≤ %s", back.Sub(writable), ok, maxBack)
	}
}

// execSQL runs one statement on url.
func execSQL(t *testing.T, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// waitSQL polls a boolean query on url until it is true; it fails the test
// after timeout.
func waitSQL(t *testing.T, url, sql string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var ok bool
		conn, err := pgx.Connect(context.Background(), url)
		if err == nil {
			err = conn.QueryRow(context.Background(), sql).Scan(&ok)
			conn.Close(context.Background())
		}
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s (%v)", timeout, sql, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitWritable returns when a write on url first succeeds.
func waitWritable(t *testing.T, url string) time.Time {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(context.Background(), url)
		if err == nil {
			_, err = conn.Exec(context.Background(), `CREATE TEMP TABLE probe (x int)`)
			conn.Close(context.Background())
		}
		if err == nil {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the promoted standby accepts no write: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkedAt reads every checked source's last check time on url.
func checkedAt(t *testing.T, url string) map[int64]time.Time {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rows, err := p.Query(context.Background(), `SELECT id, last_checked_at FROM fleetpace_source WHERE last_checked_at IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]time.Time{}
	for rows.Next() {
		var id int64
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		out[id] = at
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// fullSpeedAt returns the first moment at or after from (on a 50-ms grid)
// from which every 1-s window starting within the next sustained holds at
// least perSecond arrivals.
func fullSpeedAt(arrivals []time.Time, from time.Time, perSecond float64, sustained time.Duration) (time.Time, bool) {
	const step = 50 * time.Millisecond
	if len(arrivals) == 0 {
		return time.Time{}, false
	}
	last := arrivals[len(arrivals)-1]
	for t := from; !t.Add(sustained + time.Second).After(last); t = t.Add(step) {
		ok := true
		for s := t; !s.After(t.Add(sustained)); s = s.Add(step) {
			if float64(arrivalsBetween(arrivals, s, s.Add(time.Second))) < perSecond {
				ok = false
				break
			}
		}
		if ok {
			return t, true
		}
	}
	return time.Time{}, false
}

// readiness records every worker's /readyz answers over time.
type readiness struct {
	mu     sync.Mutex
	points []readyPoint
}

type readyPoint struct {
	at    time.Time
	ready int // workers answering 200
	of    int
}

// watch polls every worker's /readyz every 100 ms until the returned stop
// is called (more than once is fine).
func (r *readiness) watch(ws []*proc) (stop func()) {
	done := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			n := 0
			for _, w := range ws {
				if code, _, err := getReady(w.http()); err == nil && code == 200 {
					n++
				}
			}
			r.mu.Lock()
			r.points = append(r.points, readyPoint{time.Now(), n, len(ws)})
			r.mu.Unlock()
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// after returns how long after down no worker was ready, and how long after
// up every worker was ready again (0: never seen).
func (r *readiness) after(down, up time.Time) (notReady, readyAgain time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.points {
		if notReady == 0 && p.at.After(down) && p.ready == 0 {
			notReady = p.at.Sub(down)
		}
		if readyAgain == 0 && p.at.After(up) && p.ready == p.of {
			readyAgain = p.at.Sub(up)
		}
	}
	return notReady, readyAgain
}
