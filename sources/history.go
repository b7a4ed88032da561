package sources

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/fetch"
)

// The history of checks (table fleetpace_check): one row per fetch, written
// with the check itself (RecordCheck, RecordChecks, package recorder), read by
// `sources show`, the status and the dashboard, pruned by the scan tick.

// DefaultHistoryLimit is how many checks History returns by default.
const DefaultHistoryLimit = 20

// DefaultPruneBatch is the most history rows PruneHistory deletes by
// default in one call (one scan tick).
const DefaultPruneBatch = 10_000

// HistoryEntry is one recorded check of a source.
type HistoryEntry struct {
	CheckedAt time.Time
	Outcome   fetch.Outcome
	Status    int // HTTP status, 0 if none
	Duration  time.Duration
	Bytes     int64
	Reason    string // why it failed or was rate limited
	Worker    string // the worker process that fetched
}

type historyEntryJSON struct {
	CheckedAt time.Time     `json:"checked_at"`
	Outcome   fetch.Outcome `json:"outcome"`
	Status    int           `json:"status,omitempty"`
	Duration  float64       `json:"duration_s"`
	Bytes     int64         `json:"bytes"`
	Reason    string        `json:"reason,omitempty"`
	Worker    string        `json:"worker,omitempty"`
}

// MarshalJSON writes the duration in seconds, under a key that says so.
func (e HistoryEntry) MarshalJSON() ([]byte, error) {
	return json.Marshal(historyEntryJSON{e.CheckedAt, e.Outcome, e.Status, e.Duration.Seconds(), e.Bytes, e.Reason, e.Worker})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (e *HistoryEntry) UnmarshalJSON(b []byte) error {
	var j historyEntryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*e = HistoryEntry{j.CheckedAt, j.Outcome, j.Status, seconds(j.Duration), j.Bytes, j.Reason, j.Worker}
	return nil
}

// History returns a source's last checks, newest first: at most limit (0:
// DefaultHistoryLimit). A source without checks, or unknown, has none.
func History(ctx context.Context, db DBTX, sourceID int64, limit int) ([]HistoryEntry, error) {
	if limit < 0 || limit > MaxHistoryLimit {
		return nil, fmt.Errorf("history: %w", &FieldError{Field: "limit", Value: fmt.Sprint(limit), Reason: fmt.Sprintf("must be in [1, %d] (0: default)", MaxHistoryLimit)})
	}
	if limit == 0 {
		limit = DefaultHistoryLimit
	}
	out, err := queryRows(ctx, db, func(row pgx.CollectableRow) (HistoryEntry, error) {
		var (
			e      HistoryEntry
			status *int16
			ms     float32
			reason *string
		)
		err := row.Scan(&e.CheckedAt, &e.Outcome, &status, &ms, &e.Bytes, &reason, &e.Worker)
		if status != nil {
			e.Status = int(*status)
		}
		if reason != nil {
			e.Reason = *reason
		}
		e.Duration = time.Duration(float64(ms) * float64(time.Millisecond))
		return e, err
	}, historySQL, sourceID, limit)
	if err != nil {
		return nil, fmt.Errorf("history of source %d: %w", sourceID, err)
	}
	return out, nil
}

// PruneHistory deletes history rows older than retention (0: every row),
// at most limit of them (0: DefaultPruneBatch), oldest first per platform,
// and returns how many it deleted. The scan tick calls it; a call deleting
// limit rows leaves more for the next.
func PruneHistory(ctx context.Context, db DBTX, retention time.Duration, limit int) (int64, error) {
	if retention < 0 || limit < 0 {
		return 0, fmt.Errorf("history: prune: retention (%s) and limit (%d) must be ≥ 0", retention, limit)
	}
	if limit == 0 {
		limit = DefaultPruneBatch
	}
	tag, err := db.Exec(ctx, pruneHistorySQL, retention, limit)
	if err != nil {
		return 0, fmt.Errorf("history: prune: %w", err)
	}
	return tag.RowsAffected(), nil
}

// ActivityQuery selects what Activity counts.
type ActivityQuery struct {
	// Platform limits the count to one platform. Default "": every one.
	Platform string
	// Window is how far back from now (database time) to count. Required.
	Window time.Duration
	// Bucket is the width of each time bucket. Default: Window (one bucket).
	Bucket time.Duration
}

// ActivityCount is how many checks of one outcome a platform had in one
// time bucket.
type ActivityCount struct {
	Platform string        `json:"platform"`
	Start    time.Time     `json:"start"` // the bucket's start; the bucket is [Start, Start + Bucket)
	Outcome  fetch.Outcome `json:"outcome"`
	Checks   int64         `json:"checks"`
	// MaxMultiplier is the largest backoff multiplier these checks were
	// paced under (0: none recorded).
	MaxMultiplier float64 `json:"max_multiplier,omitempty"`
}

// Activity counts checks (fetches: every outcome, rate limited included)
// per platform, time bucket and outcome over the last Window, from the
// history, with the largest backoff multiplier they were paced under. Requests per second of a bucket are its count / Bucket. The
// cost is the rows in the window (an index range per platform), not the
// history's size. Buckets without checks are absent; rows come by
// platform, bucket, outcome.
func Activity(ctx context.Context, db DBTX, q ActivityQuery) ([]ActivityCount, error) {
	if q.Window <= 0 {
		return nil, fmt.Errorf("activity: %w", &FieldError{Field: "window", Value: q.Window.String(), Reason: "must be > 0"})
	}
	if q.Bucket < 0 {
		return nil, fmt.Errorf("activity: %w", &FieldError{Field: "bucket", Value: q.Bucket.String(), Reason: "must be > 0 (0: the window)"})
	}
	if q.Bucket == 0 {
		q.Bucket = q.Window
	}
	out, err := queryRows(ctx, db, func(row pgx.CollectableRow) (ActivityCount, error) {
		var (
			c    ActivityCount
			mult *float64
		)
		err := row.Scan(&c.Platform, &c.Start, &c.Outcome, &c.Checks, &mult)
		if mult != nil {
			c.MaxMultiplier = *mult
		}
		return c, err
	}, activitySQL, q.Platform, q.Window, q.Bucket)
	if err != nil {
		return nil, fmt.Errorf("activity: %w", err)
	}
	return out, nil
}

// seconds converts seconds to a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
