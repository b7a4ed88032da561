package sources_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/sources"
)

// One row the database refuses does not cost the other rows of the batch
// their checks: the batch is written again row by row, and the refused row
// is recorded as a failed check that says why (so its source backs off
// instead of being fetched again at once). The single statement alone — as
// in a transaction, where there is no second pass — fails every row.
func TestRecordChecksRefusedRow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "p", 10)
	storetest.RefuseETag(t, f.pool)
	var ids []int64
	for _, u := range []string{"a", "b", "c", "d"} {
		ids = append(ids, f.source(t, "p", "https://p.example/"+u, nil))
	}
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
	f := setup(t)
	f.platform(t, "p", 10)
	storetest.RefuseETag(t, f.pool)
	storetest.BreakHistory(t, f.pool)
	var ids []int64
	for _, u := range []string{"a", "b", "c", "d", "e"} {
		ids = append(ids, f.source(t, "p", "https://p.example/"+u, nil))
	}
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
	f := setup(t)
	f.platform(t, "p", 10)
	a := f.source(t, "p", "https://p.example/a", nil)
	b := f.source(t, "p", "https://p.example/b", nil)
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
