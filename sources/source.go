package sources

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultInterval is how often a source is checked when no interval is given.
const DefaultInterval = time.Hour

// Source is one thing fetched on a schedule.
type Source struct {
	ID                  int64         `json:"id"`
	Platform            string        `json:"platform"`
	URL                 string        `json:"url"`
	Interval            time.Duration `json:"interval"`
	Enabled             bool          `json:"enabled"`
	DueAt               time.Time     `json:"due_at"`
	LastCheckedAt       *time.Time    `json:"last_checked_at"`
	ConsecutiveFailures int           `json:"consecutive_failures"`
	LastStatus          *int          `json:"last_status"`
	LastOutcome         *string       `json:"last_outcome"`
	LastError           *string       `json:"last_error"`
	ETag                *string       `json:"etag"`
	LastModified        *string       `json:"last_modified"`
	ContentHash         *string       `json:"content_hash"`
	QueuedAt            *time.Time    `json:"queued_at"`
	QueuedJobID         *int64        `json:"queued_job_id"` // the River job queued for it, while queued
}

// NewSource is a source to add. A zero Interval means DefaultInterval.
type NewSource struct {
	Platform string        `json:"platform"`
	URL      string        `json:"url"`
	Interval time.Duration `json:"interval"`
}

// Validate checks the fields that can be checked without the database
// (Interval must already be defaulted).
func (s NewSource) Validate() error {
	if s.Platform == "" {
		return &FieldError{Field: "platform", Value: "", Reason: "is required"}
	}
	if !nameRE.MatchString(s.Platform) {
		return &FieldError{Field: "platform", Value: s.Platform, Reason: "must match " + NamePattern}
	}
	if err := ValidateURL(s.URL); err != nil {
		return err
	}
	if s.Interval < MinInterval || s.Interval > MaxInterval {
		return &FieldError{Field: "interval", Value: s.Interval.String(),
			Reason: fmt.Sprintf("must be in [%s, %s]", MinInterval, fmtHours(MaxInterval))}
	}
	return nil
}

// ValidateURL accepts absolute http and https URLs with a host and, if
// any, a port in [1, 65535]: at most MaxURLBytes bytes of valid UTF-8,
// without whitespace or control characters. The error's Value is the URL
// with its credentials redacted (RedactURL).
func ValidateURL(raw string) error {
	bad := func(reason string) error {
		return &FieldError{Field: "url", Value: RedactURL(raw), Reason: reason}
	}
	switch {
	case raw == "":
		return &FieldError{Field: "url", Value: raw, Reason: "is required"}
	case len(raw) > MaxURLBytes:
		return bad(fmt.Sprintf("must be at most %d bytes, got %d", MaxURLBytes, len(raw)))
	case !utf8.ValidString(raw):
		return bad("must be valid UTF-8")
	case strings.IndexFunc(raw, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return bad("must not contain whitespace or control characters")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("is not a valid URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return bad("must be an absolute http or https URL")
	}
	if u.Host == "" || u.Hostname() == "" {
		return bad("must have a host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad("must have a port in [1, 65535]")
		}
	}
	return nil
}

// redactedSecret replaces the credentials of a URL in RedactURL.
const redactedSecret = "xxxxx"

// RedactURL returns a source URL fit to print: a password in its user
// information is replaced by "xxxxx" (https://user:xxxxx@host/…), and so
// is a user name given alone (https://xxxxx@host/…), which is often a
// token. When the URL's '@' could be read more than one way (several, or
// one after the path begins in a URL that does not parse as an ordinary
// one), everything between "://" and the last '@' is replaced. Every human
// and JSON output of a source URL goes through it; a URL without user
// information comes back unchanged.
func RedactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || !strings.Contains(rest, "@") {
		return raw
	}
	maskAll := scheme + "://" + redactedSecret + "@" + rest[strings.LastIndex(rest, "@")+1:]
	userinfo, after, _ := strings.Cut(rest, "@")
	switch {
	case strings.Contains(after, "@"):
		return maskAll
	case strings.ContainsAny(userinfo, "/?#"):
		// The '@' is in the path, query or fragment: no user information
		// if the URL parses as one with a host and none (a profile URL such
		// as https://example.social/@name); otherwise a password with a '/'.
		if u, err := url.Parse(raw); err == nil && u.User == nil && u.Host != "" {
			return raw
		}
		return maskAll
	}
	if user, _, hasPassword := strings.Cut(userinfo, ":"); hasPassword {
		return scheme + "://" + user + ":" + redactedSecret + "@" + after
	}
	return scheme + "://" + redactedSecret + "@" + after
}

// AddSource adds one source. created is false when the platform already has a
// source with that URL (nothing changes then).
func AddSource(ctx context.Context, db DBTX, s NewSource) (id int64, created bool, err error) {
	if s.Interval == 0 {
		s.Interval = DefaultInterval
	}
	if err := s.Validate(); err != nil {
		return 0, false, fmt.Errorf("source: %w", err)
	}
	err = db.QueryRow(ctx, addSourceSQL, s.Platform, s.URL, s.Interval).Scan(&id, &created)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
			return 0, false, fmt.Errorf("source: %w", unknownPlatform(s.Platform))
		}
		return 0, false, fmt.Errorf("source: add: %w", err)
	}
	return id, created, nil
}

// DefaultListLimit is how many sources ListSources returns at most by
// default.
const DefaultListLimit = 1000

// ListFilter selects sources for ListSources.
type ListFilter struct {
	Platform string // "" means every platform
	DueOnly  bool   // only sources due now (not queued, enabled, platform not cooling down)
	Limit    int    // the most returned; 0 means DefaultListLimit
}

// Validate reports an invalid field, wrapping ErrInvalid.
func (f ListFilter) Validate() error {
	if f.Limit < 0 || f.Limit > MaxListLimit {
		return &FieldError{Field: "limit", Value: strconv.Itoa(f.Limit), Reason: fmt.Sprintf("must be in [1, %d] (0: default)", MaxListLimit)}
	}
	return nil
}

// ListSources returns sources in fair order (never checked first, then longest
// since checked, ties by id).
func ListSources(ctx context.Context, db DBTX, f ListFilter) ([]Source, error) {
	if err := f.Validate(); err != nil {
		return nil, fmt.Errorf("source: list: %w", err)
	}
	if f.Limit == 0 {
		f.Limit = DefaultListLimit
	}
	rows, err := db.Query(ctx, listSourcesSQL, f.Platform, f.DueOnly, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("source: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanSource)
	if err != nil {
		return nil, fmt.Errorf("source: list: %w", err)
	}
	return out, nil
}

// GetSource returns one source or an error wrapping ErrNotFound.
func GetSource(ctx context.Context, db DBTX, id int64) (Source, error) {
	rows, err := db.Query(ctx, getSourceSQL, id)
	if err != nil {
		return Source{}, fmt.Errorf("source: get: %w", err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSource)
	if errors.Is(err, pgx.ErrNoRows) {
		return Source{}, fmt.Errorf("source %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Source{}, fmt.Errorf("source: get: %w", err)
	}
	return s, nil
}

func scanSource(row pgx.CollectableRow) (Source, error) {
	var s Source
	err := row.Scan(&s.ID, &s.Platform, &s.URL, &s.Interval, &s.Enabled, &s.DueAt, &s.LastCheckedAt,
		&s.ConsecutiveFailures, &s.LastStatus, &s.LastOutcome, &s.LastError, &s.ETag, &s.LastModified,
		&s.ContentHash, &s.QueuedAt, &s.QueuedJobID)
	return s, err
}

// RemoveSources deletes the sources with the given ids, all or nothing: if any
// id does not exist, nothing is removed and the error names the missing ids.
func RemoveSources(ctx context.Context, db Beginner, ids []int64) (int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("source: remove: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	rows, err := tx.Query(ctx, removeSourcesSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("source: remove: %w", err)
	}
	removed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("source: remove: %w", err)
	}
	if len(removed) != len(uniqueIDs(ids)) {
		got := map[int64]bool{}
		for _, id := range removed {
			got[id] = true
		}
		var missing []string
		for _, id := range ids {
			if !got[id] {
				missing = append(missing, fmt.Sprint(id))
			}
		}
		return 0, fmt.Errorf("source: remove: %w", &FieldError{Field: "id", Value: strings.Join(missing, ","), Reason: "does not exist; nothing removed"})
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("source: remove: %w", err)
	}
	return len(removed), nil
}

func uniqueIDs(ids []int64) map[int64]bool {
	m := make(map[int64]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}
