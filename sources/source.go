package sources

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/redact"
)

// DefaultInterval is how often a source is checked when no interval is given.
const DefaultInterval = time.Hour

// Source is one thing fetched on a schedule.
type Source struct {
	ID                  int64          `json:"id"`
	Platform            string         `json:"platform"`
	Key                 string         `json:"key,omitempty"` // the platform may limit each key (an account, a token's name)
	URL                 string         `json:"url"`
	Interval            time.Duration  `json:"-"` // JSON: interval_s
	Enabled             bool           `json:"enabled"`
	DueAt               time.Time      `json:"due_at"`
	LastCheckedAt       *time.Time     `json:"last_checked_at"`
	ConsecutiveFailures int            `json:"consecutive_failures"`
	LastStatus          *int           `json:"last_status"`
	LastOutcome         *fetch.Outcome `json:"last_outcome"`
	LastError           *string        `json:"last_error"`
	ETag                *string        `json:"etag"`
	LastModified        *string        `json:"last_modified"`
	ContentHash         *string        `json:"content_hash"`
	QueuedAt            *time.Time     `json:"queued_at"`
	QueuedJobID         *int64         `json:"queued_job_id"` // the River job queued for it, while queued
}

// NewSource is a source to add. A zero Interval means DefaultInterval.
type NewSource struct {
	Platform string        `json:"platform"`
	URL      string        `json:"url"`
	Interval time.Duration `json:"interval"`
	// Key is what the platform may limit separately (an account, a token's
	// name, a tenant — never a secret): at most pacer.MaxKeyLen bytes of
	// UTF-8 without NUL; "" for none.
	Key string `json:"key,omitempty"`
}

// Validate checks the fields that can be checked without the database
// (Interval must already be defaulted).
func (s NewSource) Validate() error {
	if s.Platform == "" {
		return &FieldError{Field: "platform", Value: "", Reason: "is required"}
	}
	if !nameRE.MatchString(s.Platform) {
		return &FieldError{Field: "platform", Value: s.Platform, Reason: nameRule}
	}
	if err := ValidateURL(s.URL); err != nil {
		return err
	}
	if err := ValidateInterval(s.Interval); err != nil {
		return err
	}
	return ValidateKey(s.Key)
}

// ValidateInterval accepts an interval between two checks of a source in
// [MinInterval, MaxInterval]. The error is a FieldError on interval.
func ValidateInterval(d time.Duration) *FieldError {
	if d < MinInterval || d > MaxInterval {
		return &FieldError{Field: "interval", Value: d.String(),
			Reason: fmt.Sprintf("must be in [%s, %s]", MinInterval, fmtHours(MaxInterval))}
	}
	return nil
}

// ValidateKey accepts a source's key: "" (none), or at most MaxKeyBytes
// bytes of valid UTF-8 without NUL (PostgreSQL's text cannot hold one).
// The error is a FieldError on key.
func ValidateKey(key string) error {
	switch {
	case len(key) > MaxKeyBytes:
		return &FieldError{Field: "key", Value: key, Reason: fmt.Sprintf("must be at most %d bytes, got %d", MaxKeyBytes, len(key))}
	case !utf8.ValidString(key):
		return &FieldError{Field: "key", Value: strings.ToValidUTF8(key, "\ufffd"), Reason: "must be valid UTF-8"}
	case strings.IndexByte(key, 0) >= 0:
		return &FieldError{Field: "key", Value: strings.ReplaceAll(key, "\x00", "\\0"), Reason: "must not contain NUL"}
	}
	return nil
}

// ValidateURL accepts absolute http and https URLs with a host and, if
// any, a port in [1, 65535]: at most MaxURLBytes bytes of valid UTF-8,
// without whitespace or control characters. The error's Value is the URL
// with its secrets redacted (redact.URL).
func ValidateURL(raw string) error {
	bad := func(reason string) error {
		return &FieldError{Field: "url", Value: redact.URL(raw), Reason: reason}
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

// AddSource adds one source. created is false when the platform already has a
// source with that URL (nothing changes then, its key included).
func AddSource(ctx context.Context, db DBTX, s NewSource) (id int64, created bool, err error) {
	if s.Interval == 0 {
		s.Interval = DefaultInterval
	}
	if err := s.Validate(); err != nil {
		return 0, false, fmt.Errorf("source: %w", err)
	}
	err = db.QueryRow(ctx, addSourceSQL, s.Platform, s.URL, s.Interval, s.Key).Scan(&id, &created)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
			return 0, false, fmt.Errorf("source: %w", UnknownPlatform(s.Platform))
		}
		return 0, false, fmt.Errorf("source: add: %w", err)
	}
	return id, created, nil
}

// AddSources adds many sources in tx (a temporary table filled by COPY,
// then one INSERT), each valid already (NewSource.Validate, Interval
// defaulted) and on a platform that exists; the caller checks both first
// (package sourcefile does, reporting each bad line). Sources already
// present (same platform and URL) are left unchanged, their key too. It
// returns how many were added.
func AddSources(ctx context.Context, tx pgx.Tx, ss []NewSource) (added int, err error) {
	if _, err := tx.Exec(ctx, addSourcesTempTableSQL); err != nil {
		return 0, fmt.Errorf("source: add: %w", err)
	}
	_, err = tx.CopyFrom(ctx, pgx.Identifier{"fleetpace_import"}, []string{"platform", "url", "check_interval", "key"},
		pgx.CopyFromSlice(len(ss), func(i int) ([]any, error) {
			return []any{ss[i].Platform, ss[i].URL, ss[i].Interval, ss[i].Key}, nil
		}))
	if err != nil {
		return 0, fmt.Errorf("source: add: copy: %w", err)
	}
	tag, err := tx.Exec(ctx, addSourcesInsertSQL)
	if err != nil {
		return 0, fmt.Errorf("source: add: insert: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// DefaultListLimit is how many sources ListSources returns at most by
// default.
const DefaultListLimit = 1000

// ListFilter selects sources for ListSources. The zero value selects every
// source (up to DefaultListLimit).
type ListFilter struct {
	Platform string // "" means every platform
	DueOnly  bool   // only sources due now (enabled, not queued, platform neither cooling down nor paused)
	Limit    int    // the most returned; 0 means DefaultListLimit
	// MinFailures keeps only sources that failed at least this many times
	// in a row (0: no filter).
	MinFailures int
	// Outcome keeps only sources whose last outcome is this one of
	// fetch.Outcomes ("": no filter).
	Outcome fetch.Outcome
	// Key keeps only sources of this key (nil: no filter; "" the sources
	// without a key).
	Key *string
}

// outcomeNames lists fetch.Outcomes for an error message.
func outcomeNames() string {
	names := make([]string, len(fetch.Outcomes))
	for i, o := range fetch.Outcomes {
		names[i] = string(o)
	}
	return strings.Join(names, ", ")
}

// Validate reports an invalid field, wrapping ErrInvalid.
func (f ListFilter) Validate() error {
	switch {
	case f.Limit < 0 || f.Limit > MaxListLimit:
		return &FieldError{Field: "limit", Value: strconv.Itoa(f.Limit), Reason: fmt.Sprintf("must be in [1, %d] (0: default)", MaxListLimit)}
	case f.MinFailures < 0 || f.MinFailures > MaxFailures:
		return &FieldError{Field: "min_failures", Value: strconv.Itoa(f.MinFailures), Reason: fmt.Sprintf("must be in [0, %d]", MaxFailures)}
	case f.Outcome != "" && !f.Outcome.Valid():
		return &FieldError{Field: "outcome", Value: string(f.Outcome), Reason: "must be one of " + outcomeNames()}
	case f.Platform != "" && !nameRE.MatchString(f.Platform):
		return &FieldError{Field: "platform", Value: f.Platform, Reason: nameRule}
	}
	if f.Key != nil {
		return ValidateKey(*f.Key)
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
	out, err := queryRows(ctx, db, scanSource, listSourcesSQL, f.Platform, f.DueOnly, f.Limit, f.MinFailures, f.Outcome, f.Key)
	if err != nil {
		return nil, fmt.Errorf("source: list: %w", err)
	}
	if len(out) == 0 && f.Platform != "" {
		// Nothing listed: say so if the platform itself does not exist.
		if _, err := GetPlatform(ctx, db, f.Platform); errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("source: list: %w", UnknownPlatform(f.Platform))
		} else if err != nil {
			return nil, fmt.Errorf("source: list: %w", err)
		}
	}
	return out, nil
}

// GetSource returns one source or an error wrapping ErrNotFound.
func GetSource(ctx context.Context, db DBTX, id int64) (Source, error) {
	s, err := queryRow(ctx, db, scanSource, getSourceSQL, id)
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
		&s.ContentHash, &s.QueuedAt, &s.QueuedJobID, &s.Key)
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
	removed, err := queryRows(ctx, tx, pgx.RowTo[int64], removeSourcesSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("source: remove: %w", err)
	}
	if len(removed) != len(uniqueIDs(ids)) {
		return 0, fmt.Errorf("source: remove: %w", missingIDs(ids, removed, "nothing removed"))
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

// ErrAmbiguous is wrapped when a URL names sources of several platforms
// (an ErrInvalid too: the caller should give an id).
var ErrAmbiguous = errors.New("ambiguous")

// Lookup finds one source by reference: its id (digits) or its URL. A URL
// added on several platforms is an error wrapping ErrAmbiguous and naming
// their ids; an unknown one wraps ErrNotFound.
func Lookup(ctx context.Context, db DBTX, ref string) (Source, error) {
	if id, err := strconv.ParseInt(ref, 10, 64); err == nil {
		if id <= 0 {
			return Source{}, fmt.Errorf("source: %w", &FieldError{Field: "id", Value: ref, Reason: "must be a positive integer"})
		}
		return GetSource(ctx, db, id)
	}
	if err := ValidateURL(ref); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			fe.Field, fe.Reason = "id", "is neither an id nor a source's URL: the URL "+fe.Reason
		}
		return Source{}, fmt.Errorf("source: %w", err)
	}
	found, err := queryRows(ctx, db, scanSource, sourcesByURLSQL, ref)
	if err != nil {
		return Source{}, fmt.Errorf("source: lookup: %w", err)
	}
	switch len(found) {
	case 0:
		return Source{}, fmt.Errorf("source %s: %w", redact.URL(ref), ErrNotFound)
	case 1:
		return found[0], nil
	}
	ids := make([]string, len(found))
	for i, s := range found {
		ids[i] = fmt.Sprintf("%d (%s)", s.ID, s.Platform)
	}
	return Source{}, fmt.Errorf("source: %w", &FieldError{Field: "id", Value: redact.URL(ref),
		Reason: "is the URL of several sources: " + strings.Join(ids, ", ") + "; give the id", Err: ErrAmbiguous})
}

// SourceUpdate is a change to a source: nil fields stay as they are.
type SourceUpdate struct {
	// Interval is how often to check the source (> 0). The next check of a
	// source that is not failing moves to its last check + Interval.
	Interval *time.Duration
	// Enabled: false stops queueing the source (a job already queued still
	// runs); true queues it again when due.
	Enabled *bool
}

// Validate reports an invalid field, wrapping ErrInvalid.
func (u SourceUpdate) Validate() error {
	switch {
	case u.Interval == nil && u.Enabled == nil:
		return &FieldError{Field: "interval", Value: "", Reason: "or enabled must be given: nothing to change"}
	case u.Interval != nil && (*u.Interval < MinInterval || *u.Interval > MaxInterval):
		return &FieldError{Field: "interval", Value: u.Interval.String(), Reason: fmt.Sprintf("must be in [%s, %s]", MinInterval, fmtHours(MaxInterval))}
	}
	return nil
}

// UpdateSource changes a source's settings and returns it as saved. An
// unknown id wraps ErrNotFound; invalid input writes nothing.
func UpdateSource(ctx context.Context, db DBTX, id int64, u SourceUpdate) (Source, error) {
	if err := u.Validate(); err != nil {
		return Source{}, fmt.Errorf("source %d: %w", id, err)
	}
	s, err := queryRow(ctx, db, scanSource, updateSourceSQL, id, u.Interval, u.Enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return Source{}, fmt.Errorf("source %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Source{}, fmt.Errorf("source %d: update: %w", id, err)
	}
	return s, nil
}

// Selection selects sources for SetEnabled and UpdateSources: by ids, or by platform and/or
// by failures. At least one field must be set; IDs excludes the others.
type Selection struct {
	IDs         []int64 // these sources (all must exist)
	Platform    string  // every source of this platform
	MinFailures int     // sources that failed at least this many times in a row (0: no filter)
}

// Validate reports an invalid field, wrapping ErrInvalid.
func (sel Selection) Validate() error {
	switch {
	case len(sel.IDs) == 0 && sel.Platform == "" && sel.MinFailures == 0:
		return &FieldError{Field: "id", Value: "", Reason: "or platform or min_failures must be given"}
	case len(sel.IDs) > 0 && (sel.Platform != "" || sel.MinFailures != 0):
		return &FieldError{Field: "id", Value: fmt.Sprint(sel.IDs), Reason: "excludes platform and min_failures"}
	case sel.MinFailures < 0 || sel.MinFailures > MaxFailures:
		return &FieldError{Field: "min_failures", Value: strconv.Itoa(sel.MinFailures), Reason: fmt.Sprintf("must be in [0, %d]", MaxFailures)}
	case sel.Platform != "" && !nameRE.MatchString(sel.Platform):
		return &FieldError{Field: "platform", Value: sel.Platform, Reason: nameRule}
	}
	for _, id := range sel.IDs {
		if id <= 0 {
			return &FieldError{Field: "id", Value: strconv.FormatInt(id, 10), Reason: "must be a positive integer"}
		}
	}
	return nil
}

// SetEnabled enables or disables the selected sources, all or nothing: an
// unknown id or platform changes nothing and is an error wrapping
// ErrInvalid. It returns the ids of the selected sources, in id order
// (sources already in that state included).
func SetEnabled(ctx context.Context, db Beginner, sel Selection, enabled bool) ([]int64, error) {
	what := map[bool]string{true: "enable", false: "disable"}[enabled]
	return updateSelected(ctx, db, sel, what, setEnabledSQL, enabled)
}

// UpdateSources changes the settings of the selected sources (SourceUpdate:
// their interval, whether they are enabled), all or nothing: invalid input,
// an unknown id or platform changes nothing and is an error wrapping
// ErrInvalid. A new interval moves the next check of each source that is
// not failing to its last check plus the interval, as UpdateSource does.
// It returns the ids of the selected sources, in id order.
func UpdateSources(ctx context.Context, db Beginner, sel Selection, u SourceUpdate) ([]int64, error) {
	if err := u.Validate(); err != nil {
		return nil, fmt.Errorf("source: update: %w", err)
	}
	return updateSelected(ctx, db, sel, "update", updateSourcesSQL, u.Interval, u.Enabled)
}

// updateSelected runs sql, whose $1…$3 select sources as a Selection does
// (ids, platform, failures) and whose further parameters are args, in one
// transaction, all or nothing, and returns the ids it selected.
func updateSelected(ctx context.Context, db Beginner, sel Selection, what, sql string, args ...any) ([]int64, error) {
	if err := sel.Validate(); err != nil {
		return nil, fmt.Errorf("source: %s: %w", what, err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("source: %s: %w", what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if sel.Platform != "" {
		if _, err := GetPlatform(ctx, tx, sel.Platform); errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("source: %s: %w", what, UnknownPlatform(sel.Platform))
		} else if err != nil {
			return nil, fmt.Errorf("source: %s: %w", what, err)
		}
	}
	var ids []int64
	if len(sel.IDs) > 0 {
		ids = sel.IDs
	}
	got, err := queryRows(ctx, tx, pgx.RowTo[int64], sql, append([]any{ids, sel.Platform, sel.MinFailures}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("source: %s: %w", what, err)
	}
	if len(sel.IDs) > 0 && len(got) != len(uniqueIDs(sel.IDs)) {
		return nil, fmt.Errorf("source: %s: %w", what, missingIDs(sel.IDs, got, "nothing changed"))
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("source: %s: %w", what, err)
	}
	slices.Sort(got)
	return got, nil
}

// QueuedJobs returns the ids of the fetch jobs the given sources are
// queued for (sources not queued have none).
func QueuedJobs(ctx context.Context, db DBTX, ids []int64) ([]int64, error) {
	jobs, err := queryRows(ctx, db, pgx.RowTo[int64], queuedJobsSQL, ids)
	if err != nil {
		return nil, fmt.Errorf("source: queued jobs: %w", err)
	}
	return jobs, nil
}

// CountDisabled counts the disabled sources among ids.
func CountDisabled(ctx context.Context, db DBTX, ids []int64) (int, error) {
	var n int
	if err := db.QueryRow(ctx, countDisabledSQL, ids).Scan(&n); err != nil {
		return 0, fmt.Errorf("source: count disabled: %w", err)
	}
	return n, nil
}

// RequireSources returns nil when every id of ids names a source, else the
// error naming those that do not (a *FieldError wrapping ErrNotFound and
// ErrInvalid), whose reason ends with consequence ("nothing queued"): an
// operation on sources by id is all or nothing.
func RequireSources(ctx context.Context, db DBTX, ids []int64, consequence string) error {
	existing, err := queryRows(ctx, db, pgx.RowTo[int64], existingSourceIDsSQL, ids)
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if len(existing) != len(uniqueIDs(ids)) {
		return missingIDs(ids, existing, consequence)
	}
	return nil
}

// missingIDs is the error naming the ids of want not in got (each once).
func missingIDs(want, got []int64, consequence string) error {
	have := make(map[int64]bool, len(got))
	for _, id := range got {
		have[id] = true
	}
	var missing []string
	for _, id := range want {
		if !have[id] {
			missing = append(missing, fmt.Sprint(id))
			have[id] = true
		}
	}
	return &FieldError{Field: "id", Value: strings.Join(missing, ","), Reason: "does not exist; " + consequence, Err: ErrNotFound}
}
