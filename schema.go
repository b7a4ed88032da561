// Package fleetpace holds the database schema of fleetpace and applies it.
//
// fleetpace has no migration framework: migrations-free-schema.sql is a list
// of idempotent statements, embedded in the binary. Apply runs it together
// with River's own migrations under one advisory lock, and records the
// file's SHA-256, so any number of processes may apply the schema at the
// same moment (River's migrator alone has no cross-process lock and fails
// that), and applying a current schema takes no lock and runs no DDL (a
// statement that changes nothing still locks its table and would deadlock
// with the workers already running).
package fleetpace

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Schema is the whole schema of fleetpace's own tables (the text of
// migrations-free-schema.sql), which Apply applies.
//
//go:embed migrations-free-schema.sql
var Schema string

// SchemaVersion is the SHA-256 of Schema, in hex: what Apply records in
// fleetpace_schema.
var SchemaVersion = func() string {
	sum := sha256.Sum256([]byte(Schema))
	return hex.EncodeToString(sum[:])
}()

// schemaLockKey is the advisory lock key taken while applying the schema:
// the 64-bit FNV-1a hash of "fleetpace.schema", fixed so every version of
// fleetpace serializes on the same key.
const schemaLockKey int64 = 0x2f1e_7ac3_5d90_4b61

// The statements of this package.
const (
	lockSQL   = `SELECT pg_advisory_lock($1)`
	unlockSQL = `SELECT pg_advisory_unlock($1)`
	// The recorded version, '' when fleetpace_schema does not exist yet
	// (to_regclass: no error, so no aborted transaction either).
	versionTableSQL = `SELECT to_regclass('fleetpace_schema') IS NOT NULL`
	versionSQL      = `SELECT coalesce((SELECT sql_sha256 FROM fleetpace_schema), '')`
	recordSQL       = `INSERT INTO fleetpace_schema (sql_sha256) VALUES ($1)
ON CONFLICT (id) DO UPDATE SET sql_sha256 = excluded.sql_sha256, applied_at = now()`
)

// ApplyResult reports what Apply did.
type ApplyResult struct {
	// Current: the schema was current already; Apply changed nothing.
	Current bool
	// RiverVersions lists the River migration versions applied by this call;
	// empty when River's schema was already current.
	RiverVersions []int
}

// Apply creates every fleetpace table and index and runs River's migrations up
// to the version this binary was built with, under one advisory lock. It is
// safe to call concurrently from many processes. When the schema is current
// (the recorded SHA-256 of Schema is this binary's, and no River
// migration is pending) it only reads, takes no lock and returns Current.
// The pool must allow at least two connections.
func Apply(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (*ApplyResult, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// One connection holds the lock while River's migrator takes another.
	if n := pool.Config().MaxConns; n < 2 {
		return nil, fmt.Errorf("schema: the pool needs at least 2 connections (MaxConns is %d)", n)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("schema: river migrator: %w", err)
	}
	if ok, err := current(ctx, pool, migrator); err != nil {
		return nil, err
	} else if ok {
		return &ApplyResult{Current: true}, nil
	}

	// A session-level lock on a dedicated connection, held while our tables
	// are created and while River migrates: River runs each of its migrations
	// in its own transaction (an enum value added by one cannot be used in the
	// same transaction), so a transaction-scoped lock cannot cover them all.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema: acquire: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, lockSQL, schemaLockKey); err != nil {
		return nil, fmt.Errorf("schema: advisory lock: %w", err)
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), unlockSQL, schemaLockKey); err != nil {
			// The lock dies with the session; make sure the session dies.
			conn.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck
		}
	}()
	// Whoever held the lock before may have brought the schema up to date.
	if ok, err := current(ctx, pool, migrator); err != nil {
		return nil, err
	} else if ok {
		return &ApplyResult{Current: true}, nil
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, Schema, pgx.QueryExecModeSimpleProtocol); err != nil {
		return nil, fmt.Errorf("schema: fleetpace tables: %w", err)
	}
	if _, err := tx.Exec(ctx, recordSQL, SchemaVersion); err != nil {
		return nil, fmt.Errorf("schema: record the version: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("schema: commit: %w", err)
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return nil, fmt.Errorf("schema: river migrations: %w", err)
	}
	out := &ApplyResult{}
	for _, v := range res.Versions {
		out.RiverVersions = append(out.RiverVersions, v.Version)
	}
	return out, nil
}

// current reports whether the recorded schema version is this binary's and
// River has no migration pending. It only reads.
func current(ctx context.Context, pool *pgxpool.Pool, migrator *rivermigrate.Migrator[pgx.Tx]) (bool, error) {
	var exists bool
	if err := pool.QueryRow(ctx, versionTableSQL).Scan(&exists); err != nil {
		return false, fmt.Errorf("schema: read the version: %w", err)
	}
	if !exists {
		return false, nil
	}
	var version string
	if err := pool.QueryRow(ctx, versionSQL).Scan(&version); err != nil {
		return false, fmt.Errorf("schema: read the version: %w", err)
	}
	if version != SchemaVersion {
		return false, nil
	}
	res, err := migrator.Validate(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("schema: river migrations: %w", err)
	}
	return res.OK, nil
}
