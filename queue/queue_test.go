package queue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/queue"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

// drainOne inserts one fetch job whose work always snoozes it briefly (so it
// stays pending) and starts a drain on a fake clock; it returns the clock
// once the drain waits on it, and the drain's outcome.
func drainOne(t *testing.T, cfg queue.DrainConfig) (*clocktest.Fake, func() (*queue.DrainResult, error), func()) {
	t.Helper()
	ctx := context.Background()
	pool := testdb.Pool(t)
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(context.Context, *river.Job[queue.FetchArgs]) error {
		return river.JobSnooze(200 * time.Millisecond)
	}))
	client, err := queue.NewClient(pool, queue.Config{Workers: workers, SoftStopTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := queue.InsertFetches(ctx, client, tx, []queue.FetchArgs{{SourceID: 1, Platform: "p", URL: "https://p.example/"}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	clk := clocktest.New()
	cfg.Clock = clk
	type outcome struct {
		res *queue.DrainResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := queue.Drain(ctx, client, pool, cfg)
		done <- outcome{res, err}
	}()
	sleepers := 1 // the ticker of the checks
	if cfg.MaxDuration > 0 {
		sleepers++ // and the bound
	}
	clocktest.WaitSleepers(t, clk, sleepers)
	wait := func() (*queue.DrainResult, error) {
		select {
		case o := <-done:
			return o.res, o.err
		case <-time.After(60 * time.Second):
			t.Fatal("Drain did not return")
			return nil, nil
		}
	}
	return clk, wait, pool.Close
}

// When MaxDuration passes with a job left, Drain stops the client and
// reports it: not an error, TimedOut with the job counted.
func TestDrainTimesOut(t *testing.T) {
	t.Parallel()
	clk, wait, _ := drainOne(t, queue.DrainConfig{MaxDuration: time.Minute})
	clk.Advance(time.Minute)
	res, err := wait()
	if err != nil || res == nil || !res.TimedOut || res.Left != 1 {
		t.Fatalf("Drain = %+v, %v; want timed out with 1 job left", res, err)
	}
}

// Drain returns the error of counting the pending jobs (here: the pool is
// closed), not nil.
func TestDrainReturnsCountError(t *testing.T) {
	t.Parallel()
	clk, wait, closePool := drainOne(t, queue.DrainConfig{})
	closePool()
	clk.Advance(time.Second)
	if _, err := wait(); err == nil || !strings.Contains(err.Error(), "count pending") {
		t.Fatalf("Drain after its pool closed = %v, want the count's error", err)
	}
}

func TestDrainConfigValidate(t *testing.T) {
	t.Parallel()
	if err := (queue.DrainConfig{MaxDuration: -time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "queue.DrainConfig.MaxDuration") {
		t.Fatalf("Validate = %v, want an error naming MaxDuration", err)
	}
}
