package pgembed_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/testdb"
)

func TestMissingBinariesGiveAnInstallHint(t *testing.T) {
	t.Parallel()
	_, err := pgembed.Start(context.Background(), pgembed.Config{BinDir: t.TempDir()})
	if !errors.Is(err, pgembed.ErrBinariesNotFound) || !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Fatalf("err = %v, want ErrBinariesNotFound with an install hint", err)
	}
}

func TestStartStopRestartClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, err := pgembed.Start(ctx, pgembed.Config{})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(c.DataDir())
	ping := func() error {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}
	if err := ping(); err != nil {
		t.Fatal(err)
	}
	port := c.Port()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if ping() == nil {
		t.Fatal("server still answers after Stop")
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Port() != port || ping() != nil {
		t.Fatalf("restart: port %d (was %d), ping %v", c.Port(), port, ping())
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("temporary cluster directory %s left behind (%v)", root, err)
	}
}

// A shared cluster keeps its port across restarts (processes still running
// against it find it again), says so when another process has taken the
// port instead of moving, and refuses a data directory that is a file.
func TestSharedClusterKeepsItsPort(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// As root the server runs as the postgres user, which must be able to
	// enter every parent of the data directory.
	tmp := testdb.SearchableDir(t, "fleetpace-pgembed-")
	dir := filepath.Join(tmp, "data")
	c, err := pgembed.EnsureShared(ctx, dir, pgembed.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pgembed.StopShared(context.Background(), dir, pgembed.Config{}) })
	port := c.Port()
	if b, err := os.ReadFile(filepath.Join(dir, pgembed.PortFile)); err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(port) {
		t.Fatalf("port file: %q %v, want %d", b, err, port)
	}
	for range 2 {
		if was, err := pgembed.StopShared(ctx, dir, pgembed.Config{}); !was || err != nil {
			t.Fatalf("StopShared: %v %v", was, err)
		}
		c, err := pgembed.EnsureShared(ctx, dir, pgembed.Config{})
		if err != nil || c.Port() != port {
			t.Fatalf("restart: port %d %v, want %d", c.Port(), err, port)
		}
	}

	// The port taken while the cluster is down: a clear error, no move.
	if _, err := pgembed.StopShared(ctx, dir, pgembed.Config{}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	_, err = pgembed.EnsureShared(ctx, dir, pgembed.Config{})
	l.Close()
	if !errors.Is(err, pgembed.ErrPortInUse) || !strings.Contains(err.Error(), fmt.Sprint(port)) || !strings.Contains(err.Error(), pgembed.PortFile) {
		t.Fatalf("EnsureShared with its port taken: %v, want ErrPortInUse naming the port and the port file", err)
	}
	if c, err := pgembed.EnsureShared(ctx, dir, pgembed.Config{}); err != nil || c.Port() != port {
		t.Fatalf("after the port was freed: %v %v", c, err)
	}

	file := filepath.Join(tmp, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pgembed.EnsureShared(ctx, file, pgembed.Config{}); !errors.Is(err, pgembed.ErrInvalidDataDir) {
		t.Fatalf("EnsureShared on a file: %v, want ErrInvalidDataDir", err)
	}
	if _, err := pgembed.StopShared(ctx, file, pgembed.Config{}); !errors.Is(err, pgembed.ErrInvalidDataDir) {
		t.Fatalf("StopShared on a file: %v, want ErrInvalidDataDir", err)
	}
}

// A standby streams what the primary writes, refuses writes until
// promoted, and accepts them after.
func TestStandbyPromote(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: starts a primary and a streaming standby")
	}
	ctx := context.Background()
	primary, err := pgembed.Start(ctx, pgembed.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Close(context.Background()) })
	standby, err := primary.StartStandby(ctx, pgembed.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close(context.Background()) })
	if standby.Port() == primary.Port() {
		t.Fatal("the standby listens on the primary's port")
	}
	exec := func(c *pgembed.Cluster, sql string) error {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec(primary, `CREATE TABLE t AS SELECT 1 AS x`); err != nil {
		t.Fatal(err)
	}
	// Streamed: the row shows on the standby (polled: replay is asynchronous).
	var n int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		conn, err := pgx.Connect(ctx, standby.URL("postgres"))
		if err == nil {
			err = conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n)
			conn.Close(ctx)
		}
		if err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby does not show the primary's table: %d rows, %v", n, err)
		}
	}
	if err := exec(standby, `INSERT INTO t VALUES (2)`); err == nil {
		t.Fatal("a standby accepted a write before its promotion")
	}
	if err := primary.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if err := exec(standby, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatalf("the promoted standby refused a write: %v", err)
	}
}

// A temporary cluster whose process dies without Close (SIGKILL: no Go
// cleanup runs) is stopped by its watchdog. The control kills the
// watchdog first: the server then outlives the process that started it.
func TestWatchdogStopsAnOrphanedCluster(t *testing.T) {
	t.Parallel()
	for _, withWatchdog := range []bool{true, false} {
		t.Run(fmt.Sprintf("watchdog=%v", withWatchdog), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			child := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), childEnv+"=1")
			child.Stderr = os.Stderr
			out, err := child.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			var url, root string
			var watchdog int
			if _, err := fmt.Fscan(out, &url, &root, &watchdog); err != nil {
				_ = child.Process.Kill()
				_ = child.Wait()
				t.Fatalf("the child's cluster: %v", err)
			}
			defer os.RemoveAll(root)
			ping := func() error {
				conn, err := pgx.Connect(ctx, url)
				if err != nil {
					return err
				}
				return conn.Close(ctx)
			}
			if err := ping(); err != nil || watchdog == 0 {
				t.Fatalf("the child's cluster at %s: %v, watchdog pid %d", url, err, watchdog)
			}
			if !withWatchdog {
				if err := syscall.Kill(watchdog, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
			_ = child.Process.Kill()
			_ = child.Wait()
			if !withWatchdog {
				err := ping()
				if c, aerr := pgembed.Attach(pgembed.Config{DataDir: root}); aerr == nil {
					_ = c.Kill(context.Background())
				}
				if err != nil {
					t.Fatalf("control: the server stopped without its watchdog (%v): the test shows nothing", err)
				}
				return
			}
			for ping() == nil {
				if ctx.Err() != nil {
					t.Fatal("the server still answers 2 minutes after the process that started it died")
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}

// Clusters started with an InitCache copy one initialized data directory:
// two first starts at once both succeed and keep one (no temporary
// directory is left), a later start copies it, and each cluster is its
// own (a table made in one is not in the others).
func TestInitCacheCopiesOneInitializedDirectory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cache := filepath.Join(testdb.SearchableDir(t, "fleetpace-initcache-"), "cache")
	start := func() *pgembed.Cluster {
		c, err := pgembed.Start(ctx, pgembed.Config{InitCache: cache})
		if err != nil {
			t.Error(err)
			return nil
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	var first [2]*pgembed.Cluster
	done := make(chan struct{})
	go func() { first[1] = start(); close(done) }()
	first[0] = start()
	<-done
	if t.Failed() {
		t.FailNow()
	}
	entries, err := os.ReadDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || !strings.HasPrefix(entries[0].Name(), "initdb-") {
		names := []string{}
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the cache holds %v, want one initialized directory", names)
	}
	third := start()
	if third == nil {
		t.FailNow()
	}
	for i, c := range []*pgembed.Cluster{first[0], first[1], third} {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname = 'made_here'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("cluster %d: %d tables made_here (%v), want a cluster of its own", i, n, err)
		}
		if _, err := conn.Exec(ctx, `CREATE TABLE made_here (x int)`); err != nil {
			t.Fatal(err)
		}
		_ = conn.Close(ctx)
	}
}
