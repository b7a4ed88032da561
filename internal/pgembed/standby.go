package pgembed

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
)

// StartStandby starts a streaming standby of c (which must be running): a
// new temporary cluster (cfg.DataDir must be empty) copied from c by
// pg_basebackup -R, replaying c's WAL as it streams, read-only until
// Promote. cfg's Settings apply to it as to any cluster (its port is its
// own). c's default configuration allows it (wal_level replica, local
// replication connections trusted).
func (c *Cluster) StartStandby(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.DataDir != "" {
		return nil, fmt.Errorf("pgembed: a standby is a temporary cluster (Config.DataDir must be empty)")
	}
	if cfg.BinDir == "" {
		cfg.BinDir = c.binDir
	}
	s, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	return s.launch(ctx, func(ctx context.Context) error { return s.copyFrom(ctx, c) })
}

// copyFrom fills the standby's data directory with a base backup of
// primary, set up to stream from it (standby.signal, primary_conninfo).
func (c *Cluster) copyFrom(ctx context.Context, primary *Cluster) error {
	for _, dir := range []string{c.sockDir} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
	}
	for _, dir := range []string{c.root, c.sockDir} {
		if err := c.chown(dir); err != nil {
			return err
		}
	}
	out, err := c.command(ctx, "pg_basebackup", "-D", c.dataDir, "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port),
		"-U", "postgres", "-R", "-X", "stream", "-c", "fast").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgembed: pg_basebackup: %w\n%s", err, out)
	}
	return nil
}

// Promote ends a standby's recovery (pg_ctl promote) and returns once it
// accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "-D", c.dataDir, "-w", "-t", "60", "promote").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgembed: pg_ctl promote: %w\n%s", err, out)
	}
	return nil
}

// Kill stops the server at once, as a crash would (pg_ctl stop -m
// immediate): no checkpoint, and WAL not yet sent to a standby is not sent.
func (c *Cluster) Kill(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "-D", c.dataDir, "-m", "immediate", "-w", "-t", "60", "stop").CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("Is server running?")) {
		return fmt.Errorf("pgembed: pg_ctl stop -m immediate: %w\n%s", err, out)
	}
	return nil
}
