package dbconn_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/redact"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// silentServer is testdb.Silent's port: a server that accepts connections
// and never answers, the worst case of a saturated pooler.
func silentServer(t *testing.T) (port int, accepted *atomic.Int32) {
	t.Helper()
	addr, accepted := testdb.Silent(t)
	_, p, _ := net.SplitHostPort(addr)
	port, _ = strconv.Atoi(p)
	return port, accepted
}

func TestOneAttemptWithinConnectTimeout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		url  string
	}{
		{"sslmode=disable", "postgres://u:pw@127.0.0.1:%d/db?sslmode=disable"},
		{"sslmode=prefer (TLS then plain in libpq and pgx)", "postgres://u:pw@127.0.0.1:%d/db?sslmode=prefer"},
		{"no sslmode (prefer)", "postgres://u:pw@127.0.0.1:%d/db"},
		{"sslmode=allow (plain then TLS)", "postgres://u:pw@127.0.0.1:%d/db?sslmode=allow"},
		{"localhost (may resolve to several addresses)", "postgres://u:pw@localhost:%d/db?sslmode=disable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			port, accepted := silentServer(t)
			var attempts atomic.Int64
			pool, err := dbconn.NewPool(context.Background(), dbconn.Config{
				URL: fmt.Sprintf(tt.url, port), ConnectTimeout: 500 * time.Millisecond, Attempts: &attempts,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			start := time.Now()
			_, err = pool.Acquire(context.Background())
			elapsed := time.Since(start)
			if err == nil {
				t.Fatal("acquired a connection from a server that never answers")
			}
			if !dbconn.IsUnavailable(err) {
				t.Errorf("IsUnavailable(%v) = false", err)
			}
			if elapsed > time.Second {
				t.Errorf("failed after %s, want within connect timeout (500ms) + 0.5 s", elapsed)
			}
			// Dials are counted as they are made; the listener may see the
			// connection a moment after the dial.
			for deadline := time.Now().Add(5 * time.Second); accepted.Load() == 0 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			if n := accepted.Load(); n != 1 || attempts.Load() != 1 {
				t.Errorf("%d connections accepted, %d dials; want exactly one attempt", n, attempts.Load())
			}
		})
	}
}

func TestNoBackgroundRedial(t *testing.T) {
	t.Parallel()
	port, accepted := silentServer(t)
	pool, err := dbconn.NewPool(context.Background(), dbconn.Config{
		URL: fmt.Sprintf("postgres://u@127.0.0.1:%d/db?sslmode=disable", port), ConnectTimeout: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// MinConns 0: an idle pool does not dial in the background.
	time.Sleep(500 * time.Millisecond)
	if n := accepted.Load(); n != 0 {
		t.Fatalf("idle pool dialed %d times", n)
	}
}

// PoolConfig's errors hold no password (redact.CheckDatabaseURL and the
// redact package's tests say what is refused and what is printed), and
// keep their chain.
func TestPoolConfigErrors(t *testing.T) {
	t.Parallel()
	for url, secret := range map[string]string{
		"postgres://postgres:Wr@ngPwXYZ@127.0.0.1:55433/fp": "ngPwXYZ",
		"postgres://u:12/XYZ@127.0.0.1/fp":                  "XYZ",
		"host=127.0.0.1 user=u PASSWORD=XYZ":                "XYZ",
		"host=db password='unterminated secret":             "secret",
		"postgres://u:hunter2":                              "hunter2",
	} {
		_, err := dbconn.PoolConfig(dbconn.Config{URL: url})
		if !errors.Is(err, redact.ErrInvalidDatabaseURL) || strings.Contains(err.Error(), secret) {
			t.Errorf("PoolConfig(%q) = %v; want ErrInvalidDatabaseURL without the password", url, err)
		}
	}
	_, err := dbconn.NewPool(context.Background(), dbconn.Config{URL: "postgres://u:hunter2@[::1:5432/db"})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("invalid URL error = %v", err)
	}
	// The message is redacted, the chain is kept.
	var parseErr *pgconn.ParseConfigError
	if !errors.Is(err, redact.ErrInvalidDatabaseURL) || !errors.As(err, &parseErr) {
		t.Fatalf("invalid URL error %v lost its chain (ErrInvalidDatabaseURL %v, ParseConfigError %v)",
			err, errors.Is(err, redact.ErrInvalidDatabaseURL), errors.As(err, &parseErr))
	}
	for _, url := range []string{
		"postgres://alice:p%40ss@db1.example:6432,db2.example/fp?sslmode=disable",
		"host=/run/postgresql port=5433 user=bob dbname=x password=pw",
		"postgres://alice:pw@[::1]:5433/fp",
	} {
		if _, err := dbconn.PoolConfig(dbconn.Config{URL: url}); err != nil {
			t.Errorf("PoolConfig(%q): %v", url, err)
		}
	}
}

// The classifier decides by types and SQLSTATEs: a message that merely reads
// like an outage is not one, and a statement's own error is not one either.
func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("tick: %w", err) }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connect error", wrap(&pgconn.ConnectError{}), true},
		{"admin shutdown", wrap(&pgconn.PgError{Code: "57P01"}), true},
		{"cannot connect now", &pgconn.PgError{Code: "57P03"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"connection failure (class 08)", &pgconn.PgError{Code: "08006"}, true},
		{"unique violation", wrap(&pgconn.PgError{Code: "23505"}), false},
		{"undefined table", &pgconn.PgError{Code: "42P01"}, false},
		{"query canceled", &pgconn.PgError{Code: "57014"}, false},
		{"network error", wrap(&net.OpError{Op: "read", Err: syscall.ECONNRESET}), true},
		{"unexpected EOF", wrap(io.ErrUnexpectedEOF), true},
		{"conn closed", wrap(pgconn.ErrConnClosed), true},
		{"deadline", wrap(context.DeadlineExceeded), true},
		{"a message only", errors.New("failed to connect: conn closed: connection reset by peer"), false},
		{"no rows", wrap(pgx.ErrNoRows), false},
	}
	for _, tt := range tests {
		if got := dbconn.IsUnavailable(tt.err); got != tt.want {
			t.Errorf("%s: IsUnavailable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// A multi-host URL (a primary and its standby) whose first host hangs:
// that host costs one connect timeout, and the second is still tried, with
// a timeout of its own (pgx's rule), so the connection is made.
func TestEachHostHasItsOwnConnectTimeout(t *testing.T) {
	t.Parallel()
	hung, accepted := silentServer(t)
	u, err := url.Parse(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d,%s", hung, u.Host)
	q := u.Query()
	q.Set("target_session_attrs", "read-write")
	u.RawQuery = q.Encode()
	const timeout = 700 * time.Millisecond
	pool, err := dbconn.NewPool(context.Background(), dbconn.Config{URL: u.String(), ConnectTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	start := time.Now()
	var one int
	if err := pool.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("the second host was not reached after the first hung: %v", err)
	}
	if elapsed := time.Since(start); elapsed < timeout || accepted.Load() != 1 {
		t.Fatalf("connected after %s with %d connection(s) to the hung host; want the hung host tried once, for its whole timeout (%s)",
			elapsed, accepted.Load(), timeout)
	}
}
