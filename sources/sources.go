// Package sources is fleetpace's store: platforms (each destination and its
// limits), sources (what is fetched, how often, when it was last checked and
// with what outcome), keys' own limits, platform cooldowns, the recording of
// checks (RecordCheck, RecordChecks) and their history. Files of sources are
// read by package sourcefile, checks are written behind the fetch jobs by
// package recorder, and package scan, on top of it all, turns due sources
// into River jobs.
package sources

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DBTX is what the functions of this package need from a pool, a connection
// or a transaction.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner is what functions that run several statements in one transaction
// of their own need: a pool, a connection, or a transaction (which makes the
// transaction a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// queryRows runs sql and collects every row it returns with scan: the one
// error of either step is the caller's to wrap.
func queryRows[T any](ctx context.Context, db DBTX, scan pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scan)
}

// queryRow runs sql and scans the one row it must return with scan: no row
// is pgx.ErrNoRows, which the caller turns into ErrNotFound.
func queryRow[T any](ctx context.Context, db DBTX, scan pgx.RowToFunc[T], sql string, args ...any) (T, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		var zero T
		return zero, err
	}
	return pgx.CollectExactlyOneRow(rows, scan)
}

// ErrInvalid is wrapped by every error about bad input (a field, a line of an
// import file). Callers branch on it: the CLI exits 2.
var ErrInvalid = errors.New("invalid input")

// ErrNotFound is wrapped when a named platform or source does not exist.
var ErrNotFound = errors.New("not found")

// ErrUnknownPlatform is wrapped when a source names a platform that does
// not exist (the error is an ErrInvalid too: a field of the input is bad).
var ErrUnknownPlatform = fmt.Errorf("unknown platform: %w", ErrNotFound)

// FieldError names one bad field and why it is bad.
type FieldError struct {
	Field  string // e.g. "rate_per_sec"
	Value  string // the offending value as given
	Reason string // e.g. "must be finite and > 0"
	Err    error  // what the reason is, for errors.Is (ErrUnknownPlatform); may be nil
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return e.Field + " " + e.Reason
	}
	return fmt.Sprintf("%s %s (got %q)", e.Field, e.Reason, clip(e.Value, maxShownValue))
}

// maxShownValue is the most bytes of a bad value an error message shows.
const maxShownValue = 100

// clip shortens s to at most n bytes, cut at a character boundary, marking
// the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Unwrap makes every FieldError an ErrInvalid, and one with Err that too.
func (e *FieldError) Unwrap() []error { return []error{ErrInvalid, e.Err} }

// UnknownPlatform is the error of a source on a platform that does not
// exist: a FieldError on platform wrapping ErrUnknownPlatform.
func UnknownPlatform(name string) *FieldError {
	return &FieldError{Field: "platform", Value: name, Reason: "does not exist", Err: ErrUnknownPlatform}
}
