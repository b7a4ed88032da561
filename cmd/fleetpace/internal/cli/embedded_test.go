package cli_test

import (
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/syncbuf"
)

// eventually polls cond every 100 ms until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
	}
}

// stopped waits up to within for what to stop after signal (its exit
// status on done), failing the test if it did not, or did with an error.
func stopped(t *testing.T, done <-chan error, within time.Duration, what, signal string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s after %s: %v, want exit 0", what, signal, err)
		}
	case <-time.After(within):
		t.Fatalf("%s did not stop within %s of %s", what, within, signal)
	}
}

var embeddedPortRE = regexp.MustCompile(`using embedded PostgreSQL in \S+ \(127\.0\.0\.1:(\d+)\)`)

// A worker on the embedded cluster rides through `embedded stop` and the
// next command's start of the cluster as through an outage: the cluster
// comes back on its port (it moved to a new one before, and the worker's
// /readyz stayed 503 for ever).
func TestWorkerRidesThroughEmbeddedRestart(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: restarts the embedded cluster under a running worker")
	}
	dir := embeddedDataDir(t)
	port := func(r result) string {
		t.Helper()
		m := embeddedPortRE.FindStringSubmatch(r.stderr)
		if r.code != 0 || m == nil {
			t.Fatalf("no embedded cluster: %s", r)
		}
		return m[1]
	}
	first := port(run(t, "", "--data-dir", dir, "platforms", "list"))
	t.Cleanup(func() { run(t, "", "--data-dir", dir, "embedded", "stop") })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worker := exec.CommandContext(ctx, binary, "--data-dir", dir, "--connect-timeout", "1s", "worker", "--http-addr", "127.0.0.1:0",
		"--startup-jitter", "0", "--poll-base", "200ms", "--poll-max", "1s", "--heartbeat", "1s")
	worker.Env = envWithout("DATABASE_URL")
	worker.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var log syncbuf.Buffer
	worker.Stderr = &log
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- worker.Wait() }()
	defer func() {
		if t.Failed() {
			t.Logf("worker log:\n%s", log.String())
		}
	}()
	addrRE := regexp.MustCompile(`msg="http server listening" addr=(\S+)`)
	var addr string
	eventually(t, 30*time.Second, "the worker's HTTP server", func() bool {
		if m := addrRE.FindStringSubmatch(log.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	client := http.Client{Timeout: 3 * time.Second}
	ready := func(want int) func() bool {
		return func() bool {
			resp, err := client.Get("http://" + addr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == want
		}
	}
	eventually(t, 30*time.Second, "/readyz 200 at start", ready(http.StatusOK))

	if r := run(t, "", "--data-dir", dir, "embedded", "stop"); r.code != 0 || !strings.Contains(r.stdout, "stopped") {
		t.Fatalf("embedded stop: %s", r)
	}
	eventually(t, 30*time.Second, "/readyz 503 while the cluster is stopped", ready(http.StatusServiceUnavailable))

	if again := port(run(t, "", "--data-dir", dir, "sources", "list")); again != first {
		t.Fatalf("the cluster came back on port %s, was %s: the worker is stranded", again, first)
	}
	eventually(t, 60*time.Second, "/readyz 200 again after the restart", ready(http.StatusOK))

	if err := worker.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped(t, done, 60*time.Second, "the worker", "SIGTERM")
}

// embedded url prints only the embedded database's URL, starting the
// cluster and applying the schema, whatever --database-url says: the URL
// works at once for a program using the library.
func TestEmbeddedURL(t *testing.T) {
	t.Parallel()
	dir := embeddedDataDir(t)
	t.Cleanup(func() { run(t, "", "--data-dir", dir, "embedded", "stop") })
	r := run(t, "", "--data-dir", dir, "--database-url", "postgres://elsewhere.invalid/x", "embedded", "url")
	url := strings.TrimSuffix(r.stdout, "\n")
	if r.code != 0 || !regexp.MustCompile(`^postgres://postgres@127\.0\.0\.1:\d+/fleetpace\?sslmode=disable$`).MatchString(url) {
		t.Fatalf("embedded url: %s", r)
	}
	if n := count(t, url, `SELECT count(*) FROM fleetpace_source`); n != 0 {
		t.Fatalf("%d sources in a new cluster", n)
	}
	if again := run(t, "", "--data-dir", dir, "-q", "embedded", "url"); again.code != 0 || again.stdout != r.stdout || again.stderr != "" {
		t.Fatalf("embedded url again: %s, want the same URL and nothing else", again)
	}
}
