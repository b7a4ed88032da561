package worker_test

// The worker's HTTP server under attack (the dashboard's side of it is
// dashboard/attack_test.go): a storm of probes, foreign Host headers, a
// client holding a request open at shutdown.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/netdelay"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

// proxyURL starts a proxy (netdelay, without a delay) in front of
// databaseURL's server, which counts the connections a process opens to
// the database, and returns it with the URL that goes through it; it stops
// with the test.
func proxyURL(t *testing.T, databaseURL string) (*netdelay.Proxy, string) {
	t.Helper()
	p, via, err := netdelay.StartURL(databaseURL, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, via
}

// busyWorker runs a worker through a counting proxy (proxyURL), fetching (with a
// fetcher that answers at once) the sources of a platform due every
// second, so its pacer reserves all along; it returns the worker's HTTP
// base URL and the proxy.
func busyWorker(t *testing.T, cfg worker.Config) (string, *netdelay.Proxy, *pgxpool.Pool) {
	t.Helper()
	dbURL := testdb.URL(t)
	pool := testdb.PoolOf(t, dbURL)
	ctx := context.Background()
	storetest.Platform(t, pool, sources.Platform{Name: "storm", RatePerSec: 50, Burst: 5})
	for i := range 100 {
		if _, _, err := sources.AddSource(ctx, pool, sources.NewSource{Platform: "storm", URL: fmt.Sprintf("https://storm.example/%d", i), Interval: time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	proxy, viaProxy := proxyURL(t, dbURL)
	cfg.DatabaseURL = viaProxy
	cfg.HTTPAddr = "127.0.0.1:0"
	cfg.Fetcher = fetch.FetcherFunc(func(context.Context, fetch.Request) fetch.Result {
		return fetch.Result{Outcome: fetch.OK, Status: 200}
	})
	runCtx, stop := context.WithCancel(ctx)
	addr, done := runWorker(t, runCtx, cfg)
	t.Cleanup(func() {
		stop()
		if err := await(t, done, "the worker to stop"); err != nil {
			t.Errorf("worker: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	// The pacer is busy: checks are being recorded.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM fleetpace_check`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d checks after 30 s, want the worker fetching", n)
		}
	}
	return "http://" + addr.String(), proxy, pool
}

// storm sends n requests for path at once and returns how many answered
// each status, and the distinct "at" of the JSON answers (a status report's
// time of reading).
func storm(t *testing.T, base, path string, n int) (map[int]int, map[string]bool) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	var (
		mu     sync.Mutex
		counts = map[int]int{}
		ats    = map[string]bool{}
		wg     sync.WaitGroup
		start  = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			status, at := 0, ""
			if res, err := client.Get(base + path); err == nil {
				var rep struct {
					At string `json:"at"`
				}
				_ = json.NewDecoder(res.Body).Decode(&rep)
				res.Body.Close()
				status, at = res.StatusCode, rep.At
			}
			mu.Lock()
			counts[status]++
			if at != "" {
				ats[at] = true
			}
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return counts, ats
}

var degradedRE = regexp.MustCompile(`(?m)^(fleetpace_pacer_degraded|fleetpace_pacer_degraded_reservations_total) (\S+)$`)

// degraded returns the pacer's degraded gauge and its count of reservations
// paced locally, from /metrics.
func degraded(t *testing.T, base string) (gauge, reservations float64) {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	found := 0
	for _, m := range degradedRE.FindAllStringSubmatch(string(b), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		if m[1] == "fleetpace_pacer_degraded" {
			gauge = v
		} else {
			reservations = v
		}
		found++
	}
	if found != 2 {
		t.Fatalf("/metrics lacks the pacer's degraded figures:\n%s", b)
	}
	return gauge, reservations
}

// A storm of 220 parallel /readyz, then of 100 /status, against a busy
// worker: every probe is answered 200 from the snapshot (the status read
// once), the worker opens no connection per request (a handful at most,
// whatever its own work needs meanwhile), and its pacer stays out of
// degraded mode.
func TestReadyzStorm(t *testing.T) {
	t.Parallel()
	base, proxy, _ := busyWorker(t, worker.Config{})
	before := proxy.Accepted()
	if counts, _ := storm(t, base, "/readyz", 220); counts[http.StatusOK] != 220 {
		t.Errorf("220 parallel /readyz: %v, want 220 × 200", counts)
	}
	counts, ats := storm(t, base, "/status", 100)
	if counts[http.StatusOK] != 100 {
		t.Errorf("100 parallel /status: %v, want 100 × 200", counts)
	}
	if len(ats) > 2 { // one read, or two if the storm straddles the snapshot's period
		t.Errorf("100 parallel /status were read %d times, want once", len(ats))
	}
	if opened := proxy.Accepted() - before; opened > 10 {
		t.Errorf("the worker opened %d database connections during 320 requests, want a handful at most", opened)
	}
	if gauge, reservations := degraded(t, base); gauge != 0 || reservations != 0 {
		t.Errorf("the pacer went degraded (gauge %v, %v reservations paced locally)", gauge, reservations)
	}
}

// /healthz, /readyz and /metrics answer whatever Host a probe or a scraper
// names the worker by; the dashboard, /status and River UI answer only to
// the loopback names, the listening address and the allowed hosts.
func TestWorkerHosts(t *testing.T) {
	t.Parallel()
	base, _, _ := busyWorker(t, worker.Config{AllowedHosts: []string{"worker-1.internal"}})
	get := func(path, host string) int {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Host = host
		req.Header.Set("Accept", "text/html")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		for _, host := range []string{"fleetpace.monitoring.svc:9464", "10.1.2.3:9464", "rebind.attacker.example"} {
			if status := get(path, host); status != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d, want 200", path, host, status)
			}
		}
	}
	for _, path := range []string{"/", "/status", "/riverui/", "/platforms/storm"} {
		if status := get(path, "rebind.attacker.example:9464"); status != http.StatusMisdirectedRequest {
			t.Errorf("GET %s with a foreign Host: %d, want 421", path, status)
		}
		if status := get(path, "worker-1.internal:9464"); status != http.StatusOK {
			t.Errorf("GET %s with an allowed Host: %d, want 200", path, status)
		}
	}
}

// A worker stopped while a client holds a request open (its body sent
// slowly) stops cleanly: the straggler's connection is closed after the
// shutdown timeout, and Run returns nil.
func TestWorkerStopsWithStraggler(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addr, done := runWorker(t, ctx, worker.Config{DatabaseURL: dbURL, HTTPAddr: "127.0.0.1:0", DisableScan: true, SoftStop: time.Second,
		AdminToken: "a token for the sign-in form"})
	conn, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /login HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntoken=", addr)
	stop()
	if err := await(t, done, "the worker to stop"); err != nil {
		t.Errorf("Run with a straggler at shutdown: %v, want nil", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Errorf("the straggler's connection after the worker stopped: %v, want closed", err)
	}
}
