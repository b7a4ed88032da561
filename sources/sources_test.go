package sources_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/sources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

type fixture struct {
	ctx  context.Context
	pool *pgxpool.Pool
}

// setup gives a test its own database with platforms, each at 10/s.
func setup(t *testing.T, platforms ...string) *fixture {
	t.Helper()
	f := &fixture{ctx: context.Background(), pool: testdb.Pool(t)}
	for _, p := range platforms {
		f.platform(t, p, 10)
	}
	return f
}

func (f *fixture) platform(t *testing.T, name string, rate float64) {
	t.Helper()
	storetest.Platform(t, f.pool, sources.Platform{Name: name, RatePerSec: rate})
}

// source adds a source checked `ago` ago (nil = never) and due now.
func (f *fixture) source(t *testing.T, platform, url string, ago *time.Duration) int64 {
	t.Helper()
	id := storetest.Source(t, f.pool, sources.NewSource{Platform: platform, URL: url, Interval: time.Minute})
	if ago != nil {
		storetest.Exec(t, f.pool, `UPDATE fleetpace_source SET last_checked_at = now() - make_interval(secs => $2),
			due_at = now() - interval '1 second' WHERE id = $1`, id, ago.Seconds())
	}
	return id
}

// sources adds never-checked sources https://p.example/NAME on platform
// "p", one per name, and returns their ids in order.
func (f *fixture) sources(t *testing.T, names ...string) []int64 {
	t.Helper()
	ids := make([]int64, len(names))
	for i, n := range names {
		ids[i] = f.source(t, "p", "https://p.example/"+n, nil)
	}
	return ids
}

func dur(d time.Duration) *time.Duration { return &d }

func mustExec(t *testing.T, f *fixture, sql string, args ...any) {
	t.Helper()
	storetest.Exec(t, f.pool, sql, args...)
}

func TestCooldownConcurrentUpsert(t *testing.T) {
	t.Parallel()
	f := setup(t, "a")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := sources.SetCooldown(f.ctx, f.pool, "a", 0, "rate limited", float64(i)/8)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent SetCooldown: %v", err)
		}
	}
	var rows, count int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*), max(count) FROM fleetpace_cooldown`).Scan(&rows, &count); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || count != 1 {
		t.Fatalf("rows = %d, escalation count = %d; want one row, not escalated by simultaneous reports", rows, count)
	}
}

func TestCooldownDurations(t *testing.T) {
	t.Parallel()
	f := setup(t)
	storetest.Platform(t, f.pool, sources.Platform{Name: "a", RatePerSec: 1, Cooldown: time.Minute})
	remaining := func() time.Duration {
		t.Helper()
		var secs float64
		if err := f.pool.QueryRow(f.ctx, `SELECT EXTRACT(EPOCH FROM until - now()) FROM fleetpace_cooldown`).Scan(&secs); err != nil {
			t.Fatal(err)
		}
		return time.Duration(secs * float64(time.Second))
	}
	near := func(got, want time.Duration) bool {
		return math.Abs(float64(got-want)) < float64(2*time.Second)
	}

	// Retry-After longer than the platform cooldown wins; u=0.5 is no jitter.
	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "a", 10*time.Minute, "r", 0.5); err != nil {
		t.Fatal(err)
	}
	if r := remaining(); !near(r, 10*time.Minute) {
		t.Fatalf("remaining = %s, want 10m (Retry-After)", r)
	}
	// The jitter never brings the return before the Retry-After: u=0 is
	// −10 %, but not below 10m.
	mustExec(t, f, `UPDATE fleetpace_cooldown SET until = now() - interval '2 hours'`)
	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "a", 10*time.Minute, "r", 0); err != nil {
		t.Fatal(err)
	}
	if r := remaining(); r < 10*time.Minute-2*time.Second || !near(r, 10*time.Minute) {
		t.Fatalf("remaining = %s, want 10m (the Retry-After: the jitter does not shorten it)", r)
	}
	// Jitter: u=1 → +10 %, on a fresh episode.
	mustExec(t, f, `UPDATE fleetpace_cooldown SET until = now() - interval '2 hours'`)
	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "a", 0, "r", 1); err != nil {
		t.Fatal(err)
	}
	if r := remaining(); !near(r, 66*time.Second) {
		t.Fatalf("remaining = %s, want 66s (1m + 10%%)", r)
	}
	// A repeat shortly after the previous ended doubles.
	mustExec(t, f, `UPDATE fleetpace_cooldown SET until = now() - interval '10 seconds'`)
	_, count, err := sources.SetCooldown(f.ctx, f.pool, "a", 0, "r", 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if r := remaining(); count != 2 || !near(r, 2*time.Minute) {
		t.Fatalf("repeat: count %d remaining %s, want 2 and 2m", count, r)
	}
	// Capped at 24 h.
	mustExec(t, f, `UPDATE fleetpace_cooldown SET until = now() - interval '1 second', count = 20`)
	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "a", 0, "r", 1); err != nil {
		t.Fatal(err)
	}
	if r := remaining(); !near(r, 24*time.Hour) {
		t.Fatalf("remaining = %s, want the 24h cap", r)
	}
	// Unknown platform.
	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "nope", 0, "r", 0.5); !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("unknown platform: err = %v", err)
	}
}

func TestRecordCheck(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	id := f.source(t, "p", "https://p.example/1", nil)
	get := func() sources.Source {
		s, err := sources.GetSource(f.ctx, f.pool, id)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	lateness := func(s sources.Source) time.Duration { return time.Until(s.DueAt).Round(time.Second) }

	for i, want := range []time.Duration{2 * time.Minute, 4 * time.Minute, 8 * time.Minute} {
		if err := sources.RecordCheck(f.ctx, f.pool, id, sources.Check{Outcome: "failed", Status: 500, Error: "HTTP 500"}); err != nil {
			t.Fatal(err)
		}
		s := get()
		if s.ConsecutiveFailures != i+1 || lateness(s) != want {
			t.Fatalf("after %d failures: failures %d, next due in %s; want %s", i+1, s.ConsecutiveFailures, lateness(s), want)
		}
	}
	// Rate limiting is not a failure and not a check.
	before := get()
	if err := sources.RecordCheck(f.ctx, f.pool, id, sources.Check{Outcome: "rate_limited", Status: 429}); err != nil {
		t.Fatal(err)
	}
	s := get()
	if s.ConsecutiveFailures != 3 || !s.LastCheckedAt.Equal(*before.LastCheckedAt) {
		t.Fatalf("rate_limited changed failures (%d) or last_checked_at", s.ConsecutiveFailures)
	}
	// Success resets and stores validators.
	if err := sources.RecordCheck(f.ctx, f.pool, id, sources.Check{Outcome: "ok", Status: 200, ETag: `"v1"`, ContentHash: "abc"}); err != nil {
		t.Fatal(err)
	}
	s = get()
	if s.ConsecutiveFailures != 0 || lateness(s) != time.Minute || s.ETag == nil || *s.ETag != `"v1"` || s.QueuedAt != nil {
		t.Fatalf("after ok: %+v", s)
	}
	// The cap: 64 × interval at most.
	mustExec(t, f, `UPDATE fleetpace_source SET consecutive_failures = 30 WHERE id = $1`, id)
	if err := sources.RecordCheck(f.ctx, f.pool, id, sources.Check{Outcome: "failed"}); err != nil {
		t.Fatal(err)
	}
	if l := lateness(get()); l != 64*time.Minute {
		t.Fatalf("capped backoff = %s, want 64m", l)
	}
}

func TestPlatformValidation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tests := []struct {
		p     sources.Platform
		field string
	}{
		{sources.Platform{Name: "Bad Name", RatePerSec: 1}, "name"},
		{sources.Platform{Name: "", RatePerSec: 1}, "name"},
		{sources.Platform{Name: "ok", RatePerSec: 0}, "rate_per_sec"},
		{sources.Platform{Name: "ok", RatePerSec: -1}, "rate_per_sec"},
		{sources.Platform{Name: "ok", RatePerSec: math.Inf(1)}, "rate_per_sec"},
		{sources.Platform{Name: "ok", RatePerSec: math.NaN()}, "rate_per_sec"},
		{sources.Platform{Name: "ok", RatePerSec: 1, Burst: -1}, "burst"},
		{sources.Platform{Name: "ok", RatePerSec: 1, Cooldown: -time.Second}, "cooldown"},
		{sources.Platform{Name: "ok", RatePerSec: 1, MaxMultiplier: 0.5}, "max_multiplier"},
		{sources.Platform{Name: "ok", RatePerSec: 1, DecayAfter: -3}, "decay_after"},
	}
	for _, tt := range tests {
		_, err := sources.SetPlatform(f.ctx, f.pool, tt.p)
		var fe *sources.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field || !errors.Is(err, sources.ErrInvalid) {
			t.Errorf("SetPlatform(%+v) = %v, want a FieldError on %s", tt.p, err, tt.field)
		}
	}
	ps, err := sources.ListPlatforms(f.ctx, f.pool)
	if err != nil || len(ps) != 0 {
		t.Fatalf("invalid platforms were written: %v %v", ps, err)
	}
	p, err := sources.SetPlatform(f.ctx, f.pool, sources.Platform{Name: "ok", RatePerSec: 7})
	if err != nil || p.Burst != 1 || p.MaxMultiplier != 16 || p.DecayAfter != 100 || p.Cooldown != 15*time.Minute {
		t.Fatalf("defaults: %+v %v", p, err)
	}
}

func TestAddSourceValidation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "p", 1)
	tests := []struct {
		s     sources.NewSource
		field string
	}{
		{sources.NewSource{Platform: "p", URL: "ftp://x.example/"}, "url"},
		{sources.NewSource{Platform: "p", URL: "/relative"}, "url"},
		{sources.NewSource{Platform: "p", URL: "https://"}, "url"},
		{sources.NewSource{Platform: "p", URL: "https://x.example/", Interval: -time.Second}, "interval"},
		{sources.NewSource{Platform: "missing", URL: "https://x.example/"}, "platform"},
	}
	for _, tt := range tests {
		_, _, err := sources.AddSource(f.ctx, f.pool, tt.s)
		var fe *sources.FieldError
		if !errors.As(err, &fe) || fe.Field != tt.field {
			t.Errorf("AddSource(%+v) = %v, want a FieldError on %s", tt.s, err, tt.field)
		}
	}
	id1, created1, err := sources.AddSource(f.ctx, f.pool, sources.NewSource{Platform: "p", URL: "https://x.example/"})
	if err != nil || !created1 {
		t.Fatal(err)
	}
	id2, created2, err := sources.AddSource(f.ctx, f.pool, sources.NewSource{Platform: "p", URL: "https://x.example/"})
	if err != nil || created2 || id2 != id1 {
		t.Fatalf("re-add: id %d created %v err %v; want the same id, not created", id2, created2, err)
	}
	if _, err := sources.RemoveSources(f.ctx, f.pool, []int64{id1, 999999}); !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("remove with a missing id: %v", err)
	}
	if _, err := sources.GetSource(f.ctx, f.pool, id1); err != nil {
		t.Fatalf("a failed remove removed something: %v", err)
	}
	if n, err := sources.RemoveSources(f.ctx, f.pool, []int64{id1}); err != nil || n != 1 {
		t.Fatalf("remove: %d %v", n, err)
	}
}
