package sources_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/sources"
)

// Three checks with different outcomes are kept in the history, newest
// first, with their status, reason, duration, size and worker; rate
// limiting, which is not a check of the source, is there too.
func TestHistoryKeepsEveryCheck(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	id := f.source(t, "p", "https://p.example/h", nil)
	checks := []sources.Check{
		{Outcome: "ok", Status: 200, Duration: 120 * time.Millisecond, Bytes: 5000, Worker: "w1"},
		{Outcome: "failed", Status: 404, Error: "HTTP 404 Not Found", Duration: 30 * time.Millisecond, Worker: "w2"},
		{Outcome: "rate_limited", Status: 429, Error: "Retry-After 600 s", Worker: "w1"},
	}
	for _, c := range checks {
		if err := sources.RecordCheck(f.ctx, f.pool, id, c); err != nil {
			t.Fatal(err)
		}
	}
	// A batch writes history rows too.
	other := f.source(t, "p", "https://p.example/other", nil)
	if err := sources.RecordChecks(f.ctx, f.pool, []sources.CheckRecord{
		{SourceID: other, Check: sources.Check{Outcome: "not_modified", Status: 304, Worker: "w3"}},
		{SourceID: id, Check: sources.Check{Outcome: "ok", Status: 200, Bytes: 7, Worker: "w3"}},
	}); err != nil {
		t.Fatal(err)
	}
	h, err := sources.History(f.ctx, f.pool, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		outcome        fetch.Outcome
		reason, worker string
		status         int
		bytes          int64
	}{
		{"ok", "", "w3", 200, 7},
		{"rate_limited", "Retry-After 600 s", "w1", 429, 0},
		{"failed", "HTTP 404 Not Found", "w2", 404, 0},
		{"ok", "", "w1", 200, 5000},
	}
	if len(h) != len(want) {
		t.Fatalf("history has %d entries, want %d: %+v", len(h), len(want), h)
	}
	for i, w := range want {
		e := h[i]
		if e.Outcome != w.outcome || e.Reason != w.reason || e.Worker != w.worker || e.Status != w.status || e.Bytes != w.bytes {
			t.Errorf("entry %d = %+v, want %+v", i, e, w)
		}
		if i > 0 && e.CheckedAt.After(h[i-1].CheckedAt) {
			t.Errorf("entry %d is newer than entry %d: not newest first", i, i-1)
		}
	}
	if d := h[3].Duration; d < 119*time.Millisecond || d > 121*time.Millisecond {
		t.Errorf("duration = %s, want 120ms", d)
	}
	if h, err := sources.History(f.ctx, f.pool, id, 2); err != nil || len(h) != 2 || h[0].Outcome != "ok" || h[1].Outcome != "rate_limited" {
		t.Fatalf("History limit 2 = %+v, %v; want the 2 newest", h, err)
	}
	if n := storetest.HistoryRows(t, f.pool, other); n != 1 {
		t.Fatalf("the batch's other source has %d history rows, want 1", n)
	}
	// JSON: the duration is in seconds under duration_s.
	b, _ := json.Marshal(h[0])
	if !strings.Contains(string(b), `"duration_s":`) || strings.Contains(string(b), `"duration":`) {
		t.Fatalf("JSON %s: want duration_s", b)
	}
}

// A check that is not written (its job no longer holds the source) has no
// history row either.
func TestHistoryOnlyOfWrittenChecks(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	id := f.source(t, "p", "https://p.example/1", nil)
	mustExec(t, f, `UPDATE fleetpace_source SET queued_at = now(), queued_job_id = 8 WHERE id = $1`, id)
	if err := sources.RecordCheck(f.ctx, f.pool, id, sources.Check{Outcome: "ok", JobID: 7}); err != nil {
		t.Fatal(err)
	}
	if n := storetest.HistoryRows(t, f.pool, id); n != 0 {
		t.Fatalf("a check not written left %d history rows", n)
	}
}

// A history write that fails never loses the check: RecordCheck and
// RecordChecks write the check without its history and say so
// (ErrHistoryNotRecorded), in a transaction too (which stays usable). (The
// Recorder's side: recorder.TestRecorderHistoryFailure.)
func TestHistoryFailureKeepsTheCheck(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	storetest.BreakHistory(t, f.pool)
	ids := f.sources(t, "1", "2", "3", "4")
	outcome := func(id int64) fetch.Outcome {
		s, err := sources.GetSource(f.ctx, f.pool, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.LastOutcome == nil {
			return ""
		}
		return *s.LastOutcome
	}

	err := sources.RecordCheck(f.ctx, f.pool, ids[0], sources.Check{Outcome: "failed", Status: 500, Error: "HTTP 500"})
	if !errors.Is(err, sources.ErrHistoryNotRecorded) || outcome(ids[0]) != "failed" {
		t.Fatalf("RecordCheck: %v, outcome %q; want ErrHistoryNotRecorded and the check written", err, outcome(ids[0]))
	}
	err = sources.RecordChecks(f.ctx, f.pool, []sources.CheckRecord{{SourceID: ids[1], Check: sources.Check{Outcome: "ok"}},
		{SourceID: ids[2], Check: sources.Check{Outcome: "not_modified"}}})
	if !errors.Is(err, sources.ErrHistoryNotRecorded) || outcome(ids[1]) != "ok" || outcome(ids[2]) != "not_modified" {
		t.Fatalf("RecordChecks: %v; want ErrHistoryNotRecorded and both checks written", err)
	}

	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx) //nolint:errcheck // test cleanup
	if err := sources.RecordCheck(f.ctx, tx, ids[3], sources.Check{Outcome: "rate_limited", Error: "stop"}); !errors.Is(err, sources.ErrHistoryNotRecorded) {
		t.Fatalf("RecordCheck in a transaction: %v, want ErrHistoryNotRecorded", err)
	}
	if _, _, err := sources.SetCooldown(f.ctx, tx, "p", time.Minute, "stop", 0.5); err != nil {
		t.Fatalf("the transaction is not usable after the history failure: %v", err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if outcome(ids[3]) != "rate_limited" {
		t.Fatalf("the check in the transaction was lost")
	}
	for _, id := range ids {
		if n := storetest.HistoryRows(t, f.pool, id); n != 0 {
			t.Fatalf("source %d has %d history rows with a broken history table", id, n)
		}
	}
}

// PruneHistory deletes rows older than the retention, at most its limit per
// call, and keeps the rest; retention 0 keeps nothing.
func TestPruneHistory(t *testing.T) {
	t.Parallel()
	f := setup(t, "a", "b")
	mustExec(t, f, `INSERT INTO fleetpace_check (source_id, platform, checked_at, outcome)
		SELECT g % 5, CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, now() - make_interval(days => g), 'ok'
		FROM generate_series(1, 10) g`) // one row per day, 1 to 10 days old
	count := func() int {
		var n int
		if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM fleetpace_check`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	n, err := sources.PruneHistory(f.ctx, f.pool, 7*24*time.Hour+time.Hour, 2)
	if err != nil || n != 2 || count() != 8 {
		t.Fatalf("first prune: deleted %d (%v), %d left; want 2 deleted (the limit), 8 left", n, err, count())
	}
	n, err = sources.PruneHistory(f.ctx, f.pool, 7*24*time.Hour+time.Hour, 0)
	if err != nil || n != 1 || count() != 7 {
		t.Fatalf("second prune: deleted %d (%v), %d left; want the last old row deleted, 7 left", n, err, count())
	}
	var oldest time.Duration
	if err := f.pool.QueryRow(f.ctx, `SELECT EXTRACT(EPOCH FROM now() - min(checked_at))::float8 * 1e9 FROM fleetpace_check`).Scan(&oldest); err != nil {
		t.Fatal(err)
	}
	if oldest > 7*24*time.Hour+time.Hour {
		t.Fatalf("oldest row left is %s old", oldest)
	}
	if n, err := sources.PruneHistory(f.ctx, f.pool, 0, 0); err != nil || n != 7 || count() != 0 {
		t.Fatalf("retention 0: deleted %d (%v), %d left; want everything deleted", n, err, count())
	}
}

// Activity counts the window's checks per platform, bucket and outcome.
func TestActivity(t *testing.T) {
	t.Parallel()
	f := setup(t, "a", "b")
	mustExec(t, f, `INSERT INTO fleetpace_check (source_id, platform, checked_at, outcome) VALUES
		(1, 'a', now() - interval '10 seconds', 'ok'), (1, 'a', now() - interval '20 seconds', 'ok'),
		(1, 'a', now() - interval '30 seconds', 'failed'), (2, 'b', now() - interval '5 seconds', 'rate_limited'),
		(1, 'a', now() - interval '2 hours', 'ok')`)
	got, err := sources.Activity(f.ctx, f.pool, sources.ActivityQuery{Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]int64{}
	for _, c := range got {
		sum[c.Platform+"/"+string(c.Outcome)] += c.Checks
	}
	want := map[string]int64{"a/ok": 2, "a/failed": 1, "b/rate_limited": 1}
	if len(sum) != len(want) {
		t.Fatalf("activity = %v, want %v", sum, want)
	}
	for k, v := range want {
		if sum[k] != v {
			t.Fatalf("activity = %v, want %v", sum, want)
		}
	}
	buckets, err := sources.Activity(f.ctx, f.pool, sources.ActivityQuery{Platform: "a", Window: time.Minute, Bucket: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	starts := map[time.Time]bool{}
	for _, c := range buckets {
		if c.Platform != "a" {
			t.Fatalf("Platform a's activity has %+v", c)
		}
		starts[c.Start] = true
	}
	if len(starts) != 3 {
		t.Fatalf("15-s buckets of checks 10, 20 and 30 s old: %d buckets (%+v), want 3", len(starts), buckets)
	}
	if _, err := sources.Activity(f.ctx, f.pool, sources.ActivityQuery{}); !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("no window: %v, want ErrInvalid", err)
	}
}

// A check's multiplier reaches its history row (one check, a batch, the
// Recorder); an unknown one (0, NaN) is NULL; Activity reports the largest
// per bucket and outcome.
func TestHistoryKeepsMultiplier(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	ids := f.sources(t, "a", "b", "c")
	a, b, c := ids[0], ids[1], ids[2]
	if err := sources.RecordCheck(f.ctx, f.pool, a, sources.Check{Outcome: "ok", Status: 200, Multiplier: 1.5}); err != nil {
		t.Fatal(err)
	}
	if err := sources.RecordChecks(f.ctx, f.pool, []sources.CheckRecord{
		{SourceID: b, Check: sources.Check{Outcome: "ok", Status: 200, Multiplier: 4}},
		{SourceID: c, Check: sources.Check{Outcome: "rate_pressure", Status: 429, Multiplier: math.NaN()}},
	}); err != nil {
		t.Fatal(err)
	}
	var known, unknown int
	var largest float64
	if err := f.pool.QueryRow(f.ctx, `SELECT count(multiplier), count(*) - count(multiplier), max(multiplier) FROM fleetpace_check`).Scan(&known, &unknown, &largest); err != nil {
		t.Fatal(err)
	}
	if known != 2 || unknown != 1 || largest != 4 {
		t.Fatalf("history multipliers: %d known, %d unknown, largest %g; want 2, 1, 4", known, unknown, largest)
	}
	got, err := sources.Activity(f.ctx, f.pool, sources.ActivityQuery{Platform: "p", Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	byOutcome := map[fetch.Outcome]float64{}
	for _, c := range got {
		byOutcome[c.Outcome] = c.MaxMultiplier
	}
	if byOutcome["ok"] != 4 || byOutcome["rate_pressure"] != 0 {
		t.Fatalf("Activity's largest multipliers %v, want ok ×4 and rate_pressure unknown (0)", byOutcome)
	}
}
