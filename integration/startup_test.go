package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

// Six workers started in the same instant on a fresh embedded cluster (the
// README's mode: each one applies the schema as it starts), ten times:
// every worker starts and runs scan ticks, none logs a deadlock, none
// exits before it is told to, and each exits 0 on SIGTERM. The first run
// starts on an empty data directory (the workers race to create the
// cluster too); each later one on the same cluster with its database
// dropped, so the schema is applied from nothing again without ten
// initdb runs.
func TestConcurrentStartOnEmbeddedCluster(t *testing.T) {
	t.Parallel()
	const runs = 10
	dir := embeddedDir(t)
	for run := range runs {
		if !t.Run(fmt.Sprintf("run%d", run+1), func(t *testing.T) { startSixWorkers(t, dir) }) {
			return
		}
		c, err := pgembed.Attach(pgembed.Config{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "DROP DATABASE "+pgembed.DatabaseName+" WITH (FORCE)")
		conn.Close(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// startSixWorkers starts six workers at once on the embedded cluster under
// dir and waits until each has run a few scan ticks; see
// TestConcurrentStartOnEmbeddedCluster.
func startSixWorkers(t *testing.T, dir string) {
	const workers = 6
	t0 := time.Now()
	ws := make([]*proc, workers)
	for i := range ws {
		ws[i] = startProc(t, fmt.Sprintf("w%d", i+1), "--data-dir", dir, "-q", "--connect-timeout", "5s",
			"worker", "--http-addr", "127.0.0.1:0", "--startup-jitter", "0",
			"--poll-base", "200ms", "--poll-max", "500ms", "--heartbeat", "1s")
	}
	for _, w := range ws {
		select {
		case <-w.ready:
		case <-w.done:
			t.Fatalf("%s exited at start: %v\n%s", w.name, w.err, tail(w.log.String(), 4096))
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: no HTTP address logged within 60 s\n%s", w.name, tail(w.log.String(), 4096))
		}
	}
	readyAt := time.Since(t0)
	// Every worker has run or skipped ticks: the scan loop has been through
	// the tick and its prune several times on each.
	for _, w := range ws {
		deadline := time.Now().Add(60 * time.Second)
		for scanTicksAll(w) < 3 {
			if !w.alive() {
				t.Fatalf("%s exited: %v\n%s", w.name, w.err, tail(w.log.String(), 4096))
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s ran fewer than 3 scan ticks in 60 s\n%s", w.name, tail(w.log.String(), 4096))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	ticked := time.Since(t0)
	for _, w := range ws {
		w.stop() // fails the test unless it exits 0
	}
	for _, w := range ws {
		if l := w.log.String(); strings.Contains(strings.ToLower(l), "deadlock") {
			t.Errorf("%s logged a deadlock:\n%s", w.name, tail(l, 4096))
		}
	}
	t.Logf("6 workers ready after %s, ticking after %s", readyAt.Round(time.Millisecond), ticked.Round(time.Millisecond))
}

// embeddedDir returns a data directory for a fresh embedded cluster (its
// parents searchable by the postgres user the server runs as under root),
// stopped and removed when the test ends.
func embeddedDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(testdb.SearchableDir(t, "fleetpace-embedded-"), "data")
	t.Cleanup(func() {
		out, err := exec.Command(bin, "--data-dir", dir, "-q", "embedded", "stop").CombinedOutput()
		if err != nil {
			t.Errorf("embedded stop: %v\n%s", err, out)
		}
	})
	return dir
}

var allTicksRE = regexp.MustCompile(`fleetpace_scan_ticks_total\{result="\w+"\} (\d+)`)

// scanTicksAll reads the worker's count of scan ticks, whatever their
// result (ran, skipped, failed).
func scanTicksAll(p *proc) int {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(p.http() + "/metrics")
	if err != nil {
		return 0 // checked again; an exit is caught by the caller
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	n := 0
	for _, m := range allTicksRE.FindAllSubmatch(b, -1) {
		k, _ := strconv.Atoi(string(m[1]))
		n += k
	}
	return n
}
