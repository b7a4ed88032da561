package sources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Check is the recorded result of one fetch of a source.
type Check struct {
	Outcome      string // ok, not_modified, rate_pressure, rate_limited, failed
	Status       int    // HTTP status, 0 if none
	Error        string // reason for failed / rate_limited
	ETag         string // new validators (ok only)
	LastModified string
	ContentHash  string
	// JobID is the job that made the check (0: unknown, always written). A
	// check of a job that no longer holds the source's queue mark — the
	// source was released and queued again for another job, which will check
	// it — is not written.
	JobID int64
	// Duration, Bytes and Worker go to the check's history row only: how
	// long the fetch took, the body size, and the worker that fetched (a
	// Recorder fills in its own RecorderConfig.Worker when empty).
	Duration time.Duration
	Bytes    int64
	Worker   string
}

// ErrHistoryNotRecorded is wrapped by the error of RecordCheck and
// RecordChecks when the checks were recorded but their history rows were
// not (the history statement failed, and the checks were written again
// without it). The checks are safe: a caller that would retry its work on
// an error must not retry on this one.
var ErrHistoryNotRecorded = errors.New("checks recorded without their history")

// RecordCheck records a fetch outcome, with its history row (one
// statement), and releases the source for the next tick. Rate pressure and
// rate limiting are neither a check nor a failure: the source keeps its
// place in the fair order (they are in the history).
//
// A failed history write never loses the check: when the statement is
// refused, the check is written again on its own and the error wraps
// ErrHistoryNotRecorded. In a transaction (db is a pgx.Tx) the history
// statement runs in a savepoint, so its failure leaves the transaction
// usable.
func RecordCheck(ctx context.Context, db DBTX, sourceID int64, c Check) error {
	return recordOne(ctx, db, sourceID, c, true)
}

// RecordCheckWithoutHistory records a fetch outcome as RecordCheck does,
// without its history row: for a fleet that keeps no history.
func RecordCheckWithoutHistory(ctx context.Context, db DBTX, sourceID int64, c Check) error {
	return recordOne(ctx, db, sourceID, c, false)
}

func recordOne(ctx context.Context, db DBTX, sourceID int64, c Check, history bool) error {
	var status *int
	if c.Status != 0 {
		status = &c.Status
	}
	args := []any{sourceID, c.Outcome, status, c.Error, c.ETag, c.LastModified, c.ContentHash, c.JobID}
	var hargs []any
	if history {
		hargs = append(args, durationMS(c.Duration), c.Bytes, c.Worker)
	}
	if err := record(ctx, db, recordCheckSQL, args, recordCheckHistorySQL, hargs); err != nil {
		return fmt.Errorf("source %d: record check: %w", sourceID, err)
	}
	return nil
}

// record runs the statement with history (hsql with hargs) unless hargs
// is nil, and the statement without it (sql with args) instead of it, or
// after it when the server refused it: then the error wraps
// ErrHistoryNotRecorded and the history statement's error.
func record(ctx context.Context, db DBTX, sql string, args []any, hsql string, hargs []any) error {
	if hargs != nil {
		herr := withSavepoint(ctx, db, func(db DBTX) error {
			_, err := db.Exec(ctx, hsql, hargs...)
			return err
		})
		if !refused(ctx, herr) {
			return herr
		}
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			return err
		}
		return fmt.Errorf("%w: %w", ErrHistoryNotRecorded, herr)
	}
	_, err := db.Exec(ctx, sql, args...)
	return err
}

// refused reports whether err is the server's refusal of a statement that
// writing the checks without their history may get past: an error of the
// statement itself, so it wrote nothing and writing the checks again
// cannot write them twice. A lost connection is not one (the statement may
// have committed), nor a cancelled statement (a cancel, a statement
// timeout: the next would wait the same way), nor the caller's end.
func refused(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	return ctx.Err() == nil && errors.As(err, &pgErr) && !strings.HasPrefix(pgErr.Code, "57") // operator intervention
}

// withSavepoint runs fn on db; when db is a transaction, inside a savepoint
// (a refused statement would otherwise abort the whole transaction).
func withSavepoint(ctx context.Context, db DBTX, fn func(DBTX) error) error {
	tx, ok := db.(pgx.Tx)
	if !ok {
		return fn(db)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if err := fn(sp); err != nil {
		_ = sp.Rollback(ctx)
		return err
	}
	return sp.Commit(ctx)
}

func durationMS(d time.Duration) float32 { return float32(d.Seconds() * 1000) }

// CheckRecord is one source's check, for RecordChecks.
type CheckRecord struct {
	SourceID int64
	Check    Check
}

// RecordChecks records many checks, with their history rows, in one
// statement (one round trip, one commit when db is a pool), each row with
// exactly RecordCheck's rules. If a source appears more than once, its last
// check wins. Rows are written in id order, so two concurrent batches lock
// shared rows in the same order. A failed history write never loses the
// checks (see RecordCheck and ErrHistoryNotRecorded).
//
// A single check goes through RecordCheck's statement: the batch statement
// costs about twice as much for one row (PostgreSQL plans it afresh on every
// execution), and a Recorder under light load sends batches of one.
func RecordChecks(ctx context.Context, db DBTX, recs []CheckRecord) error {
	return recordMany(ctx, db, recs, true)
}

func recordMany(ctx context.Context, db DBTX, recs []CheckRecord, history bool) error {
	if len(recs) == 0 {
		return nil
	}
	recs = lastPerSource(recs)
	if len(recs) == 1 {
		return recordOne(ctx, db, recs[0].SourceID, recs[0].Check, history)
	}
	n := len(recs)
	var (
		ids          = make([]int64, n)
		outcomes     = make([]string, n)
		statuses     = make([]*int32, n)
		errs         = make([]string, n)
		etags        = make([]string, n)
		lastModified = make([]string, n)
		hashes       = make([]string, n)
		jobs         = make([]int64, n)
	)
	for i, r := range recs {
		c := r.Check
		ids[i], outcomes[i], errs[i], etags[i], lastModified[i], hashes[i], jobs[i] =
			r.SourceID, c.Outcome, c.Error, c.ETag, c.LastModified, c.ContentHash, c.JobID
		if c.Status != 0 {
			s := int32(c.Status)
			statuses[i] = &s
		}
	}
	args := []any{ids, outcomes, statuses, errs, etags, lastModified, hashes, jobs}
	var hargs []any
	if history {
		var (
			durations = make([]float32, n)
			bytes     = make([]int64, n)
			workers   = make([]string, n)
		)
		for i, r := range recs {
			durations[i], bytes[i], workers[i] = durationMS(r.Check.Duration), r.Check.Bytes, r.Check.Worker
		}
		hargs = append(args, durations, bytes, workers)
	}
	if err := record(ctx, db, recordChecksSQL, args, recordChecksHistorySQL, hargs); err != nil {
		return fmt.Errorf("record checks of %d sources: %w", n, err)
	}
	return nil
}

// lastPerSource returns recs sorted by source id with only the last check of
// each source, without modifying recs.
func lastPerSource(recs []CheckRecord) []CheckRecord {
	out := slices.Clone(recs)
	slices.SortStableFunc(out, func(a, b CheckRecord) int { return cmp.Compare(a.SourceID, b.SourceID) })
	w := 0
	for i := range out {
		if w > 0 && out[w-1].SourceID == out[i].SourceID {
			out[w-1] = out[i] // a later check of the same source replaces it
			continue
		}
		out[w] = out[i]
		w++
	}
	return out[:w]
}

// Release marks a source as no longer queued without recording a check.
func Release(ctx context.Context, db DBTX, sourceID int64) error {
	if _, err := db.Exec(ctx, releaseSQL, sourceID); err != nil {
		return fmt.Errorf("source %d: release: %w", sourceID, err)
	}
	return nil
}

// PlatformCounts summarizes one platform's sources for status.
type PlatformCounts struct {
	Platform     string        `json:"platform"`
	Sources      int64         `json:"sources"`
	Enabled      int64         `json:"enabled"`
	Queued       int64         `json:"queued"`
	Due          int64         `json:"due"`           // due now: as `sources list --due` and the scan see it
	NeverChecked int64         `json:"never_checked"` // never fetched yet
	Failing      int64         `json:"failing"`       // enabled and failing (consecutive failures > 0)
	StaleMax     time.Duration `json:"-"`             // how late the most overdue source is (JSON: stale_max_s)
	StaleP95     time.Duration `json:"-"`             // 95th percentile of lateness among overdue sources (JSON: stale_p95_s)
}

// Counts returns per-platform source counts and staleness.
func Counts(ctx context.Context, db DBTX) ([]PlatformCounts, error) {
	rows, err := db.Query(ctx, countsSQL)
	if err != nil {
		return nil, fmt.Errorf("counts: %w", err)
	}
	defer rows.Close()
	var out []PlatformCounts
	for rows.Next() {
		var c PlatformCounts
		var staleMax, staleP95 float64
		if err := rows.Scan(&c.Platform, &c.Sources, &c.Enabled, &c.Queued, &c.Due, &c.NeverChecked, &c.Failing, &staleMax, &staleP95); err != nil {
			return nil, fmt.Errorf("counts: %w", err)
		}
		c.StaleMax = time.Duration(staleMax * float64(time.Second))
		c.StaleP95 = time.Duration(staleP95 * float64(time.Second))
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("counts: %w", err)
	}
	return out, nil
}
