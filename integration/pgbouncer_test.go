package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

// pooledURLParams are what a database URL needs behind PgBouncer in
// transaction mode: pgx's unnamed statements (described once, cached by
// pgx) instead of named prepared statements, which a transaction pooler
// before PgBouncer 1.21 cannot carry from one server connection to the
// next.
const pooledURLParams = "default_query_exec_mode=cache_describe"

// pgBouncer runs Debian's pgbouncer in transaction mode, with a server pool
// of poolSize connections, in front of the server that upstream (a database
// URL) names; it returns the URL of upstream's database through it (with
// extra appended to its query). As root, pgbouncer runs as the postgres
// user (it refuses to run as root). It stops when the test ends; its log
// is returned by the second value.
func pgBouncer(t *testing.T, upstream string, poolSize int, extra string) (string, func() string) {
	t.Helper()
	return pgBouncerAt(t, upstream, poolSize, extra, testdb.FreePort(t))
}

// pgBouncerAt is pgBouncer listening on port.
func pgBouncerAt(t *testing.T, upstream string, poolSize int, extra string, port int) (string, func() string) {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			t.Skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")
		}
		bin = "/usr/sbin/pgbouncer"
	}
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	// Not t.TempDir: its parent is private to this user, and pgbouncer may
	// run as another.
	dir := testdb.SearchableDir(t, "fleetpace-pgbouncer-")
	logFile := filepath.Join(dir, "pgbouncer.log")
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
ignore_startup_parameters = plan_cache_mode, synchronous_commit, extra_float_digits
logfile = %s
pidfile = %s
log_connections = 0
log_disconnections = 0
`, u.Hostname(), u.Port(), port, filepath.Join(dir, "users.txt"), poolSize, logFile, filepath.Join(dir, "pgbouncer.pid"))
	files := map[string]string{"pgbouncer.ini": ini, "users.txt": `"postgres" ""` + "\n", "pgbouncer.log": ""}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		pu, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("pgbouncer runs as the postgres user when the tests run as root: %v", err)
		}
		uid, _ := strconv.Atoi(pu.Uid)
		gid, _ := strconv.Atoi(pu.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if cred != nil {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out := &syncBuffer{onAddr: func(string) {}}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	readLog := func() string {
		b, _ := os.ReadFile(logFile)
		return out.String() + string(b)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("--- pgbouncer log (last 4 KiB) ---\n%s", tail(readLog(), 4096))
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-done:
			t.Fatalf("pgbouncer exited at start:\n%s", readLog())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer does not accept connections on %s: %v\n%s", addr, err, readLog())
		}
		time.Sleep(50 * time.Millisecond)
	}
	q := "sslmode=disable"
	if extra != "" {
		q += "&" + extra
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?%s", addr, db, q), readLog
}

// pooledErrors matches what goes wrong when a client relies on session
// state behind a transaction pooler: a named prepared statement missing
// on the server connection its next execution lands on (SQLSTATE 26000),
// or one already there (42P05), a startup parameter PgBouncer refuses,
// LISTEN, session advisory locks.
var pooledErrors = regexp.MustCompile(`(?i)prepared statement \S+ (does not exist|already exists)|SQLSTATE (26000|42P05|08P01)|unsupported startup parameter|bind message supplies|cached plan must not change|level=ERROR`)

// Three workers and a cron-style scan work through PgBouncer in transaction
// mode with a server pool of 5: every source is fetched once, the ceiling
// holds in every 1-s window, and no log (workers, scans, PgBouncer) shows
// an error of session state behind a pooler. The same worker without the
// pooler-safe execution mode fails at once (the negative control).
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	direct := newURL(t)
	bouncer, bouncerLog := pgBouncer(t, direct, 5, pooledURLParams)
	d := newDest(t, nil)
	const n, rate, burst = 300, 20.0, 2
	// The CLI through PgBouncer too.
	platformWithSources(t, bouncer, "pb", d.URL(), n, "--rate", fmt.Sprint(rate), "--burst", fmt.Sprint(burst))
	ws := startWorkers(t, bouncer, "pb", 3, "--no-scan", "--poll-only", "--concurrency", "10")
	scans := scanUntilChecked(t, bouncer, pool(t, direct), 3*time.Minute)
	overruns := workerCounter(t, ws, "fleetpace_pacer_overruns_total")
	stopAll(ws)
	arrivals := d.Arrivals("/pb/")
	distinct := map[string]bool{}
	for _, r := range d.Requests() {
		distinct[r.Path] = true
	}
	maxWin := maxInWindow(arrivals, time.Second)
	t.Logf("through PgBouncer (transaction mode, pool 5): %d sources, %d requests (%d distinct), %d scans, largest 1-s window %d (bound %d)",
		n, len(arrivals), len(distinct), len(scans), maxWin, int(rate)+burst)
	if len(distinct) != n {
		t.Errorf("%d distinct sources fetched, want %d", len(distinct), n)
	}
	t.Logf("overruns the workers counted (written past their guarantee): %d", overruns)
	if maxWin > int(rate)+burst {
		logWorstWindow(t, d.Requests(), time.Second)
		t.Errorf("a 1-s window held %d requests; the ceiling is %.0f/s + burst %d", maxWin, rate, burst)
	}
	checkPooledLogs(t, bouncerLog(), scans, ws)

	// The negative control: the same worker with pgx's default execution
	// mode (named prepared statements) through the same PgBouncer.
	// It gets work, so that its connections overlap at once (an idle
	// worker's first clash could wait for River's 30-s periodic queries).
	naive := strings.Replace(bouncer, pooledURLParams, "default_query_exec_mode=cache_statement", 1)
	importSources(t, bouncer, "pb", d.URL(), pathsN("/pb-naive/", 100))
	w := startWorker(t, naive, "pb-naive", "--poll-only", "--concurrency", "10")
	if out, errOut, code := cliCode(t, direct, "scan", "--look-ahead", "5s"); code != 0 {
		t.Fatalf("scan: exit %d\n%s%s", code, out, errOut)
	}
	// Either error shows it: a statement prepared on one server connection
	// is missing on the next ("does not exist"), or one prepared by another
	// client is in the way ("already exists").
	missing := regexp.MustCompile(`prepared statement \S+ (does not exist|already exists)`)
	stop := time.Now().Add(60 * time.Second)
	for !missing.MatchString(w.log.String()) && w.alive() && time.Now().Before(stop) {
		time.Sleep(100 * time.Millisecond)
	}
	if m := missing.FindString(w.log.String()); m == "" {
		t.Errorf("a worker with named prepared statements behind PgBouncer showed no error in 60 s: the check above would not catch one")
	} else {
		t.Logf("negative control: with named prepared statements the worker logs %q", m)
	}
}

// A worker, a cron-style scan and the CLI behind PgBouncer in transaction
// mode with a plain URL (no default_query_exec_mode, no --poll-only, no
// --pooler): one connection at start-up tells them they are behind a
// pooler, they run pooler-safe, every source is fetched and no log shows
// an error of session state behind a pooler. A pool that could not tell at
// start-up refuses its first connection through the pooler with an error
// naming --pooler transaction (a worker stops on it) instead of sending a
// stream of failing statements.
func TestPgBouncerPlainURL(t *testing.T) {
	t.Parallel()
	direct := newURL(t)
	bouncer, bouncerLog := pgBouncer(t, direct, 5, "")
	d := newDest(t, nil)
	const n, rate, burst = 100, 20.0, 2
	platformWithSources(t, bouncer, "plain", d.URL(), n, "--rate", fmt.Sprint(rate), "--burst", fmt.Sprint(burst))
	ws := startWorkers(t, bouncer, "plain", 2, "--no-scan", "--concurrency", "10")
	scans := scanUntilChecked(t, bouncer, pool(t, direct), 2*time.Minute)
	for _, w := range ws {
		w.stop()
		if !strings.Contains(w.log.String(), "pooler-safe mode") {
			t.Errorf("%s did not say it runs pooler-safe:\n%s", w.name, tail(w.log.String(), 2048))
		}
	}
	checkPooledLogs(t, bouncerLog(), scans, ws)
	if maxWin := maxInWindow(d.Arrivals("/plain/"), time.Second); maxWin > int(rate)+burst {
		t.Errorf("a 1-s window held %d requests; the ceiling is %.0f/s + burst %d", maxWin, rate, burst)
	}

	// A pool that could not tell at start-up (the database was unreachable
	// then) checks each new connection: through the pooler it refuses the
	// connection, naming the fix, and says so once to whoever must stop;
	// to PostgreSQL itself it connects.
	var told atomic.Int32
	for _, tc := range []struct {
		url    string
		pooled bool
	}{{bouncer, true}, {direct, false}} {
		p, err := dbconn.NewPool(context.Background(), dbconn.Config{URL: tc.url, Pooler: dbconn.PoolerAuto,
			OnPooler: func(error) { told.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		var one int
		err = p.QueryRow(context.Background(), "SELECT 1").Scan(&one)
		p.Close()
		switch {
		case tc.pooled && (!errors.Is(err, dbconn.ErrPooler) || !strings.Contains(err.Error(), "--pooler transaction") || told.Load() != 1):
			t.Errorf("an undecided pool through PgBouncer: %v (told %d times), want ErrPooler naming --pooler transaction, told once", err, told.Load())
		case !tc.pooled && (err != nil || told.Load() != 1):
			t.Errorf("an undecided pool to PostgreSQL: %v (told %d times), want it to connect", err, told.Load())
		}
		resolved, err := dbconn.ResolvePooler(context.Background(), dbconn.Config{URL: tc.url, Pooler: dbconn.PoolerAuto})
		if want := map[bool]dbconn.Pooler{true: dbconn.PoolerTransaction, false: dbconn.PoolerNone}[tc.pooled]; err != nil || resolved.Pooler != want {
			t.Errorf("ResolvePooler(pooled %v): %q %v, want %q", tc.pooled, resolved.Pooler, err, want)
		}
	}
}

// scanUntilChecked runs cron's `fleetpace scan` through url every second
// until every source has a check (read on db), and returns the scans'
// output; a scan that fails, or sources left after timeout, fail the test.
func scanUntilChecked(t *testing.T, url string, db *pgxpool.Pool, timeout time.Duration) []string {
	t.Helper()
	var scans []string
	deadline := time.Now().Add(timeout)
	for {
		out, errOut, code := cliCode(t, url, "scan", "--look-ahead", "5s")
		scans = append(scans, out+errOut)
		if code != 0 {
			t.Fatalf("scan through PgBouncer: exit %d\n%s%s", code, out, errOut)
		}
		var left int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM fleetpace_source WHERE last_checked_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return scans
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d source(s) still unchecked after %s through PgBouncer", left, timeout)
		}
		time.Sleep(time.Second)
	}
}

// checkPooledLogs fails the test if PgBouncer's log, a scan's output or a
// worker's log shows an error of session state behind a pooler.
func checkPooledLogs(t *testing.T, bouncerLog string, scans []string, ws []*proc) {
	t.Helper()
	logs := map[string]string{"pgbouncer": bouncerLog}
	for i, s := range scans {
		logs[fmt.Sprintf("scan %d", i+1)] = s
	}
	for _, w := range ws {
		logs[w.name] = w.log.String()
	}
	for name, l := range logs {
		if m := pooledErrors.FindString(l); m != "" {
			t.Errorf("%s's log shows %q:\n%s", name, m, tail(l, 2048))
		}
	}
}
