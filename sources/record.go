package sources

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

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
}

// RecordCheck records a fetch outcome and releases the source for the next
// tick. Rate pressure and rate limiting are neither a check nor a failure:
// the source keeps its place in the fair order. Text that PostgreSQL cannot
// store (bytes that are not UTF-8, NUL) is replaced by U+FFFD first, and an
// error message is clipped to MaxCheckError bytes.
func RecordCheck(ctx context.Context, db DBTX, sourceID int64, c Check) error {
	c = c.clean()
	var status *int
	if c.Status != 0 {
		status = &c.Status
	}
	_, err := db.Exec(ctx, recordCheckSQL, sourceID, c.Outcome, status, c.Error, c.ETag, c.LastModified, c.ContentHash, c.JobID)
	if err != nil {
		return fmt.Errorf("source %d: record check: %w", sourceID, err)
	}
	return nil
}

// MaxCheckError is the longest error message a check keeps, in bytes.
const MaxCheckError = 1000

// clean makes every text of c storable: valid UTF-8 without NUL, the error
// clipped to MaxCheckError.
func (c Check) clean() Check {
	for _, s := range []*string{&c.Outcome, &c.Error, &c.ETag, &c.LastModified, &c.ContentHash} {
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
}

func (e *RefusedChecksError) Error() string {
	msgs := make([]string, len(e.Checks))
	for i, c := range e.Checks {
		msgs[i] = c.Error()
	}
	return fmt.Sprintf("record checks: %d refused: %s", len(e.Checks), strings.Join(msgs, "; "))
}

func (e *RefusedChecksError) Unwrap() error { return ErrCheckRefused }

// RecordChecks records many checks in one statement (one round trip, one
// commit when db is a pool), each row with exactly RecordCheck's rules. If a
// source appears more than once, its last check wins. Rows are written in id
// order, so two concurrent batches lock shared rows in the same order.
//
// A single check goes through RecordCheck's statement: the batch statement
// costs about twice as much for one row (PostgreSQL plans it afresh on every
// execution), and a Recorder under light load sends batches of one.
//
// One bad row never costs the others their checks. When the database
// refuses a batch for something a row can cause (a data exception, a
// constraint, a trigger's exception, a value too large: SQLSTATE classes
// 22, 23, 54 and P0), every row is written again
// on its own; a row refused again is recorded as a failed check whose error
// says why, so its source backs off like any failure instead of being
// fetched again at once, for ever. The error is then a *RefusedChecksError
// naming those rows. Other errors (the database unreachable, a cancelled
// statement) are returned as they are, nothing written. In a transaction
// (db is a pgx.Tx) a failed statement aborts the transaction: there is no
// second pass.
func RecordChecks(ctx context.Context, db DBTX, recs []CheckRecord) error {
	refused, err := recordChecks(ctx, db, recs)
	if err != nil {
		return err
	}
	if len(refused) > 0 {
		return &RefusedChecksError{Checks: refused}
	}
	return nil
}

// recordChecks is RecordChecks: err is the batch's error (nothing written),
// refused the rows the database refused when each was written alone.
func recordChecks(ctx context.Context, db DBTX, recs []CheckRecord) (refused []*RefusedCheck, err error) {
	if len(recs) == 0 {
		return nil, nil
	}
	recs = lastPerSource(recs)
	if len(recs) == 1 {
		err = RecordCheck(ctx, db, recs[0].SourceID, recs[0].Check)
	} else {
		err = recordBatch(ctx, db, recs)
	}
	if err == nil || !rowFault(err) || ctx.Err() != nil {
		return nil, err
	}
	if _, inTx := db.(pgx.Tx); inTx {
		return nil, err
	}
	for _, r := range recs {
		if len(recs) > 1 {
			err = RecordCheck(ctx, db, r.SourceID, r.Check)
			if err == nil {
				continue
			}
			if !rowFault(err) {
				return refused, err // e.g. the database went away: the rest is not written
			}
		}
		failed := Check{Outcome: "failed", Status: r.Check.Status, JobID: r.Check.JobID,
			Error: "the check could not be recorded: " + dbMessage(err)}
		rc := &RefusedCheck{SourceID: r.SourceID, Err: err}
		if ferr := RecordCheck(ctx, db, r.SourceID, failed); ferr != nil {
			rc.Lost = true
		}
		refused = append(refused, rc)
	}
	return refused, nil
}

// recordBatch runs the batch statement of RecordChecks.
func recordBatch(ctx context.Context, db DBTX, recs []CheckRecord) error {
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
		c := r.Check.clean()
		ids[i], outcomes[i], errs[i], etags[i], lastModified[i], hashes[i], jobs[i] =
			r.SourceID, c.Outcome, c.Error, c.ETag, c.LastModified, c.ContentHash, c.JobID
		if c.Status != 0 {
			s := int32(c.Status)
			statuses[i] = &s
		}
	}
	if _, err := db.Exec(ctx, recordChecksSQL, ids, outcomes, statuses, errs, etags, lastModified, hashes, jobs); err != nil {
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
	Due          int64         `json:"due"`           // due now and not queued
	NeverChecked int64         `json:"never_checked"` // never fetched yet
	StaleMax     time.Duration `json:"stale_max"`     // how late the most overdue source is
	StaleP95     time.Duration `json:"stale_p95"`     // 95th percentile of lateness among overdue sources
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
		if err := rows.Scan(&c.Platform, &c.Sources, &c.Enabled, &c.Queued, &c.Due, &c.NeverChecked, &staleMax, &staleP95); err != nil {
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
