// Package sources is fleetpace's store: platforms (each destination and its
// limits), sources (what is fetched, how often, when it was last checked and
// with what outcome), platform cooldowns, imports, and the recording of
// checks (RecordCheck, and the Recorder's group commit). Package scan, on
// top of it, turns due sources into River jobs.
package sources

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// unknownPlatform is the error of a source on a platform that does not exist.
func unknownPlatform(name string) *FieldError {
	return &FieldError{Field: "platform", Value: name, Reason: "does not exist", Err: ErrUnknownPlatform}
}

// LineError is a bad line of an import file.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// Unwrap makes every LineError an ErrInvalid.
func (e *LineError) Unwrap() error { return ErrInvalid }

// maxShownLines is the most bad lines an ImportError's message lists (Lines
// holds them all).
const maxShownLines = 50

// ImportError lists every bad line of an import; nothing was written.
type ImportError struct {
	Lines []*LineError
}

func (e *ImportError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "import rejected, nothing written: %d bad line(s)", len(e.Lines))
	for i, l := range e.Lines {
		if i == maxShownLines {
			fmt.Fprintf(&b, "\n  … and %d more", len(e.Lines)-i)
			break
		}
		b.WriteString("\n  ")
		b.WriteString(l.Error())
	}
	return b.String()
}

// Unwrap makes an ImportError an ErrInvalid.
func (e *ImportError) Unwrap() error { return ErrInvalid }
