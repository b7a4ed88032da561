package control_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/control"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/sources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

type fixture struct {
	ctx    context.Context
	url    string
	pool   *pgxpool.Pool
	client *queue.Client
}

func setup(t *testing.T) *fixture {
	t.Helper()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	client, err := queue.NewClient(pool, queue.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{ctx: context.Background(), url: url, pool: pool, client: client}
	for _, p := range []string{"a", "b"} {
		storetest.Platform(t, pool, sources.Platform{Name: p, RatePerSec: 1})
	}
	return f
}

// snoozed inserts a fetch job of platform scheduled an hour from now, as a
// snooze leaves it, and returns its id.
func (f *fixture) snoozed(t *testing.T, platform string) int64 {
	t.Helper()
	res, err := f.client.Insert(f.ctx, queue.FetchArgs{SourceID: 1, Platform: platform, URL: "https://x.example/"},
		&river.InsertOpts{Queue: queue.Name, ScheduledAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return res.Job.ID
}

// state is a job's River state and whether it is due now.
func (f *fixture) state(t *testing.T, id int64) (string, bool) {
	t.Helper()
	var state string
	var due bool
	if err := f.pool.QueryRow(f.ctx, `SELECT state, scheduled_at <= now() FROM river_job WHERE id = $1`, id).Scan(&state, &due); err != nil {
		t.Fatal(err)
	}
	return state, due
}

// Pause is stored in the pacer (status shows it with its reason); Resume
// ends it and wakes the platform's snoozed jobs, not another platform's.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	f := setup(t)
	until, err := control.Pause(f.ctx, f.pool, "a", control.PauseOptions{For: time.Hour, Reason: "maintenance"})
	if err != nil || time.Until(until) < 59*time.Minute {
		t.Fatalf("Pause: %v, until %s", err, until)
	}
	states, err := pacer.States(f.ctx, f.pool)
	if err != nil || states[0].PacedBy != pacer.PacedByPause || states[0].PauseReason != "maintenance" || states[0].Paused < 59*time.Minute {
		t.Fatalf("states after pause: %+v, %v", states, err)
	}
	ja, jb := f.snoozed(t, "a"), f.snoozed(t, "b")
	woken, err := control.Resume(f.ctx, f.pool, "a")
	if err != nil || woken != 1 {
		t.Fatalf("Resume: woke %d, %v; want 1", woken, err)
	}
	if st, due := f.state(t, ja); st != "available" || !due {
		t.Fatalf("a's snoozed job after resume: %s, due %v; want available now", st, due)
	}
	if st, due := f.state(t, jb); st != "scheduled" || due {
		t.Fatalf("b's snoozed job after a's resume: %s, due %v; want left alone", st, due)
	}
	states, _ = pacer.States(f.ctx, f.pool)
	if states[0].Paused != 0 || states[0].PacedBy == pacer.PacedByPause {
		t.Fatalf("state after resume: %+v", states[0])
	}
	if _, err := control.Pause(f.ctx, f.pool, "nope", control.PauseOptions{}); !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("pause unknown: %v, want ErrNotFound", err)
	}
	if woken, err := control.Resume(f.ctx, f.pool, "a"); !errors.Is(err, control.ErrNotPaused) || woken != 0 {
		t.Fatalf("resume of a platform not paused: woke %d, %v; want ErrNotPaused", woken, err)
	}
	if _, err := control.Resume(f.ctx, f.pool, "nope"); !errors.Is(err, sources.ErrNotFound) {
		t.Fatalf("resume unknown: %v, want ErrNotFound", err)
	}
	if _, err := control.Pause(f.ctx, f.pool, "a", control.PauseOptions{For: -time.Second}); !errors.Is(err, sources.ErrInvalid) {
		t.Fatalf("pause for -1s: %v, want ErrInvalid", err)
	}
}

// A platform cooling down after a long Retry-After is reserved again at
// once after ClearCooldown — its slots already granted were pushed past the
// hold, so the pacer's cursor must come back too — and its snoozed jobs
// are woken.
func TestClearCooldownReservesAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p, err := pacer.New(f.ctx, pacer.Config{DatabaseURL: f.url})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Slots granted ahead (rate 1/s: the cursor is 3 s ahead), then the
	// destination says stop for 600 s.
	for range 3 {
		if r, err := p.Reserve(f.ctx, "a", 10*time.Second); err != nil || !r.Granted {
			t.Fatalf("reserve: %+v, %v", r, err)
		}
	}
	until, _, err := control.CoolDown(f.ctx, f.pool, "a", sources.CauseRetryAfter, 600*time.Second, "HTTP 429, Retry-After 600", 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.Reserve(f.ctx, "a", 5*time.Second); err != nil || r.Granted || r.Wait < 9*time.Minute {
		t.Fatalf("reserve while cooling down: %+v, %v; want denied for the cooldown", r, err)
	}
	// The hold is the cooldown's, to the same instant (the pacer's epoch
	// seconds), and a shorter cooldown does not shorten it.
	var holdGap float64
	if err := f.pool.QueryRow(f.ctx, `SELECT hold_until - date_part('epoch', $1::timestamptz) FROM fleetpace_pace WHERE platform = 'a' AND key = ''`, until).Scan(&holdGap); err != nil || math.Abs(holdGap) > 1e-3 {
		t.Fatalf("the pacer's hold is %.3f s off the cooldown's end (%v), want equal", holdGap, err)
	}
	if err := pacer.Hold(f.ctx, f.pool, "a", time.Now().Add(time.Minute), "shorter"); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Reserve(f.ctx, "a", 5*time.Second); err != nil || r.Granted || r.Wait < 9*time.Minute {
		t.Fatalf("reserve after a shorter hold: %+v, %v; want still denied for the cooldown", r, err)
	}
	job := f.snoozed(t, "a")
	c, err := control.ClearCooldown(f.ctx, f.pool, "a")
	if err != nil || c.Cooldown == nil || c.Woken != 1 {
		t.Fatalf("ClearCooldown: %+v, %v", c, err)
	}
	if st, due := f.state(t, job); st != "available" || !due {
		t.Fatalf("snoozed job after clear: %s, due %v", st, due)
	}
	r, err := p.Reserve(f.ctx, "a", 5*time.Second)
	if err != nil || !r.Granted || r.Wait > 5*time.Second {
		t.Fatalf("reserve after ClearCooldown: %+v, %v; want granted within 5 s", r, err)
	}
}

// DeletePlatform deletes the waiting jobs of the platform too.
func TestDeletePlatform(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.snoozed(t, "a")
	keep := f.snoozed(t, "b")
	if _, _, err := sources.AddSource(f.ctx, f.pool, sources.NewSource{Platform: "a", URL: "https://a.example/1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := control.DeletePlatform(f.ctx, f.pool, "a", false); !errors.Is(err, sources.ErrHasSources) {
		t.Fatalf("delete with sources: %v", err)
	}
	d, err := control.DeletePlatform(f.ctx, f.pool, "a", true)
	if err != nil || d.Sources != 1 || d.Jobs != 1 {
		t.Fatalf("delete: %+v, %v; want 1 source and 1 job", d, err)
	}
	if st, _ := f.state(t, keep); st != "scheduled" {
		t.Fatalf("b's job: %s", st)
	}
}
