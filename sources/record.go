package sources

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
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
// the source keeps its place in the fair order.
func RecordCheck(ctx context.Context, db DBTX, sourceID int64, c Check) error {
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

// CheckRecord is one source's check, for RecordChecks.
type CheckRecord struct {
	SourceID int64
	Check    Check
}

// RecordChecks records many checks in one statement (one round trip, one
// commit when db is a pool), each row with exactly RecordCheck's rules. If a
// source appears more than once, its last check wins. Rows are written in id
// order, so two concurrent batches lock shared rows in the same order.
//
// A single check goes through RecordCheck's statement: the batch statement
// costs about twice as much for one row (PostgreSQL plans it afresh on every
// execution), and a Recorder under light load sends batches of one.
func RecordChecks(ctx context.Context, db DBTX, recs []CheckRecord) error {
	if len(recs) == 0 {
		return nil
	}
	recs = lastPerSource(recs)
	if len(recs) == 1 {
		return RecordCheck(ctx, db, recs[0].SourceID, recs[0].Check)
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
	if _, err := db.Exec(ctx, recordChecksSQL, ids, outcomes, statuses, errs, etags, lastModified, hashes, jobs); err != nil {
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
