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

func TestRedact(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, secret string }{
		{"postgres://user:hunter2@db.example:5432/x", "hunter2"},
		{"postgresql://user:p%40ss@db/x?sslmode=require", "p%40ss"},
		{"host=db user=u password=hunter2 dbname=x", "hunter2"},
		{"host=db password='hun ter2' dbname=x", "hun ter2"},
		{`failed to connect to "postgres://a:b3cret@h/db"`, "b3cret"},
		{"host=db PASSWORD=hunter2", "hunter2"},
		{"host=db Password = 'hun\\' ter2'", "ter2"},
		{"host=db password=hun\\ ter2 user=u", "ter2"},
		{"host=db password='unterminated secret", "secret"},
		{"postgres://u@h/db?pass%77ord=hunter2&x=1", "hunter2"},
		{"POSTGRES://u:hunter2@h/db", "hunter2"},
		{"mysql://u:hunter2@h/db", "hunter2"},
		{"postgres://postgres:Wr@ngPwXYZ@127.0.0.1:55433/fp", "ngPwXYZ"},
		{"error: postgres://u:pa ssXYZ@h/db refused", "ssXYZ"},
		{"postgres://u:hunter2", "hunter2"},
	}
	for _, tt := range tests {
		for name, got := range map[string]string{"Redact": dbconn.Redact(tt.in), "RedactURL": dbconn.RedactURL(tt.in), "Describe": dbconn.Describe(tt.in)} {
			if strings.Contains(got, tt.secret) {
				t.Errorf("%s(%q) = %q still holds the password", name, tt.in, got)
			}
		}
		if _, err := dbconn.PoolConfig(dbconn.Config{URL: tt.in}); err != nil && strings.Contains(err.Error(), tt.secret) {
			t.Errorf("PoolConfig(%q) = %v holds the password", tt.in, err)
		}
	}
	if got := dbconn.Describe("postgres://user:hunter2@db.example:5432/x"); got != "user@db.example:5432/x" {
		t.Errorf("Describe = %q", got)
	}
	if got := dbconn.RedactURL("postgres://u@h/db?sslmode=disable&password=hunter2&x=1"); got != "postgres://u@h/db?sslmode=disable&password=xxxxx" {
		t.Errorf("RedactURL = %q", got)
	}
	_, err := dbconn.NewPool(context.Background(), dbconn.Config{URL: "postgres://u:hunter2@[::1:5432/db"})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("invalid URL error = %v", err)
	}
	// The message is redacted, the chain is kept.
	var parseErr *pgconn.ParseConfigError
	if !errors.Is(err, dbconn.ErrInvalidURL) || !errors.As(err, &parseErr) {
		t.Fatalf("invalid URL error %v lost its chain (ErrInvalidURL %v, ParseConfigError %v)",
			err, errors.Is(err, dbconn.ErrInvalidURL), errors.As(err, &parseErr))
	}
}

// A URL whose '@' or '/' could put a part of the password into the host
// name, the port or the database name — which messages print — is refused
// before pgx reads it; so is a key that would send a password to the server
// as a run-time parameter. Describe names what is dialled.
func TestAmbiguousURLs(t *testing.T) {
	t.Parallel()
	tests := []struct{ url, reason string }{
		{"postgres://postgres:Wr@ngPwXYZ@127.0.0.1:55433/fp", "'@' appears 2 times"},
		{"postgres://u:12/XYZ@127.0.0.1/fp", "after a '/'"},
		{"POSTGRES://u:XYZ@127.0.0.1/fp", "scheme"},
		{"postgresql+psycopg://u:XYZ@127.0.0.1/fp", "scheme"},
		{"host=127.0.0.1 user=u PASSWORD=XYZ", `"PASSWORD" is not a connection setting`},
		{"postgres://u@127.0.0.1/fp?Password=XYZ", `"Password" is not a connection setting`},
		{"postgres://u:XYZ@127.0.0.1:port/fp", "invalid port"},
		{"host=127.0.0.1 password='XYZ", "unterminated quoted string"},
		{"host=127.0.0.1 user= password=XYZ", "empty value"},
		{"host= password=XYZ", "empty value"},
	}
	for _, tt := range tests {
		_, err := dbconn.PoolConfig(dbconn.Config{URL: tt.url})
		if !errors.Is(err, dbconn.ErrInvalidURL) || !strings.Contains(err.Error(), tt.reason) || strings.Contains(err.Error(), "XYZ") {
			t.Errorf("PoolConfig(%q) = %v; want ErrInvalidURL saying %q without the password", tt.url, err, tt.reason)
		}
	}
	for url, want := range map[string]string{
		"postgres://alice:p%40ss@db1.example:6432,db2.example/fp?sslmode=disable": "alice@db1.example:6432,db2.example:5432/fp",
		"host=/run/postgresql port=5433 user=bob dbname=x password=pw":            "bob@/run/postgresql:5433/x",
		"postgres://alice:pw@[::1]:5433/fp":                                       "alice@[::1]:5433/fp",
	} {
		if got := dbconn.Describe(url); got != want {
			t.Errorf("Describe(%q) = %q, want %q", url, got, want)
		}
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
