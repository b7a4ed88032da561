package queue_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jonboulle/clockwork"
	"github.com/riverqueue/river"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/pacetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/queue"
)

// A hold's wake makes available, in due order (scheduled at its creation),
// exactly the fetch jobs of the held platform (key) snoozed up to the
// hold's end and 2 s after it (a snooze the middleware lengthened, or River
// recorded late): scheduled ones and available ones not yet due. A job of
// another platform or key, one snoozed past the end, and a job due already
// are left as they are. The Waker runs the wake on its clock at the hold's
// end, once for asks that coalesce, and not after Stop.
func TestWakeHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	client, now := insertClient(t, pool)
	until := now.Truncate(100 * time.Millisecond).Add(10*time.Second + 50*time.Millisecond)
	type job struct {
		name        string
		args        queue.FetchArgs
		state       string
		scheduledAt time.Time
		wantWoken   bool
	}
	jobs := []job{
		{"snoozed for the key", queue.FetchArgs{SourceID: 1, Platform: "p", Key: "a"}, "scheduled", now.Add(5 * time.Second), true},
		{"snoozed short, available ahead", queue.FetchArgs{SourceID: 2, Platform: "p", Key: "a"}, "available", now.Add(9 * time.Second), true},
		{"snoozed just past the end (a spread snooze)", queue.FetchArgs{SourceID: 6, Platform: "p", Key: "a"}, "available", until.Add(1500 * time.Millisecond), true},
		{"snoozed past the end", queue.FetchArgs{SourceID: 3, Platform: "p", Key: "a"}, "scheduled", until.Add(3 * time.Second), false},
		{"another key", queue.FetchArgs{SourceID: 4, Platform: "p", Key: "b"}, "scheduled", now.Add(5 * time.Second), false},
		{"another platform", queue.FetchArgs{SourceID: 5, Platform: "q", Key: "a"}, "scheduled", now.Add(5 * time.Second), false},
	}
	ids := make([]int64, len(jobs))
	for i, j := range jobs {
		res, err := client.Insert(ctx, j.args, &river.InsertOpts{Queue: queue.Name, ScheduledAt: j.scheduledAt})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = res.Job.ID
		if _, err := pool.Exec(ctx, `UPDATE river_job SET state = $2 WHERE id = $1`, res.Job.ID, j.state); err != nil {
			t.Fatal(err)
		}
	}
	check := func(t *testing.T, woken func(int) bool) {
		t.Helper()
		for i, j := range jobs {
			var state string
			var scheduledAt, createdAt time.Time
			if err := pool.QueryRow(ctx, `SELECT state::text, scheduled_at, created_at FROM river_job WHERE id = $1`, ids[i]).
				Scan(&state, &scheduledAt, &createdAt); err != nil {
				t.Fatal(err)
			}
			if got := state == "available" && scheduledAt.Equal(createdAt); got != woken(i) {
				t.Errorf("%s: state %s, scheduled %s after its creation; want woken %v", j.name, state, scheduledAt.Sub(createdAt), woken(i))
			}
		}
	}

	// The fake clock reads the database's time: a wake's bound is the hold's
	// end on the clock River snoozed the jobs by.
	clk := clockwork.NewFakeClockAt(now)
	w := queue.NewWaker(pool, clk, nil)
	w.WakeAt("p", "a", until.Add(-10*time.Millisecond))
	w.WakeAt("p", "a", until)
	clocktest.WaitSleepers(t, clk, 1) // one wake for both asks (WakeAt is synchronous)
	clk.Advance(until.Sub(now) - time.Second)
	check(t, func(int) bool { return false })
	w.Stop() // the pending wake is cancelled
	w.WakeAt("p", "a", until)
	clocktest.WaitSleepers(t, clk, 0)
	clk.Advance(2 * time.Second)
	check(t, func(int) bool { return false })

	w2 := queue.NewWaker(pool, clk, nil)
	defer w2.Stop()
	w2.WakeAt("p", "a", until) // past: at once
	deadline := time.Now().Add(30 * time.Second)
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM river_job WHERE id = ANY($1) AND state = 'scheduled'`, ids[:1]).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	check(t, func(i int) bool { return jobs[i].wantWoken })
}

// A wake the database fails is tried again: here the Waker's role may not
// update river_job until the test grants it, after the first try failed.
func TestWakeRetriesAFailedWake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	client, now := insertClient(t, pool)
	until := now.Add(10 * time.Second)
	res, err := client.Insert(ctx, queue.FetchArgs{SourceID: 1, Platform: "p", Key: "a"}, &river.InsertOpts{Queue: queue.Name, ScheduledAt: now.Add(5 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}

	// A role of the test's own that may read river_job, not update it.
	role := fmt.Sprintf("fleetpace_waker_%d_%d", os.Getpid(), time.Now().UnixNano())
	ident := pgx.Identifier{role}.Sanitize()
	for _, sql := range []string{
		"CREATE ROLE " + ident + " LOGIN",
		"GRANT USAGE ON SCHEMA public TO " + ident,
		"GRANT SELECT ON river_job TO " + ident,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+ident)
		_, _ = pool.Exec(context.Background(), "DROP ROLE "+ident)
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = ""
	weak, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer weak.Close()
	if _, err := queue.WakeHeld(ctx, weak, "p", "a", until); err == nil {
		t.Fatal("the role without UPDATE woke the jobs: the test's failure does not fail")
	}

	clk := clockwork.NewFakeClockAt(now)
	w := queue.NewWaker(weak, clk, nil)
	defer w.Stop()
	w.WakeAt("p", "a", until)
	clocktest.WaitSleepers(t, clk, 1)
	clk.Advance(until.Sub(now) + time.Second) // the wake runs, and fails
	clocktest.WaitSleepers(t, clk, 1)         // and waits to try again
	if _, err := pool.Exec(ctx, "GRANT UPDATE ON river_job TO "+ident); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	pacetest.Poll(t, 30*time.Second, "the failed wake tried again (the job available)", func() bool {
		var state string
		if err := pool.QueryRow(ctx, `SELECT state::text FROM river_job WHERE id = $1`, res.Job.ID).Scan(&state); err != nil {
			t.Fatal(err)
		}
		return state == "available"
	})
}

// insertClient returns a River client on pool that inserts fetch jobs (it
// works none) and the database's time.
func insertClient(t *testing.T, pool *pgxpool.Pool) (*river.Client[pgx.Tx], time.Time) {
	t.Helper()
	client, err := queue.NewClient(pool, queue.Config{Workers: river.NewWorkers()})
	if err != nil {
		t.Fatal(err)
	}
	var now time.Time
	if err := pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return client, now
}
