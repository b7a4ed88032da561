package pgembed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/flock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DatabaseName is the database fleetpace uses inside a shared cluster.
const DatabaseName = "fleetpace"

// PortFile is the file of a shared cluster's data directory that remembers
// the port its server listens on.
const PortFile = "port"

// EnsureShared returns the persistent cluster under dataDir, creating and
// starting it on first use and reusing it afterwards, also from other
// processes. A file lock serializes processes that start at the same moment,
// so exactly one of them initializes and starts the server. The server keeps
// running when the calling process exits; StopShared stops it. The database
// DatabaseName exists when EnsureShared returns.
//
// The cluster keeps its port: the first start picks a free one and writes
// it to PortFile, and every later start (after StopShared, a reboot) listens
// on it again, so processes still running against the cluster — workers —
// find it again, as after an outage. If another process has taken the port,
// EnsureShared fails with ErrPortInUse rather than move (cfg.Port, if set,
// wins over the remembered port).
func EnsureShared(ctx context.Context, dataDir string, cfg Config) (*Cluster, error) {
	if err := checkDir(dataDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("pgembed: data dir: %w", err)
	}
	lock := flock.New(filepath.Join(dataDir, "fleetpace.lock"))
	ok, err := lock.TryLockContext(ctx, 50*time.Millisecond)
	if err != nil || !ok {
		return nil, fmt.Errorf("pgembed: lock %s: %w", lock.Path(), err)
	}
	defer lock.Unlock() //nolint:errcheck // released on exit anyway

	cfg.DataDir = dataDir
	cfg.Durable = true
	portPath := filepath.Join(dataDir, PortFile)
	if cfg.Port == 0 {
		cfg.Port = rememberedPort(dataDir)
	}
	c, err := Start(ctx, cfg)
	if errors.Is(err, ErrPortInUse) {
		return nil, fmt.Errorf("%w (remembered in %s, so that workers still running find the cluster again): "+
			"stop what listens there, or remove %s to start on a new port and restart those workers", err, portPath, portPath)
	}
	if err != nil {
		return nil, err
	}
	if b, _ := os.ReadFile(portPath); strings.TrimSpace(string(b)) != strconv.Itoa(c.Port()) {
		if err := os.WriteFile(portPath, []byte(strconv.Itoa(c.Port())+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("pgembed: remember the port: %w", err)
		}
	}
	if err := c.createDatabase(ctx, DatabaseName); err != nil {
		return nil, err
	}
	return c, nil
}

// rememberedPort is the port of the shared cluster under dataDir: PortFile's,
// else the one its last start wrote to the server's configuration (clusters
// made before PortFile), else 0.
func rememberedPort(dataDir string) int {
	if b, err := os.ReadFile(filepath.Join(dataDir, PortFile)); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 && p < 65536 {
			return p
		}
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "pgdata", "fleetpace.conf"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "port = "); ok {
			if p, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && p > 0 && p < 65536 {
				return p
			}
		}
	}
	return 0
}

// StopShared stops the persistent cluster under dataDir if it runs; it
// reports whether one was running.
func StopShared(ctx context.Context, dataDir string, cfg Config) (bool, error) {
	lock := flock.New(filepath.Join(dataDir, "fleetpace.lock"))
	if _, err := os.Stat(dataDir); err != nil {
		return false, nil
	}
	if err := checkDir(dataDir); err != nil {
		return false, err
	}
	ok, err := lock.TryLockContext(ctx, 50*time.Millisecond)
	if err != nil || !ok {
		return false, fmt.Errorf("pgembed: lock %s: %w", lock.Path(), err)
	}
	defer lock.Unlock() //nolint:errcheck
	cfg.DataDir = dataDir
	c, err := Attach(cfg)
	if errors.Is(err, ErrNotRunning) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, c.Stop(ctx)
}

func (c *Cluster) createDatabase(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgembed: connect: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		return nil
	}
	if err != nil {
		return fmt.Errorf("pgembed: create database %s: %w", name, err)
	}
	return nil
}
