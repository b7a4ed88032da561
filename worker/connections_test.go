package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/status"
	"github.com/fleetpace/fleetpace/worker"
)

// An exhausted server refuses at once; the scan loop makes one attempt per
// cycle and backs off on its jittered schedule instead of re-knocking.
func TestExhaustedServerFailsFastAndLoopBacksOff(t *testing.T) {
	t.Parallel()
	c := testdb.Private(t, pgembed.Config{Settings: map[string]string{"max_connections": "4", "superuser_reserved_connections": "0"}})
	ctx := context.Background()
	// Occupy every connection slot, until the server says so: on a loaded
	// machine a connect can fail for other reasons (a timeout) with slots
	// still free, and the pool would then take one.
	var held []*pgx.Conn
	for deadline := time.Now().Add(time.Minute); ; {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.TooManyConnections {
			break
		}
		if err != nil {
			if time.Now().After(deadline) {
				t.Fatalf("filling the server's connection slots: %v", err)
			}
			continue
		}
		held = append(held, conn)
	}
	defer func() {
		for _, conn := range held {
			conn.Close(ctx)
		}
	}()
	if len(held) == 0 {
		t.Fatal("could not hold any connection")
	}

	var attempts atomic.Int64
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: c.URL("postgres"), Attempts: &attempts})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}

	const base, jitter = 200 * time.Millisecond, 0.5
	var (
		cycles    []time.Duration // how long each failed cycle took
		attemptsN []int64         // dials per cycle
	)
	// The loop sleeps on a fake clock that advances itself: the backoff is
	// recorded, not waited for; the cycles run against the real server.
	virtual := clocktest.NewAuto()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	err = poller.Run(runCtx, poller.Config{
		Base: base, Max: time.Second, JitterRatio: jitter, StartupJitter: poller.NoStartupJitter, Clock: virtual,
	}, func(ctx context.Context) (bool, error) {
		if len(virtual.Sleeps()) >= 3 {
			cancel()
			return false, nil
		}
		before := attempts.Load()
		start := time.Now()
		_, err := scan.Tick(ctx, pool, client, scan.Config{})
		cycles = append(cycles, time.Since(start))
		attemptsN = append(attemptsN, attempts.Load()-before)
		if err == nil {
			t.Error("tick succeeded against an exhausted server")
		} else if !dbconn.IsUnavailable(err) {
			t.Errorf("tick error %v is not classified as unavailable", err)
		}
		return false, err
	})
	if err != nil {
		t.Fatal(err)
	}
	sleeps := virtual.Sleeps()
	if len(cycles) < 2 {
		t.Fatalf("only %d cycles ran", len(cycles))
	}
	for i, d := range cycles {
		if d >= time.Second {
			t.Errorf("cycle %d took %s, want < 1 s (fail fast, no retry)", i, d)
		}
		if attemptsN[i] != 1 {
			t.Errorf("cycle %d made %d connection attempts, want exactly 1", i, attemptsN[i])
		}
	}
	// After a failed cycle the loop sleeps at least base × (1 − j), and the
	// schedule doubles.
	if sleeps[0] < time.Duration(float64(base)*(1-jitter)) {
		t.Errorf("first sleep after a failure %s < base × (1 − j) = %s", sleeps[0], time.Duration(float64(base)*(1-jitter)))
	}
	if sleeps[1] < time.Duration(float64(2*base)*(1-jitter)) {
		t.Errorf("second sleep %s did not back off (want ≥ %s)", sleeps[1], time.Duration(float64(2*base)*(1-jitter)))
	}
}

// /readyz answers 503 with Retry-After while the database is down, and 200
// again once it is back, without restarting the worker.
func TestReadyzFollowsDatabase(t *testing.T) {
	t.Parallel()
	c := testdb.Private(t, pgembed.Config{Settings: nil})
	t.Cleanup(http.DefaultClient.CloseIdleConnections) // no keep-alive goroutines left behind
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, done := runWorker(t, ctx, worker.Config{DatabaseURL: c.URL("postgres"), HTTPAddr: "127.0.0.1:0", ConnectTimeout: time.Second})
	get := func() (*http.Response, error) {
		return http.Get("http://" + addr.String() + "/readyz")
	}
	resp, err := get()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz before outage: %v %v", resp, err)
	}
	resp.Body.Close()

	// The other endpoints answer, and /metrics has the figures operators need.
	body := func(path string) string {
		t.Helper()
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		return string(b)
	}
	metrics := body("/metrics")
	for _, name := range []string{
		"fleetpace_pacer_degraded_reservations_total", "fleetpace_pacer_reservations_total",
		"fleetpace_cooldowns_active", "fleetpace_database_up 1", "fleetpace_fleet_size",
		"fleetpace_record_checks_total", "fleetpace_pacer_block_reservations_total",
		"fleetpace_pacer_slowdowns_total", "fleetpace_pacer_slots_given_back_total", "fleetpace_pacer_overruns_total", "fleetpace_pacer_listening",
	} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	// /status is the status report as JSON: this worker is live, and the
	// one platform is reported with its pacer state.
	pool, err := dbconn.NewPool(ctx, dbconn.Config{URL: c.URL("postgres"), MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sources.SetPlatform(ctx, pool, sources.Platform{Name: "st", RatePerSec: 4})
	pool.Close()
	if err != nil {
		t.Fatal(err)
	}
	var rep status.Report
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		rep = status.Report{}
		if err := json.Unmarshal([]byte(body("/status")), &rep); err != nil {
			t.Fatalf("/status is not a status report: %v", err)
		}
		if rep.Workers > 0 || time.Now().After(deadline) { // the first heartbeat has landed
			break
		}
	}
	if rep.Workers != 1 || len(rep.Fleet) != 1 || rep.Fleet[0].PID != os.Getpid() {
		t.Errorf("/status: %d live workers %+v, want this process", rep.Workers, rep.Fleet)
	}
	if len(rep.Platforms) != 1 || rep.Platforms[0].Name != "st" || rep.Platforms[0].Pace.Rate != 4 || rep.Platforms[0].Pace.Multiplier != 1 {
		t.Errorf("/status platforms = %+v, want st at 4/s, multiplier 1", rep.Platforms)
	}
	if ui := body("/riverui/"); !strings.Contains(strings.ToLower(ui), "<html") {
		t.Errorf("/riverui/ is not the River UI page")
	}
	// The dashboard at /, with the platform and this worker.
	if page := body("/"); !strings.Contains(page, `data-platform="st"`) || !strings.Contains(page, "Live workers: 1") {
		t.Errorf("/ is not the dashboard with platform st and this worker:\n%s", page)
	}

	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// /readyz answers from a snapshot at most worker.ReadyMaxAge old: it
	// says 503 within that, each answer fast.
	stopped := time.Now()
	for {
		start := time.Now()
		resp, err = get()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("readyz took %s during the outage, want a fast answer", d)
		}
		if resp.StatusCode != http.StatusOK {
			break
		}
		if time.Since(stopped) > worker.ReadyMaxAge+5*time.Second {
			t.Fatalf("readyz still 200 %s after the database stopped", time.Since(stopped))
		}
		time.Sleep(50 * time.Millisecond) // polling: the next snapshot is due within ReadyMaxAge
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("readyz during outage: %d Retry-After %q, want 503 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// The dashboard says so in a banner.
	resp, err = http.Get("http://" + addr.String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(page), "The database is unreachable") {
		t.Errorf("dashboard during outage: %d\n%s", resp.StatusCode, page)
	}
	// /healthz is about the process, not the database.
	resp, err = http.Get("http://" + addr.String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz during outage: %s", resp.Status)
	}

	if err := c.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Ready again within a few snapshots (the first ping after the restart
	// may find a dead pooled connection).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err = get()
		if err != nil || resp.StatusCode == http.StatusOK || time.Now().After(deadline) {
			break
		}
		resp.Body.Close()
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		body := ""
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
		}
		t.Fatalf("readyz after the database came back: %v %v %s", resp.Status, err, body)
	}
	resp.Body.Close()
	cancel()
	if err := await(t, done, "the worker to stop"); err != nil {
		t.Fatalf("worker: %v", err)
	}
}

// Shutdown reports its errors: a worker stopped while the database is down
// cannot delete its row, and Run says so (a clean shutdown returns nil:
// TestReadyzFollowsDatabase).
func TestRunReportsShutdownErrors(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: stops a private PostgreSQL under a running worker")
	}
	c := testdb.Private(t, pgembed.Config{Settings: nil})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, done := runWorker(t, ctx, worker.Config{DatabaseURL: c.URL("postgres"), ConnectTimeout: time.Second, SoftStop: time.Second, DisableScan: true})
	if err := c.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel()
	err := await(t, done, "the worker to stop")
	if err == nil || !strings.Contains(err.Error(), "fleet: leave") || !dbconn.IsUnavailable(err) {
		t.Fatalf("Run after a shutdown without the database = %v, want the row's delete failing as unavailable", err)
	}
	t.Logf("Run: %v", err)
}

// A worker whose database is unreachable when River starts waits for it,
// as for any outage, and starts working when it is back: it does not exit
// (an embedded cluster stopped while a worker was starting ended the
// worker with "start river: terminating connection").
func TestWorkerStartsWhenTheDatabaseComesBack(t *testing.T) {
	t.Parallel()
	c := testdb.Private(t, pgembed.Config{Settings: nil})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	retrying := make(chan struct{})
	ready := make(chan struct{})
	cfg := worker.Config{DatabaseURL: c.URL("postgres"), ConnectTimeout: time.Second,
		Logger: slog.New(&signalHandler{msg: "worker: the database is unavailable; River starts when it is back", ch: retrying}),
		Ready:  func(net.Addr) { close(ready) }}
	cfg.Poll.StartupJitter = poller.NoStartupJitter
	cfg.Poll.Base, cfg.Poll.Max = 100*time.Millisecond, 500*time.Millisecond
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx, cfg) }()
	select {
	case <-retrying:
	case err := <-done:
		t.Fatalf("the worker exited while the database was down: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("no retry within 60 s")
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the worker exited: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the worker did not start within 60 s of the database's return")
	}
	cancel()
	if err := await(t, done, "the worker to stop"); err != nil {
		t.Fatal(err)
	}
}
