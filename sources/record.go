package sources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/fetch"
)

// Check is the recorded result of one fetch of a source.
type Check struct {
	Outcome      string // a fetch.Outcome, as it is stored
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
	// recorder.Recorder fills in its own Config.Worker when empty).
	Duration time.Duration
	Bytes    int64
	Worker   string
	// Multiplier goes to the history row only: the platform's shared
	// backoff multiplier under which the fetch's slot was reserved
	// (pacer.Reservation.Multiplier; 0: unknown, written as NULL).
	Multiplier float64
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
// place in the fair order (they are in the history). Text that PostgreSQL
// cannot store (bytes that are not UTF-8, NUL) is replaced by U+FFFD first,
// and an error message is clipped to MaxCheckError bytes.
//
// A failed history write never loses the check: when the statement is
// refused, the check is written again on its own and the error wraps
// ErrHistoryNotRecorded. In a transaction (db is a pgx.Tx) the history
// statement runs in a savepoint, so its failure leaves the transaction
// usable.
func RecordCheck(ctx context.Context, db DBTX, sourceID int64, c Check) error {
	return recordOne(ctx, db, sourceID, c, true)
}

func recordOne(ctx context.Context, db DBTX, sourceID int64, c Check, history bool) error {
	c = c.clean()
	var status *int
	if c.Status != 0 {
		status = &c.Status
	}
	args := []any{sourceID, c.Outcome, status, c.Error, c.ETag, c.LastModified, c.ContentHash, c.JobID}
	var hargs []any
	if history {
		hargs = append(args, durationMS(c.Duration), c.Bytes, c.Worker, multiplierArg(c.Multiplier))
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
		if !refusedStatement(ctx, herr) {
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

// refusedStatement reports whether err is the server's refusal of a statement that
// writing the checks without their history may get past: an error of the
// statement itself, so it wrote nothing and writing the checks again
// cannot write them twice. A lost connection is not one (the statement may
// have committed), nor a cancelled statement (a cancel, a statement
// timeout: the next would wait the same way), nor the caller's end.
func refusedStatement(ctx context.Context, err error) bool {
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

// MaxCheckError is the longest error message a check keeps, in bytes.
const MaxCheckError = 1000

// clean makes every text of c storable: valid UTF-8 without NUL, the error
// clipped to MaxCheckError.
func (c Check) clean() Check {
	for _, s := range []*string{&c.Outcome, &c.Error, &c.ETag, &c.LastModified, &c.ContentHash, &c.Worker} {
		if !utf8.ValidString(*s) || strings.IndexByte(*s, 0) >= 0 {
			*s = strings.ReplaceAll(strings.ToValidUTF8(*s, "\uFFFD"), "\x00", "\uFFFD")
		}
	}
	c.Error = clip(c.Error, MaxCheckError)
	return c
}

// CheckRecord is one source's check, for RecordChecks.
type CheckRecord struct {
	SourceID int64
	Check    Check
}

// ErrCheckRefused is wrapped by the error of a check the database refused
// (see RecordChecks).
var ErrCheckRefused = errors.New("check refused by the database")

// RefusedCheck is a check of a batch that the database refused on its own,
// when written alone: Err says why. Unless Lost, the source was recorded
// instead as a failed check whose error is Err's message.
type RefusedCheck struct {
	SourceID int64
	Err      error
	Lost     bool // the failed check could not be written either
}

func (e *RefusedCheck) Error() string {
	if e.Lost {
		return fmt.Sprintf("source %d: %v: %v; not recorded", e.SourceID, ErrCheckRefused, e.Err)
	}
	return fmt.Sprintf("source %d: %v: %v; recorded as a failed check", e.SourceID, ErrCheckRefused, e.Err)
}

func (e *RefusedCheck) Unwrap() []error { return []error{ErrCheckRefused, e.Err} }

// RefusedChecksError is RecordChecks' error when the database refused some
// of the checks (every other check was written).
type RefusedChecksError struct {
	Checks []*RefusedCheck // by source id
	// History, when not nil, wraps ErrHistoryNotRecorded: some checks were
	// written without their history rows.
	History error
}

func (e *RefusedChecksError) Error() string {
	msgs := make([]string, len(e.Checks))
	for i, c := range e.Checks {
		msgs[i] = c.Error()
	}
	msg := fmt.Sprintf("record checks: %d refused: %s", len(e.Checks), strings.Join(msgs, "; "))
	if e.History != nil {
		msg += "; " + e.History.Error()
	}
	return msg
}

func (e *RefusedChecksError) Unwrap() []error {
	if e.History != nil {
		return []error{ErrCheckRefused, e.History}
	}
	return []error{ErrCheckRefused}
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
// execution), and a recorder.Recorder under light load sends batches of one.
//
// One bad row never costs the others their checks. When the database
// refuses a batch for something a row can cause (a data exception, a
// constraint, a trigger's exception, a value too large: SQLSTATE classes
// 22, 23, 54 and P0) even without its history, every row is written again
// on its own; a row refused again is recorded as a failed check whose error
// says why, so its source backs off like any failure instead of being
// fetched again at once, for ever. The error is then a *RefusedChecksError
// naming those rows. Other errors (the database unreachable, a cancelled
// statement) are returned as they are, nothing written. In a transaction
// (db is a pgx.Tx) a failed statement aborts the transaction: there is no
// second pass.
func RecordChecks(ctx context.Context, db DBTX, recs []CheckRecord) error {
	return recordChecksError(RecordCheckBatch(ctx, db, recs, true))
}

// RecordChecksWithoutHistory records checks as RecordChecks does, without
// their history rows: for a fleet that keeps no history.
func RecordChecksWithoutHistory(ctx context.Context, db DBTX, recs []CheckRecord) error {
	return recordChecksError(RecordCheckBatch(ctx, db, recs, false))
}

// recordChecksError is RecordChecks' error for recordChecks' results.
func recordChecksError(refused []*RefusedCheck, err error) error {
	if err != nil && !errors.Is(err, ErrHistoryNotRecorded) {
		return err
	}
	if len(refused) > 0 {
		return &RefusedChecksError{Checks: refused, History: err}
	}
	return err
}

// RecordCheckBatch is RecordChecks, with or without history rows, for a
// caller that tells each check's fate to its own waiter (the group commit
// of package recorder). err is either the batch's error (nothing written,
// but see refused) or one wrapping ErrHistoryNotRecorded (every check not
// refused written, some without history); refused are the rows the
// database refused when each was written alone.
func RecordCheckBatch(ctx context.Context, db DBTX, recs []CheckRecord, history bool) (refused []*RefusedCheck, err error) {
	if len(recs) == 0 {
		return nil, nil
	}
	recs = lastPerSource(recs)
	if len(recs) == 1 {
		err = recordOne(ctx, db, recs[0].SourceID, recs[0].Check, history)
	} else {
		err = recordBatch(ctx, db, recs, history)
	}
	// A check written without its history is written: never again.
	if err == nil || errors.Is(err, ErrHistoryNotRecorded) || !rowFault(err) || ctx.Err() != nil {
		return nil, err
	}
	if _, inTx := db.(pgx.Tx); inTx {
		return nil, err
	}
	var historyErr error // the last ErrHistoryNotRecorded of a row
	for _, r := range recs {
		if len(recs) > 1 {
			err = recordOne(ctx, db, r.SourceID, r.Check, history)
			if err == nil {
				continue
			}
			if errors.Is(err, ErrHistoryNotRecorded) {
				historyErr = err
				continue
			}
			if !rowFault(err) {
				return refused, err // e.g. the database went away: the rest is not written
			}
		}
		failed := Check{Outcome: string(fetch.Failed), Status: r.Check.Status, JobID: r.Check.JobID,
			Duration: r.Check.Duration, Bytes: r.Check.Bytes, Worker: r.Check.Worker, Multiplier: r.Check.Multiplier,
			Error: "the check could not be recorded: " + dbMessage(err)}
		rc := &RefusedCheck{SourceID: r.SourceID, Err: err}
		switch ferr := recordOne(ctx, db, r.SourceID, failed, history); {
		case errors.Is(ferr, ErrHistoryNotRecorded):
			historyErr = ferr
		case ferr != nil:
			rc.Lost = true
		}
		refused = append(refused, rc)
	}
	return refused, historyErr
}

// recordBatch runs the batch statement of RecordChecks.
func recordBatch(ctx context.Context, db DBTX, recs []CheckRecord, history bool) error {
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
		durations    []float32
		bytes        []int64
		workers      []string
		multipliers  []*float32
	)
	if history {
		durations, bytes, workers, multipliers = make([]float32, n), make([]int64, n), make([]string, n), make([]*float32, n)
	}
	for i, r := range recs {
		c := r.Check.clean()
		ids[i], outcomes[i], errs[i], etags[i], lastModified[i], hashes[i], jobs[i] =
			r.SourceID, c.Outcome, c.Error, c.ETag, c.LastModified, c.ContentHash, c.JobID
		if c.Status != 0 {
			s := int32(c.Status)
			statuses[i] = &s
		}
		if history {
			durations[i], bytes[i], workers[i], multipliers[i] = durationMS(c.Duration), c.Bytes, c.Worker, multiplierArg(c.Multiplier)
		}
	}
	args := []any{ids, outcomes, statuses, errs, etags, lastModified, hashes, jobs}
	var hargs []any
	if history {
		hargs = append(args, durations, bytes, workers, multipliers)
	}
	if err := record(ctx, db, recordChecksSQL, args, recordChecksHistorySQL, hargs); err != nil {
		return fmt.Errorf("record checks of %d sources: %w", n, err)
	}
	return nil
}

// rowFault reports whether err is something one row of a batch can cause:
// a data exception, an integrity constraint, a program limit (a value too
// large for an index) or an exception raised by a trigger. The database
// being unreachable, a cancelled statement, a lock or serialization failure
// are not, nor is any error that is not the server's.
func rowFault(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23", "54", "P0":
		return true
	}
	return false
}

// dbMessage is a database error's message without our wrapping.
func dbMessage(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
	}
	return err.Error()
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

// multiplierArg is a check's multiplier as its history column takes it:
// NULL when unknown (0, or not a finite positive number).
func multiplierArg(m float64) *float32 {
	if !(m > 0) || math.IsInf(m, 0) {
		return nil
	}
	f := float32(m)
	return &f
}
