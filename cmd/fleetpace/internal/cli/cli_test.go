package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/testbin"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/status"
)

var binary string

func TestMain(m *testing.M) { testbin.Main(testdb.M(m), &binary) }

type result struct {
	code           int
	stdout, stderr string
	elapsed        time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("exit %d after %s\nstdout: %s\nstderr: %s", r.code, r.elapsed, r.stdout, r.stderr)
}

// run runs the fleetpace binary with args (no DATABASE_URL in its environment).
func run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = envWithout("DATABASE_URL")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = strings.NewReader(stdin)
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), elapsed: time.Since(start)}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	return r
}

func envWithout(name string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			env = append(env, kv)
		}
	}
	return env
}

func count(t *testing.T, url, sql string) int {
	t.Helper()
	pool := testdb.PoolOf(t, url)
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// runConcurrently runs n processes of the command with args at once and
// returns what each did.
func runConcurrently(t *testing.T, n int, args ...string) []result {
	t.Helper()
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = run(t, "", args...)
		}()
	}
	wg.Wait()
	return results
}

func TestSchemaApplyConcurrentProcesses(t *testing.T) {
	t.Parallel()
	url := testdb.EmptyURL(t)
	results := runConcurrently(t, 4, "schema", "apply", "-q", "--database-url", url)
	for i, r := range results {
		if r.code != 0 {
			t.Fatalf("process %d: %s", i, r)
		}
	}
	// Every table of the schema file, once.
	want := strings.Count(fleetpace.Schema, "\nCREATE TABLE IF NOT EXISTS fleetpace_")
	if n := count(t, url, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'fleetpace_%'`); n != want || want < 9 {
		t.Fatalf("fleetpace tables = %d, want %d (the schema file's)", n, want)
	}
	migrations := count(t, url, `SELECT count(*) FROM river_migration`)
	distinct := count(t, url, `SELECT count(DISTINCT version) FROM river_migration`)
	if migrations == 0 || migrations != distinct {
		t.Fatalf("river_migration has %d rows, %d distinct versions; want each version once", migrations, distinct)
	}
}

// TestRiverMigratorAloneRaces shows why schema apply takes its own lock:
// River's migrator run concurrently on an empty database, without it, fails.
func TestRiverMigratorAloneRaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	failures := 0
	for attempt := 0; attempt < 5 && failures == 0; attempt++ {
		url := testdb.EmptyURL(t)
		var wg sync.WaitGroup
		var failed atomic.Int32
		start := make(chan struct{})
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pool, err := pgxpool.New(ctx, url)
				if err != nil {
					t.Error(err)
					return
				}
				defer pool.Close()
				m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
				if err != nil {
					t.Error(err)
					return
				}
				<-start
				if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
					failed.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		failures = int(failed.Load())
	}
	if failures == 0 {
		t.Fatal("4 concurrent River migrators never failed in 5 attempts; the advisory lock in schema apply would be untested")
	}
}

func TestImportBadLineWritesNothing(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	if r := run(t, "", "-q", "--database-url", url, "platforms", "set", "feeds", "--rate", "7"); r.code != 0 {
		t.Fatal(r)
	}
	var b strings.Builder
	b.WriteString("platform,url,interval\n")
	for i := 1; i <= 1000; i++ {
		if i == 700 {
			b.WriteString("feeds,https://x.example/700,-5m\n") // line 701: negative interval
			continue
		}
		fmt.Fprintf(&b, "feeds,https://x.example/%d,1h\n", i)
	}
	file := filepath.Join(t.TempDir(), "sources.csv")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r := run(t, "", "-q", "--database-url", url, "sources", "import", file)
	if r.code != 2 || !strings.Contains(r.stderr, "line 701") || !strings.Contains(r.stderr, "interval") {
		t.Fatalf("want exit 2 naming line 701 and the interval field: %s", r)
	}
	if n := count(t, url, `SELECT count(*) FROM fleetpace_source`); n != 0 {
		t.Fatalf("%d rows written by a rejected import", n)
	}
	// Fixed, it imports; again, it adds nothing.
	if err := os.WriteFile(file, []byte(strings.Replace(b.String(), ",-5m", ",5m", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := run(t, "", "-q", "--database-url", url, "sources", "import", file); r.code != 0 || !strings.Contains(r.stdout, "1000 added") {
		t.Fatal(r)
	}
	if r := run(t, "", "-q", "--database-url", url, "sources", "import", file); r.code != 0 || !strings.Contains(r.stdout, "0 added") {
		t.Fatal(r)
	}
}

func TestScanFailsFastAgainstSilentServer(t *testing.T) {
	t.Parallel()
	for _, sslmode := range []string{"disable", "prefer"} {
		addr, accepted := testdb.Silent(t)
		url := fmt.Sprintf("postgres://fleet:s3cretpw@%s/fleetpace?sslmode=%s", addr, sslmode)
		r := run(t, "", "--database-url", url, "--connect-timeout", "1s", "scan")
		if r.code != 1 {
			t.Fatalf("sslmode=%s: want exit 1: %s", sslmode, r)
		}
		if r.elapsed > 1500*time.Millisecond+processOverhead {
			t.Fatalf("sslmode=%s: took %s, want within connect timeout + 0.5 s", sslmode, r.elapsed)
		}
		if n := accepted.Load(); n != 1 {
			t.Fatalf("sslmode=%s: %d connections accepted, want exactly one attempt", sslmode, n)
		}
		if strings.Contains(r.stdout+r.stderr, "s3cretpw") {
			t.Fatalf("password printed: %s", r)
		}
		if !strings.Contains(r.stderr, "database unreachable") {
			t.Fatalf("unclear message: %s", r)
		}
	}
}

// processOverhead allows for starting the binary on a loaded machine.
const processOverhead = 300 * time.Millisecond

func TestExitCodesAndMessages(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	tests := []struct {
		args []string
		code int
		want string // in stderr
	}{
		{[]string{"platforms", "set", "p", "--rate", "-1"}, 2, "--rate must be in [0.0001, 1e+09]"},
		{[]string{"platforms", "set", "p", "--rate", "NaN"}, 2, "--rate must be in"},
		{[]string{"platforms", "set", "p", "--rate", "1", "--burst", "0"}, 2, "--burst must be"},
		{[]string{"platforms", "set", "p", "--rate", "1", "--cooldown", "0s"}, 2, "--cooldown must be"},
		{[]string{"platforms", "set", "p", "--rate", "1", "--max-multiplier", "0.5"}, 2, "--max-multiplier must be"},
		{[]string{"platforms", "set", "p", "--rate", "1", "--decay-after", "0"}, 2, "--decay-after must be"},
		{[]string{"platforms", "set", "Bad Name", "--rate", "1"}, 2, "NAME must be lower-case"},
		{[]string{"platforms", "set", "p"}, 2, "--rate"},
		{[]string{"platforms", "set", "ok", "--rate", "3"}, 0, ""},
		{[]string{"sources", "add", "--platform", "ok", "--url", "ftp://x"}, 2, "--url must be an absolute"},
		{[]string{"sources", "add", "--platform", "nope", "--url", "https://x.example/"}, 2, "--platform does not exist"},
		{[]string{"sources", "add", "--platform", "nope", "--url", "https://x.example/"}, 2, "hint: create the platform first: fleetpace platforms set"},
		{[]string{"sources", "add", "--platform", "ok", "--url", "https://x.example/", "--interval", "-1s"}, 2, "--interval must be in [1s, 8760h]"},
		{[]string{"sources", "import", "--interval", "0", "x.csv"}, 2, "--interval: must not be 0"},
		{[]string{"sources", "list", "--limit", "-5"}, 2, "--limit must be"},
		{[]string{"sources", "remove", "abc"}, 2, "abc"},
		{[]string{"sources", "remove", "424242"}, 2, "424242"},
		{[]string{"enqueue", "--platform", "nope"}, 2, "nope"},
		{[]string{"scan", "--limit", "0"}, 2, "--limit: must not be 0"},
		{[]string{"scan", "--look-ahead", "-1s"}, 2, "--look-ahead must be in"},
		{[]string{"worker", "--concurrency", "-1"}, 2, "--concurrency must be ≥ 1"},
		{[]string{"worker", "--job-timeout", "10m"}, 2, "--rescue-after (5m0s) must exceed --job-timeout (10m0s)"},
		{[]string{"worker", "--poll-jitter", "2"}, 2, "--poll-jitter must be in [0, 1]"},
		{[]string{"worker", "--max-body-bytes", "-1"}, 2, "--max-body-bytes must be in"},
		{[]string{"drain", "--max-duration", "-1s"}, 2, "--max-duration must be ≥ 0"},
		{[]string{"--connect-timeout", "-1s", "status"}, 2, "--connect-timeout must be in"},
		{[]string{"no-such-command"}, 2, "unknown command"},
		{[]string{"status", "--no-such-flag"}, 2, "unknown flag"},
	}
	for _, tt := range tests {
		args := append([]string{"-q", "--database-url", url}, tt.args...)
		r := run(t, "", args...)
		if r.code != tt.code || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: want exit %d mentioning %q; got %s", tt.args, tt.code, tt.want, r)
		}
	}
	// Only the valid platform was written.
	if n := count(t, url, `SELECT count(*) FROM fleetpace_platform`); n != 1 {
		t.Fatalf("%d platforms written, want only the valid one", n)
	}
	if n := count(t, url, `SELECT count(*) FROM fleetpace_source`); n != 0 {
		t.Fatalf("%d sources written by invalid commands", n)
	}
	// A bad URL is a usage error and its password is not printed.
	r := run(t, "", "--database-url", "postgres://u:hunter2@[::1:5432/db", "status")
	if r.code != 2 || strings.Contains(r.stderr, "hunter2") {
		t.Fatalf("bad URL: %s", r)
	}
}

func TestEndToEndCommands(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	steps := [][]string{
		{"platforms", "set", "feeds", "--rate", "7", "--burst", "2"},
		{"sources", "add", "--platform", "feeds", "--url", "https://feeds.example/a", "--interval", "30m"},
		{"sources", "add", "--platform", "feeds", "--url", "https://feeds.example/b"},
		{"scan"},
		{"enqueue", "1", "2"},
		{"sources", "list", "--due"},
		{"status", "--json"},
		{"sources", "remove", "2"},
	}
	var outs []string
	for _, s := range steps {
		r := run(t, "", append([]string{"-q", "--database-url", url}, s...)...)
		if r.code != 0 {
			t.Fatalf("%v: %s", s, r)
		}
		outs = append(outs, r.stdout)
	}
	if !strings.Contains(outs[3], "enqueued 2") {
		t.Fatalf("scan: %q", outs[3])
	}
	if !strings.Contains(outs[4], "enqueued 0") {
		t.Fatalf("enqueue of queued sources must queue nothing: %q", outs[4])
	}
	if strings.Contains(outs[5], "feeds.example") {
		t.Fatalf("queued sources listed as due: %q", outs[5])
	}
	var rep status.Report
	if err := json.Unmarshal([]byte(outs[6]), &rep); err != nil {
		t.Fatalf("status --json is not a status report: %v\n%s", err, outs[6])
	}
	if len(rep.Platforms) != 1 || rep.Platforms[0].Name != "feeds" || rep.Platforms[0].RatePerSec != 7 ||
		rep.Platforms[0].Counts.Sources != 2 || rep.Platforms[0].Counts.Queued != 2 || rep.Platforms[0].Counts.Due != 0 {
		t.Fatalf("status --json: platforms %+v, want feeds at 7/s with its 2 sources queued", rep.Platforms)
	}
	if n := count(t, url, `SELECT count(*) FROM river_job`); n != 2 {
		t.Fatalf("river jobs = %d, want 2", n)
	}
}

func TestSchemaPrintNeedsNoDatabase(t *testing.T) {
	t.Parallel()
	r := run(t, "", "--database-url", "postgres://nobody@127.0.0.1:1/none", "schema", "print")
	if r.code != 0 || !strings.Contains(r.stdout, "CREATE TABLE IF NOT EXISTS fleetpace_source") {
		t.Fatal(r)
	}
}

// embeddedDataDir is a data directory, not yet created, for an embedded
// cluster of the test's own. As root the server runs as the postgres user,
// which must be able to enter every parent of the data directory.
func embeddedDataDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(testdb.SearchableDir(t, "fleetpace-embedded-"), "data")
}

func TestEmbeddedDefaultSharedByConcurrentProcesses(t *testing.T) {
	t.Parallel()
	dir := embeddedDataDir(t)
	results := runConcurrently(t, 2, "--data-dir", dir, "platforms", "list")
	t.Cleanup(func() { run(t, "", "--data-dir", dir, "embedded", "stop") })
	for i, r := range results {
		if r.code != 0 || !strings.Contains(r.stderr, "using embedded PostgreSQL in "+dir) {
			t.Fatalf("process %d: %s", i, r)
		}
	}
	port := func(s string) string {
		i := strings.Index(s, "127.0.0.1:")
		if i < 0 {
			return ""
		}
		return strings.Fields(s[i:])[0]
	}
	if p0, p1 := port(results[0].stderr), port(results[1].stderr); p0 == "" || p0 != p1 {
		t.Fatalf("two clusters? %q vs %q", p0, p1)
	}
	if r := run(t, "", "--data-dir", dir, "platforms", "set", "x", "--rate", "1"); r.code != 0 {
		t.Fatal(r)
	}
	if r := run(t, "", "--data-dir", dir, "platforms", "list"); r.code != 0 || !strings.Contains(r.stdout, "x ") {
		t.Fatalf("data not kept across commands: %s", r)
	}
	if r := run(t, "", "--data-dir", dir, "embedded", "status"); !strings.Contains(r.stdout, "running") {
		t.Fatal(r)
	}
	if r := run(t, "", "--data-dir", dir, "embedded", "stop"); r.code != 0 || !strings.Contains(r.stdout, "stopped") {
		t.Fatal(r)
	}
	if r := run(t, "", "--data-dir", dir, "embedded", "status"); !strings.Contains(r.stdout, "not running") {
		t.Fatal(r)
	}
}

// bench … --cpu-profile writes a Go CPU profile (gzip-compressed protobuf,
// as go tool pprof reads it) of the benchmark's process.
func TestBenchCPUProfile(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	file := filepath.Join(t.TempDir(), "cpu.prof")
	r := run(t, "", "-q", "--database-url", url, "bench", "worker", "--jobs", "50", "--runs", "1", "--workers", "2", "--cpu-profile", file)
	if r.code != 0 {
		t.Fatalf("bench worker --cpu-profile: %s", r)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("--cpu-profile wrote %d bytes, not a gzip-compressed profile", len(b))
	}
}
