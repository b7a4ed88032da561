// Package fleetpace holds the database schema of fleetpace and applies it.
//
// fleetpace has no migration framework: migrations-free-schema.sql is a list
// of idempotent statements, embedded in the binary. Apply runs it together
// with River's own migrations under one advisory lock, so
// any number of processes may apply the schema at the same moment (River's
// migrator alone has no cross-process lock and fails that).
package fleetpace

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// SchemaSQL is the whole schema of fleetpace's own tables.
//
//go:embed migrations-free-schema.sql
var SchemaSQL string

// schemaLockKey is the advisory lock key taken while applying the schema:
// the 64-bit FNV-1a hash of "fleetpace.schema", fixed so every version of
// fleetpace serializes on the same key.
const schemaLockKey int64 = 0x2f1e_7ac3_5d90_4b61

// ApplyResult reports what Apply did.
type ApplyResult struct {
	// RiverVersions lists the River migration versions applied by this call;
	// empty when River's schema was already current.
	RiverVersions []int
}

// Apply creates every fleetpace table and index and runs River's migrations up
// to the version this binary was built with, under one advisory lock. It is
// safe to call concurrently from many processes. The pool must allow at least
// two connections.
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

	// A session-level lock on a dedicated connection, held while our tables
	// are created and while River migrates: River runs each of its migrations
	// in its own transaction (an enum value added by one cannot be used in the
	// same transaction), so a transaction-scoped lock cannot cover them all.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema: acquire: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", schemaLockKey); err != nil {
		return nil, fmt.Errorf("schema: advisory lock: %w", err)
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", schemaLockKey); err != nil {
			// The lock dies with the session; make sure the session dies.
			conn.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck
		}
	}()

	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := tx.Exec(ctx, SchemaSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		return nil, fmt.Errorf("schema: fleetpace tables: %w", err)
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
