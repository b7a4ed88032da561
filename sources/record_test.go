package sources_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/sources"
)

// sourceState is a source's state before a check is recorded.
type sourceState struct {
	name string
	sql  string // UPDATE … WHERE id = $1; $2 is a fixed point in time
}

var recordStates = []sourceState{
	{"never checked", `UPDATE fleetpace_source SET due_at = $2::timestamptz, queued_at = $2::timestamptz, queued_job_id = 7 WHERE id = $1`},
	{"checked with validators", `UPDATE fleetpace_source SET last_checked_at = $2::timestamptz - interval '1 hour',
		due_at = $2::timestamptz - interval '1 second', consecutive_failures = 2, last_status = 500, last_outcome = 'failed',
		last_error = 'boom', etag = '"old"', last_modified = 'Mon, 01 Jan 2024 00:00:00 GMT', content_hash = 'h-old',
		queued_at = $2::timestamptz, queued_job_id = 7 WHERE id = $1`},
	{"failures at cap", `UPDATE fleetpace_source SET last_checked_at = $2::timestamptz - interval '1 hour', due_at = $2::timestamptz,
		consecutive_failures = 30, etag = '"old"', content_hash = 'h-old', queued_at = $2::timestamptz, queued_job_id = 7 WHERE id = $1`},
	{"long interval", `UPDATE fleetpace_source SET check_interval = interval '2 days', due_at = $2::timestamptz,
		last_checked_at = $2::timestamptz - interval '1 hour', consecutive_failures = 3, queued_at = $2::timestamptz, queued_job_id = 7 WHERE id = $1`},
}

var recordChecks = []struct {
	name  string
	check sources.Check
}{
	{"ok with validators", sources.Check{Outcome: "ok", Status: 200, ETag: `"v2"`, LastModified: "Tue, 02 Jan 2024 00:00:00 GMT", ContentHash: "h-new"}},
	{"ok bare", sources.Check{Outcome: "ok", Status: 200}},
	{"not_modified", sources.Check{Outcome: "not_modified", Status: 304, ETag: `"ignored"`, ContentHash: "h-ignored"}},
	{"failed", sources.Check{Outcome: "failed", Status: 500, Error: "HTTP 500"}},
	{"failed without status", sources.Check{Outcome: "failed", Error: "dial: connection refused"}},
	{"rate_pressure", sources.Check{Outcome: "rate_pressure", Status: 429}},
	{"rate_limited", sources.Check{Outcome: "rate_limited", Status: 503, Error: "told to stop"}},
}

// rowJSON is a source's row without its identity (id, url, created_at).
func rowJSON(t *testing.T, ctx context.Context, db sources.DBTX, id int64) string {
	t.Helper()
	var s string
	err := db.QueryRow(ctx, `SELECT (to_jsonb(s) - 'id' - 'url' - 'created_at')::text FROM fleetpace_source s WHERE id = $1`, id).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Every outcome from every starting state: a source updated by RecordCheck
// and its twin updated in one RecordChecks batch (with all the other cases)
// end up with identical rows. Both run in one transaction, so now() is the
// same for both.
func TestRecordChecksMatchesRecordCheck(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	type pair struct {
		name   string
		single int64
		batch  int64
		check  sources.Check
	}
	var pairs []pair
	t0 := time.Now().Add(-time.Minute)
	for _, st := range recordStates {
		for _, c := range recordChecks {
			p := pair{name: st.name + " / " + c.name, check: c.check}
			p.single = f.source(t, "p", fmt.Sprintf("https://p.example/%d/single", len(pairs)), nil)
			p.batch = f.source(t, "p", fmt.Sprintf("https://p.example/%d/batch", len(pairs)), nil)
			mustExec(t, f, st.sql, p.single, t0)
			mustExec(t, f, st.sql, p.batch, t0)
			if a, b := rowJSON(t, f.ctx, f.pool, p.single), rowJSON(t, f.ctx, f.pool, p.batch); a != b {
				t.Fatalf("%s: twins differ before the check:\n%s\n%s", p.name, a, b)
			}
			pairs = append(pairs, p)
		}
	}

	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx) //nolint:errcheck // test cleanup
	var batch []sources.CheckRecord
	for _, p := range pairs {
		if err := sources.RecordCheck(f.ctx, tx, p.single, p.check); err != nil {
			t.Fatal(err)
		}
		batch = append(batch, sources.CheckRecord{SourceID: p.batch, Check: p.check})
	}
	if err := sources.RecordChecks(f.ctx, tx, batch); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]bool{}
	for _, p := range pairs {
		a, b := rowJSON(t, f.ctx, tx, p.single), rowJSON(t, f.ctx, tx, p.batch)
		if a != b {
			t.Errorf("%s:\nRecordCheck:  %s\nRecordChecks: %s", p.name, a, b)
		}
		outcomes[p.check.Outcome] = true
	}
	if len(outcomes) != 5 {
		t.Fatalf("covered outcomes %v, want all five", outcomes)
	}
	// The comparison means something only if the checks changed the rows.
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	s, err := sources.GetSource(f.ctx, f.pool, pairs[0].batch)
	if err != nil {
		t.Fatal(err)
	}
	if s.QueuedAt != nil || s.QueuedJobID != nil || s.LastOutcome == nil || *s.LastOutcome != "ok" || s.ETag == nil || *s.ETag != `"v2"` {
		t.Fatalf("batch row not updated: %+v", s)
	}
}

// A source given twice in one batch gets its last check; the caller's slice
// is left as it was; an empty batch is a no-op.
func TestRecordChecksLastWins(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	ids := f.sources(t, "a", "b")
	a, b := ids[0], ids[1]
	recs := []sources.CheckRecord{
		{SourceID: a, Check: sources.Check{Outcome: "failed", Status: 500, Error: "first"}},
		{SourceID: b, Check: sources.Check{Outcome: "failed", Status: 502, Error: "only"}},
		{SourceID: a, Check: sources.Check{Outcome: "ok", Status: 200, ETag: `"last"`}},
	}
	orig := slices.Clone(recs)
	if err := sources.RecordChecks(f.ctx, f.pool, recs); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(recs, orig) {
		t.Fatalf("RecordChecks modified its input: %+v", recs)
	}
	sa, err := sources.GetSource(f.ctx, f.pool, a)
	if err != nil {
		t.Fatal(err)
	}
	if *sa.LastOutcome != "ok" || *sa.LastStatus != 200 || sa.ETag == nil || *sa.ETag != `"last"` ||
		sa.LastError != nil || sa.ConsecutiveFailures != 0 {
		t.Fatalf("source a: want its last check (ok, \"last\"), got %+v", sa)
	}
	sb, err := sources.GetSource(f.ctx, f.pool, b)
	if err != nil {
		t.Fatal(err)
	}
	if *sb.LastOutcome != "failed" || *sb.LastError != "only" || sb.ConsecutiveFailures != 1 {
		t.Fatalf("source b: %+v", sb)
	}
	if err := sources.RecordChecks(f.ctx, f.pool, nil); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
}

// A check of a job that no longer holds its source's queue mark (the source
// was released and queued again for another job) is not written, alone or
// in a batch; the job that holds it, an unmarked source, and an unknown job
// (0) are.
func TestRecordCheckOnlyByTheQueuedJob(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ids := storetest.Queued(t, f.pool, "p", 8) // queued, queued_job_id = id
	storetest.Exec(t, f.pool, `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL WHERE id = $1 OR id = $2`, ids[2], ids[6])
	ok := sources.Check{Outcome: "ok", Status: 200}
	with := func(job int64) sources.Check { c := ok; c.JobID = job; return c }
	// One at a time (RecordCheck's statement).
	for i, c := range []sources.Check{with(ids[0]), with(ids[1] + 1000), with(999), ok} {
		if err := sources.RecordCheck(f.ctx, f.pool, ids[i], c); err != nil {
			t.Fatal(err)
		}
	}
	// In one batch (RecordChecks' statement).
	if err := sources.RecordChecks(f.ctx, f.pool, []sources.CheckRecord{
		{SourceID: ids[4], Check: with(ids[4])}, {SourceID: ids[5], Check: with(ids[5] + 1000)},
		{SourceID: ids[6], Check: with(999)}, {SourceID: ids[7], Check: ok},
	}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, true, true, true, false, true, true} {
		if got := storetest.Checked(t, f.pool, ids[i:i+1]) == 1; got != want {
			t.Errorf("source %d: written %v, want %v", i, got, want)
		}
	}
}

// One row the database refuses does not cost the other rows of the batch
// their checks: the batch is written again row by row, and the refused row
// is recorded as a failed check that says why (so its source backs off
// instead of being fetched again at once). The single statement alone — as
// in a transaction, where there is no second pass — fails every row.
func TestRecordChecksRefusedRow(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	storetest.RefuseETag(t, f.pool)
	ids := f.sources(t, "a", "b", "c", "d")
	mustExec(t, f, `UPDATE fleetpace_source SET queued_at = now(), queued_job_id = 7`)
	batch := []sources.CheckRecord{
		{SourceID: ids[0], Check: sources.Check{Outcome: "ok", Status: 200, ETag: `"fine"`, JobID: 7}},
		{SourceID: ids[1], Check: sources.Check{Outcome: "ok", Status: 200, ETag: `"boom"`, JobID: 7}},
		{SourceID: ids[2], Check: sources.Check{Outcome: "failed", Status: 500, Error: "HTTP 500", JobID: 7}},
		{SourceID: ids[3], Check: sources.Check{Outcome: "not_modified", Status: 304, JobID: 7}},
	}

	// The naive way: one statement, one bad row, every check lost.
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sources.RecordChecks(f.ctx, tx, batch); err == nil || !strings.Contains(err.Error(), "hostile row") {
		t.Fatalf("the batch in a transaction: %v, want the trigger's exception", err)
	}
	_ = tx.Rollback(f.ctx)

	err = sources.RecordChecks(f.ctx, f.pool, batch)
	var rce *sources.RefusedChecksError
	if !errors.As(err, &rce) || !errors.Is(err, sources.ErrCheckRefused) || len(rce.Checks) != 1 ||
		rce.Checks[0].SourceID != ids[1] || rce.Checks[0].Lost {
		t.Fatalf("RecordChecks = %v, want exactly source %d refused and recorded as failed", err, ids[1])
	}
	want := []struct {
		outcome  fetch.Outcome
		failures int
		errPart  string
	}{{"ok", 0, ""}, {"failed", 1, "hostile row"}, {"failed", 1, "HTTP 500"}, {"not_modified", 0, ""}}
	for i, id := range ids {
		s, err := sources.GetSource(f.ctx, f.pool, id)
		if err != nil {
			t.Fatal(err)
		}
		w := want[i]
		if s.LastOutcome == nil || *s.LastOutcome != w.outcome || s.ConsecutiveFailures != w.failures || s.QueuedAt != nil ||
			(w.errPart != "" && (s.LastError == nil || !strings.Contains(*s.LastError, w.errPart))) {
			t.Errorf("source %d: outcome %v, failures %d, error %v, queued %v; want %+v", id, deref(s.LastOutcome),
				s.ConsecutiveFailures, deref(s.LastError), s.QueuedAt != nil, w)
		}
	}
	// The refused source backs off like any failure: not due before its
	// interval (1 minute) times two.
	s, _ := sources.GetSource(f.ctx, f.pool, ids[1])
	if until := time.Until(s.DueAt); until < time.Minute {
		t.Errorf("refused source due again in %s, want after its backoff", until)
	}
}

// With the history broken too, a refused row is still recorded as a failed
// check and the others are written, each once, without history: the error
// says both. A batch whose history alone is refused is written once
// without it, never again row by row (its failures would count twice).
func TestRecordChecksRefusedRowWithoutHistory(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	storetest.RefuseETag(t, f.pool)
	storetest.BreakHistory(t, f.pool)
	ids := f.sources(t, "a", "b", "c", "d", "e")
	err := sources.RecordChecks(f.ctx, f.pool, []sources.CheckRecord{
		{SourceID: ids[0], Check: sources.Check{Outcome: "ok", Status: 200, ETag: `"fine"`}},
		{SourceID: ids[1], Check: sources.Check{Outcome: "ok", Status: 200, ETag: `"boom"`}},
		{SourceID: ids[2], Check: sources.Check{Outcome: "failed", Status: 500, Error: "HTTP 500"}},
	})
	var rce *sources.RefusedChecksError
	if !errors.As(err, &rce) || len(rce.Checks) != 1 || rce.Checks[0].SourceID != ids[1] || rce.Checks[0].Lost ||
		!errors.Is(err, sources.ErrCheckRefused) || !errors.Is(err, sources.ErrHistoryNotRecorded) {
		t.Fatalf("RecordChecks = %v, want source %d refused and recorded as failed, and the history not recorded", err, ids[1])
	}
	err = sources.RecordChecks(f.ctx, f.pool, []sources.CheckRecord{
		{SourceID: ids[3], Check: sources.Check{Outcome: "failed", Status: 500, Error: "HTTP 500"}},
		{SourceID: ids[4], Check: sources.Check{Outcome: "failed", Status: 502, Error: "HTTP 502"}},
	})
	if !errors.Is(err, sources.ErrHistoryNotRecorded) || errors.Is(err, sources.ErrCheckRefused) {
		t.Fatalf("RecordChecks with the history alone refused = %v, want ErrHistoryNotRecorded only", err)
	}
	want := []struct {
		outcome  fetch.Outcome
		failures int
	}{{"ok", 0}, {"failed", 1}, {"failed", 1}, {"failed", 1}, {"failed", 1}}
	for i, id := range ids {
		s, err := sources.GetSource(f.ctx, f.pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.LastOutcome == nil || *s.LastOutcome != want[i].outcome || s.ConsecutiveFailures != want[i].failures {
			t.Errorf("source %d: outcome %v, failures %d; want %+v", id, deref(s.LastOutcome), s.ConsecutiveFailures, want[i])
		}
		if n := storetest.HistoryRows(t, f.pool, id); n != 0 {
			t.Errorf("source %d: %d history rows with a broken history table", id, n)
		}
	}
}

// Text PostgreSQL cannot store (bytes that are not UTF-8, NUL) never
// reaches it: it is replaced, and the check is recorded.
func TestRecordCheckCleansText(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	ids := f.sources(t, "a", "b")
	a, b := ids[0], ids[1]
	err := sources.RecordChecks(f.ctx, f.pool, []sources.CheckRecord{
		{SourceID: a, Check: sources.Check{Outcome: "ok", ETag: "\"\xff\xfe\"", LastModified: "Mon\x00day"}},
		{SourceID: b, Check: sources.Check{Outcome: "failed", Error: strings.Repeat("\xff", 5000)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	sa, _ := sources.GetSource(f.ctx, f.pool, a)
	sb, _ := sources.GetSource(f.ctx, f.pool, b)
	if sa.ETag == nil || *sa.ETag != "\"\uFFFD\"" || sa.LastModified == nil || *sa.LastModified != "Mon\uFFFDday" {
		t.Errorf("validators stored as %q, %q", deref(sa.ETag), deref(sa.LastModified))
	}
	if sb.LastError == nil || len(*sb.LastError) > sources.MaxCheckError+len("…") {
		t.Errorf("error of %d bytes stored", len(deref(sb.LastError)))
	}
}

func deref[S ~string](p *S) string {
	if p == nil {
		return "<nil>"
	}
	return string(*p)
}
