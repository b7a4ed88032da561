// Package testdb gives each test its own PostgreSQL database with the
// fleetpace schema applied, on one embedded cluster per test binary.
//
// Set TEST_DATABASE_URL to use an existing server instead (the role needs
// CREATEDB). A package using testdb calls Main from its TestMain so the
// cluster is stopped when the tests end:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
//
// or, to check for leaked goroutines after the cluster has stopped:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }
package testdb

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace"
	"github.com/fleetpace/fleetpace/internal/pgembed"
)

const templateName = "fleetpace_test_template"

var (
	once      sync.Once
	onceErr   error
	cluster   *pgembed.Cluster
	serverURL string // URL of the maintenance database on the server
	counter   atomic.Int64
)

// Main runs the tests, stops the embedded cluster, if one was started, and
// exits with the tests' code.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main for a TestMain with more to clean up: it runs the tests, stops
// the embedded cluster and returns the exit code.
func Run(m *testing.M) int {
	code := m.Run()
	if cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = cluster.Close(ctx)
		cancel()
	}
	return code
}

// ParallelByDefault makes a TestMain run n parallel tests at once unless
// -test.parallel is given: for a package whose tests mostly wait on real
// time, where the default (GOMAXPROCS: 2 on CI) leaves the CPUs idle.
func ParallelByDefault(n int) {
	flag.Parse()
	if !parallelSet() {
		_ = flag.Set("test.parallel", strconv.Itoa(n))
	}
}

// parallelSet reports whether -test.parallel was given on the command line.
func parallelSet() bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	return set
}

// M is m for goleak.VerifyTestMain (or anything taking a Run() int): its
// Run runs the tests and stops the embedded cluster, as Run does.
func M(m *testing.M) interface{ Run() int } { return runner{m} }

type runner struct{ m *testing.M }

func (r runner) Run() int { return Run(r.m) }

func setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		serverURL = u
	} else {
		// 300 connections: a package's parallel tests (the pacer's
		// simulations: three processes, each with a pool and a listener)
		// filled the default 100 on CI ("too many clients already").
		c, err := pgembed.Start(ctx, pgembed.Config{Settings: map[string]string{"max_connections": "300"}, InitCache: InitCache()})
		if err != nil {
			return err
		}
		cluster = c
		serverURL = c.URL("postgres")
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("testdb: connect: %w", err)
	}
	defer conn.Close(ctx)

	// A template with the schema applied makes each test database a cheap copy.
	// The name is unique per process so parallel test binaries sharing a
	// TEST_DATABASE_URL server do not collide.
	tmpl := fmt.Sprintf("%s_%d", templateName, os.Getpid())
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{tmpl}.Sanitize()); err != nil {
		return fmt.Errorf("testdb: drop template: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{tmpl}.Sanitize()); err != nil {
		return fmt.Errorf("testdb: create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, withDB(serverURL, tmpl))
	if err != nil {
		return fmt.Errorf("testdb: %w", err)
	}
	_, err = fleetpace.Apply(ctx, pool, nil)
	pool.Close()
	if err != nil {
		return err
	}
	return nil
}

// ensure starts the shared cluster once.
func ensure(t testing.TB) {
	t.Helper()
	once.Do(func() { onceErr = setup() })
	if onceErr != nil {
		t.Fatalf("testdb: %v", onceErr)
	}
}

// URL creates a fresh database with the fleetpace schema for this test and
// returns its connection URL (for pools and for subprocesses). The database is
// dropped when the test ends.
func URL(t testing.TB) string {
	t.Helper()
	return create(t, true)
}

// EmptyURL creates a fresh database without any schema (for tests of schema
// apply itself) and returns its URL.
func EmptyURL(t testing.TB) string {
	t.Helper()
	return create(t, false)
}

func create(t testing.TB, withSchema bool) string {
	t.Helper()
	ensure(t)
	ctx := context.Background()
	name := fmt.Sprintf("fleetpace_test_%d_%d", os.Getpid(), counter.Add(1))
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		t.Fatalf("testdb: connect: %v", err)
	}
	defer conn.Close(ctx)
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	if withSchema {
		sql += " TEMPLATE " + pgx.Identifier{fmt.Sprintf("%s_%d", templateName, os.Getpid())}.Sanitize()
	}
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("testdb: create database: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, serverURL)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return withDB(serverURL, name)
}

// Pool returns a pool on a fresh database with the fleetpace schema, closed
// when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return PoolOf(t, URL(t))
}

// PoolOf returns a pool on url, closed when the test ends: for a test that
// needs the database's URL too (for a process, a second pool).
func PoolOf(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("testdb: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Private starts a PostgreSQL cluster of the test's own (cfg: its
// settings), with the fleetpace schema applied to its postgres database,
// for a test that stops, restarts or exhausts its server; it is removed
// when the test ends.
func Private(t testing.TB, cfg pgembed.Config) *pgembed.Cluster {
	t.Helper()
	ctx := context.Background()
	if cfg.InitCache == "" {
		cfg.InitCache = InitCache()
	}
	c, err := pgembed.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("testdb: private cluster: %v", err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	pool, err := pgxpool.New(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("testdb: private cluster: %v", err)
	}
	defer pool.Close()
	if _, err := fleetpace.Apply(ctx, pool, nil); err != nil {
		t.Fatalf("testdb: private cluster: schema: %v", err)
	}
	return c
}

// Cluster returns the package's embedded cluster, or nil when
// TEST_DATABASE_URL points at an external server. Tests that stop the server
// start a cluster of their own (Private).
func Cluster(t testing.TB) *pgembed.Cluster {
	t.Helper()
	ensure(t)
	return cluster
}

func withDB(rawURL, db string) string {
	u, err := url.Parse(rawURL)
	if err != nil || !strings.HasPrefix(u.Scheme, "postgres") {
		// keyword/value form
		return rawURL + " dbname=" + db
	}
	u.Path = "/" + db
	return u.String()
}

// SearchableDir creates a temporary directory every user may enter (mode
// 0755, directly under the system's temporary directory, unlike
// t.TempDir's, whose parent is private to this user) and removes it when
// the test ends: for the data of an embedded cluster, whose server runs as
// the postgres user when the tests run as root, or of a pgbouncer that may
// run as another user. pattern is os.MkdirTemp's.
func SearchableDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return dir
}

// FreePort returns a TCP port that was free on 127.0.0.1 a moment ago: for
// a server the test starts (a pgbouncer, a worker's HTTP address).
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Silent starts a TCP server on loopback that accepts connections and never
// answers — the worst case of a saturated database or pooler — and returns
// its address and the number of connections it accepted so far. It stops
// when the test ends.
func Silent(t testing.TB) (addr string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = &atomic.Int32{}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String(), accepted
}

// InitCache is the directory (pgembed.Config.InitCache) where the test
// binaries of one machine keep an initialized data directory, so each
// cluster a test starts is a copy instead of an initdb.
func InitCache() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("fleetpace-initdb-%d", os.Getuid()))
}
