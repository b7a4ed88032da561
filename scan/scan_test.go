package scan_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

type fixture struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	client *queue.Client
}

// setup gives a test its own database and a queue client on it, with
// platforms, each at 10/s.
func setup(t *testing.T, platforms ...string) *fixture {
	t.Helper()
	pool := testdb.Pool(t)
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ctx: context.Background(), pool: pool, client: client}
	for _, p := range platforms {
		f.platform(t, p, 10)
	}
	return f
}

// exec runs a statement of a test's setup.
func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.pool.Exec(f.ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
}

// platform adds a platform at rate (the schema's trigger adds its pace row).
func (f *fixture) platform(t *testing.T, name string, rate float64) {
	t.Helper()
	f.exec(t, `INSERT INTO fleetpace_platform (name, rate_per_sec) VALUES ($1, $2)`, name, rate)
}

// source adds a due source checked `ago` ago (nil = never).
func (f *fixture) source(t *testing.T, platform, url string, ago *time.Duration) int64 {
	t.Helper()
	var secs *float64
	if ago != nil {
		s := ago.Seconds()
		secs = &s
	}
	var id int64
	err := f.pool.QueryRow(f.ctx, `INSERT INTO fleetpace_source (platform, url, check_interval, last_checked_at, due_at)
		VALUES ($1, $2, interval '1 minute', now() - make_interval(secs => $3), now() - interval '1 second')
		RETURNING id`, platform, url, secs).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func dur(d time.Duration) *time.Duration { return &d }

func ids(due []scan.Due) []int64 {
	out := make([]int64, len(due))
	for i, d := range due {
		out[i] = d.ID
	}
	return out
}

func TestDueOrder(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	recent := f.source(t, "p", "https://example.com/recent", dur(2*time.Minute))
	old := f.source(t, "p", "https://example.com/old", dur(4*time.Hour))
	never := f.source(t, "p", "https://example.com/never", nil)

	due, err := scan.SelectDue(f.ctx, f.pool, scan.DueOptions{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(ids(due)), fmt.Sprint([]int64{never, old, recent}); got != want {
		t.Fatalf("due order = %s, want never, 4h, 2min = %s", got, want)
	}

	// Equal last_checked_at: ties broken by id.
	if _, err := f.pool.Exec(f.ctx, `UPDATE fleetpace_source SET last_checked_at = '2026-01-01T00:00:00Z'`); err != nil {
		t.Fatal(err)
	}
	due, err = scan.SelectDue(f.ctx, f.pool, scan.DueOptions{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(ids(due)), fmt.Sprint([]int64{recent, old, never}); got != want {
		t.Fatalf("tie order = %s, want by id %s", got, want)
	}

	// The CLI's list --due uses the same order.
	list, err := sources.ListSources(f.ctx, f.pool, sources.ListFilter{DueOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0].ID != recent {
		t.Fatalf("ListSources due = %+v", list)
	}
}

func TestDueExcludesDisabledQueuedAndNotDue(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	due := f.source(t, "p", "https://example.com/due", nil)
	disabled := f.source(t, "p", "https://example.com/disabled", nil)
	notDue := f.source(t, "p", "https://example.com/notdue", nil)
	queued := f.source(t, "p", "https://example.com/queued", nil)
	f.exec(t, `UPDATE fleetpace_source SET enabled = false WHERE id = $1`, disabled)
	f.exec(t, `UPDATE fleetpace_source SET due_at = now() + interval '1 hour' WHERE id = $1`, notDue)
	if _, err := scan.Enqueue(f.ctx, f.pool, f.client, []int64{queued}); err != nil {
		t.Fatal(err)
	}
	got, err := scan.SelectDue(f.ctx, f.pool, scan.DueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(got)) != fmt.Sprint([]int64{due}) {
		t.Fatalf("due = %v, want only %d", ids(got), due)
	}
}

func TestCooldownFiltersPlatform(t *testing.T) {
	t.Parallel()
	f := setup(t, "a", "b", "c")
	a := f.source(t, "a", "https://a.example/1", nil)
	b := f.source(t, "b", "https://b.example/1", nil)
	c := f.source(t, "c", "https://c.example/1", nil)

	if _, _, err := sources.SetCooldown(f.ctx, f.pool, "a", 0, "429 Retry-After 600", 0.5); err != nil {
		t.Fatal(err)
	}
	// c's cooldown has expired: it must not filter.
	f.exec(t, `INSERT INTO fleetpace_cooldown (platform, until) VALUES ('c', now() - interval '1 second')`)

	got, err := scan.SelectDue(f.ctx, f.pool, scan.DueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(got)) != fmt.Sprint([]int64{b, c}) {
		t.Fatalf("due = %v, want b=%d and c=%d (a=%d cooling down)", ids(got), b, c, a)
	}
	active, err := sources.ActiveCooldowns(f.ctx, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(active) != 1 || active[0].Platform != "a" {
		t.Fatalf("active cooldowns = %+v, want only a", active)
	}
	if r := active[0].Remaining; r < 13*time.Minute || r > 17*time.Minute {
		t.Fatalf("remaining = %s, want 15m ± 10%%", r)
	}
	// The tick leaves a's source alone and says so.
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Enqueued != 2 || res.ByPlatform["a"] != 0 || fmt.Sprint(res.CoolingDown) != "[a]" {
		t.Fatalf("tick = %+v", res)
	}
}

// TestTickLeavesOutACooldownCommittedAfterItsPlan: a worker records a
// source's check and the cooldown its 429 starts in one transaction. When
// that commits after the tick read which platforms are stopped and before
// its due query, the source is due again while its platform was running
// when the plan read it; the tick must still not queue it into the
// cooldown. Not parallel: the hook is the package's.
func TestTickLeavesOutACooldownCommittedAfterItsPlan(t *testing.T) {
	f := setup(t, "a", "b")
	a := f.source(t, "a", "https://a.example/1", nil)
	b := f.source(t, "b", "https://b.example/1", nil)
	f.exec(t, `UPDATE fleetpace_source SET queued_at = now() WHERE id = $1`, a)
	ran := false
	scan.SetAfterPlan(t, func() {
		ran = true
		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			t.Error(err)
			return
		}
		defer tx.Rollback(f.ctx) //nolint:errcheck // no-op after commit
		if _, err := tx.Exec(f.ctx, `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL,
			last_checked_at = now(), due_at = now() - interval '1 second' WHERE id = $1`, a); err != nil {
			t.Error(err)
			return
		}
		if _, _, err := sources.SetCooldown(f.ctx, tx, "a", 0, "429", 0.5); err != nil {
			t.Error(err)
			return
		}
		if err := tx.Commit(f.ctx); err != nil {
			t.Error(err)
		}
	})
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !ran || len(res.CoolingDown) != 0 {
		t.Fatalf("the hook ran: %v, the plan saw cooling down: %v: the cooldown must commit after the plan", ran, res.CoolingDown)
	}
	if res.ByPlatform["a"] != 0 || res.ByPlatform["b"] != 1 {
		t.Fatalf("tick = %+v, want b's source (%d) queued and not a's (%d), whose platform cools down", res, b, a)
	}
	var queued bool
	if err := f.pool.QueryRow(f.ctx, `SELECT queued_at IS NOT NULL FROM fleetpace_source WHERE id = $1`, a).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if queued {
		t.Fatal("a's source is marked queued")
	}
}

func TestPerPlatformCapPreventsStarvation(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "a", 1000)
	f.platform(t, "b", 1000)
	f.exec(t, `INSERT INTO fleetpace_source (platform, url, last_checked_at, due_at)
		SELECT 'a', 'https://a.example/' || g, now() - interval '10 hours' + g * interval '1 second', now() - interval '1 second'
		FROM generate_series(1, 1000) g`)
	var bIDs []int64
	for i := 0; i < 10; i++ {
		bIDs = append(bIDs, f.source(t, "b", fmt.Sprintf("https://b.example/%d", i), dur(time.Hour)))
	}
	due, err := scan.SelectDue(f.ctx, f.pool, scan.DueOptions{Limit: 100, DefaultCap: 50})
	if err != nil {
		t.Fatal(err)
	}
	perPlatform := map[string]int{}
	for _, d := range due {
		perPlatform[d.Platform]++
	}
	if perPlatform["b"] != 10 || perPlatform["a"] != 50 {
		t.Fatalf("per platform = %v, want all 10 of b and a capped at 50", perPlatform)
	}
	// Without the per-platform cap, a's older sources fill the whole tick:
	// the naive query starves b.
	naive, err := scan.SelectDue(f.ctx, f.pool, scan.DueOptions{Limit: 100, DefaultCap: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range naive {
		if d.Platform == "b" {
			t.Fatalf("naive query (no cap) included b; the test would not catch starvation")
		}
	}
	// The tick applies the same cap.
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{Limit: 100, PerPlatformCap: 50})
	if err != nil {
		t.Fatal(err)
	}
	if res.ByPlatform["b"] != 10 || res.ByPlatform["a"] != 50 {
		t.Fatalf("tick by platform = %v", res.ByPlatform)
	}
}

func TestTickShareFromRate(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "slow", 2) // 2/s × 30 s look-ahead = 60
	for i := 0; i < 100; i++ {
		f.source(t, "slow", fmt.Sprintf("https://s.example/%d", i), nil)
	}
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{LookAhead: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Enqueued != 60 {
		t.Fatalf("first tick enqueued %d, want rate × look-ahead = 60", res.Enqueued)
	}
	res, err = scan.Tick(f.ctx, f.pool, f.client, scan.Config{LookAhead: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Enqueued != 0 {
		t.Fatalf("second tick enqueued %d with 60 already queued, want 0", res.Enqueued)
	}
}

func TestConcurrentTicksQueueOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "p", 1000)
	f.exec(t, `INSERT INTO fleetpace_source (platform, url) SELECT 'p', 'https://p.example/' || g FROM generate_series(1, 500) g`)

	var wg sync.WaitGroup
	results := make([]*scan.Result, 4)
	errs := make([]error, 4)
	start := make(chan struct{})
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = scan.Tick(f.ctx, f.pool, f.client, scan.Config{Limit: 1000, PerPlatformCap: 1000})
		}()
	}
	close(start)
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		total += results[i].Enqueued
	}
	// Enqueue by id races with the ticks too; it must not double-queue.
	if _, err := scan.Enqueue(f.ctx, f.pool, f.client, []int64{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	var jobs, distinct, queued int
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*), count(DISTINCT (args->>'source_id')) FROM river_job`).Scan(&jobs, &distinct); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM fleetpace_source WHERE queued_at IS NOT NULL AND queued_job_id IS NOT NULL`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if total != 500 || jobs != 500 || distinct != 500 || queued != 500 {
		t.Fatalf("ticks enqueued %d, jobs %d (distinct sources %d), queued sources %d; want 500 each", total, jobs, distinct, queued)
	}
}

func TestTickSkipsWhileAnotherHoldsLock(t *testing.T) {
	t.Parallel()
	f := setup(t, "p")
	f.source(t, "p", "https://p.example/1", nil)
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx) //nolint:errcheck
	// Hold the tick lock as a tick in progress would.
	res, err := scan.Tick(f.ctx, tx, f.client, scan.Config{})
	if err != nil || res.Skipped {
		t.Fatalf("first tick: %+v %v", res, err)
	}
	res2, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !res2.Skipped {
		t.Fatalf("second tick ran while the first held the lock: %+v", res2)
	}
}

func TestTickInterleavesPlatforms(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "a", 100)
	f.platform(t, "b", 100)
	// a's sources are all older than b's: plain fair order would queue every
	// a job first.
	for i := 0; i < 4; i++ {
		f.source(t, "a", fmt.Sprintf("https://a.example/%d", i), dur(time.Duration(10-i)*time.Hour))
	}
	for i := 0; i < 2; i++ {
		f.source(t, "b", fmt.Sprintf("https://b.example/%d", i), dur(time.Duration(2-i)*time.Hour))
	}
	if _, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{}); err != nil {
		t.Fatal(err)
	}
	order := storetest.Column[string](t, f.pool, `SELECT args->>'platform' FROM river_job ORDER BY id`)
	if got := strings.Join(order, ""); got != "ababaa" {
		t.Fatalf("job order by platform = %s, want ababaa (platforms take turns)", got)
	}
}

// A tick that fills a platform's PerPlatformCap while the platform's rate
// allows more says so (Saturated: the scan loop ticks again at once, or a
// fast platform would get one cap per loop cycle, below its ceiling); a
// platform held back by its own rate × look-ahead does not.
func TestTickSaturated(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "fast", 1000) // 1000/s × 30 s = 30,000: the cap binds
	f.platform(t, "slow", 1)    // 1/s × 30 s = 30: its rate binds
	f.exec(t, `INSERT INTO fleetpace_source (platform, url) SELECT 'fast', 'https://f.example/' || g FROM generate_series(1, 200) g`)
	f.exec(t, `INSERT INTO fleetpace_source (platform, url) SELECT 'slow', 'https://s.example/' || g FROM generate_series(1, 200) g`)
	res, err := scan.Tick(f.ctx, f.pool, f.client, scan.Config{Limit: 1000, PerPlatformCap: 50})
	if err != nil {
		t.Fatal(err)
	}
	if res.ByPlatform["fast"] != 50 || res.ByPlatform["slow"] != 30 || !res.Saturated {
		t.Fatalf("tick = %+v, want fast capped at 50, slow at its 30, saturated", res)
	}
	f.exec(t, `DELETE FROM fleetpace_source WHERE platform = 'fast' AND queued_at IS NULL`)
	res, err = scan.Tick(f.ctx, f.pool, f.client, scan.Config{Limit: 1000, PerPlatformCap: 50})
	if err != nil {
		t.Fatal(err)
	}
	if res.Saturated || res.Enqueued != 0 {
		t.Fatalf("tick with nothing more to queue = %+v, want not saturated", res)
	}
}

// A source whose URL carries credentials is queued by id alone: the job's
// args, which River UI shows to anyone who can reach it, hold no secret. A
// URL without credentials still travels in the args, so the job needs no
// read.
func TestCredentialsStayOutOfJobArgs(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.platform(t, "p", 100)
	secret := f.source(t, "p", "https://reader:hunter2@p.example/feed", nil)
	token := f.source(t, "p", "https://tok3n@p.example/other", nil)
	plain := f.source(t, "p", "https://p.example/plain", nil)
	if _, err := scan.Enqueue(f.ctx, f.pool, f.client, []int64{secret, token, plain}); err != nil {
		t.Fatal(err)
	}
	rows, err := f.pool.Query(f.ctx, `SELECT (args->>'source_id')::bigint, args::text FROM river_job`)
	if err != nil {
		t.Fatal(err)
	}
	args, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id   int64
		args string
	}, error) {
		var v struct {
			id   int64
			args string
		}
		return v, r.Scan(&v.id, &v.args)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(args) != 3 {
		t.Fatalf("%d jobs, want 3", len(args))
	}
	for _, a := range args {
		switch a.id {
		case secret, token:
			if strings.Contains(a.args, "hunter2") || strings.Contains(a.args, "tok3n") || strings.Contains(a.args, `"url"`) {
				t.Errorf("job args of source %d carry its URL's credentials: %s", a.id, a.args)
			}
		case plain:
			if !strings.Contains(a.args, "https://p.example/plain") {
				t.Errorf("job args of source %d lost its URL: %s", a.id, a.args)
			}
		}
	}
}
