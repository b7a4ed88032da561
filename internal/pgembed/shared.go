package pgembed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gofrs/flock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DatabaseName is the database fleetpace uses inside a shared cluster.
const DatabaseName = "fleetpace"

// EnsureShared returns the persistent cluster under dataDir, creating and
// starting it on first use and reusing it afterwards, also from other
// processes. A file lock serializes processes that start at the same moment,
// so exactly one of them initializes and starts the server. The server keeps
// running when the calling process exits; StopShared stops it. The database
// DatabaseName exists when EnsureShared returns.
func EnsureShared(ctx context.Context, dataDir string, cfg Config) (*Cluster, error) {
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
	c, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := c.createDatabase(ctx, DatabaseName); err != nil {
		return nil, err
	}
	return c, nil
}

// StopShared stops the persistent cluster under dataDir if it runs; it
// reports whether one was running.
func StopShared(ctx context.Context, dataDir string, cfg Config) (bool, error) {
	lock := flock.New(filepath.Join(dataDir, "fleetpace.lock"))
	if _, err := os.Stat(dataDir); err != nil {
		return false, nil
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
