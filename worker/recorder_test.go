package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"go.uber.org/goleak"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/poller"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/recorder"
	"github.com/fleetpace/fleetpace/sources"
	"github.com/fleetpace/fleetpace/worker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.M(m)) }

// grantAll is a pacer that grants every reservation at once, under a
// multiplier of grantAllMultiplier.
type grantAll struct{}

const grantAllMultiplier = 1.5

func (grantAll) Reserve(_ context.Context, platform string, _ time.Duration) (pacer.Reservation, error) {
	return pacer.Reservation{Platform: platform, Granted: true, Multiplier: grantAllMultiplier}, nil
}

func (grantAll) Sleep(context.Context, *pacer.Reservation) error { return nil }

func (g grantAll) Acquire(ctx context.Context, platform string, maxWait time.Duration) (pacer.Reservation, error) {
	return pacer.AcquireFrom(ctx, g, clock.Real(), platform, maxWait)
}

func (grantAll) Report(context.Context, string, pacer.Reservation, pacer.Feedback) (pacer.ReportResult, error) {
	return pacer.ReportResult{}, nil
}

func outcome(t *testing.T, pool *pgxpool.Pool, id int64) fetch.Outcome {
	t.Helper()
	s, err := sources.GetSource(context.Background(), pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if s.LastOutcome == nil || s.QueuedAt != nil {
		return "" // not recorded
	}
	return *s.LastOutcome
}

// Fetch jobs record their checks through the Recorder when one is set (and
// directly otherwise); a rate-limited job keeps its transaction with the
// cooldown and bypasses the Recorder.
func TestFetchWorkerRecorder(t *testing.T) {
	t.Parallel()
	for _, withRecorder := range []bool{true, false} {
		t.Run(fmt.Sprintf("recorder=%t", withRecorder), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			var rec *recorder.Recorder
			if withRecorder {
				var err error
				rec, err = recorder.New(pool, recorder.Config{})
				if err != nil {
					t.Fatal(err)
				}
				if err := rec.Start(ctx); err != nil {
					t.Fatal(err)
				}
				defer rec.Stop(context.Background()) //nolint:errcheck // test cleanup
			}
			fetcher := fetch.FetcherFunc(func(_ context.Context, req fetch.Request) fetch.Result {
				if req.Platform == "limited" {
					return fetch.Result{Outcome: fetch.RateLimited, Status: 429, Reason: "stop"}
				}
				return fetch.Result{Outcome: fetch.OK, Status: 200, ETag: `"e"`}
			})
			fw, err := worker.NewFetchWorker(worker.JobConfig{Pool: pool, Pacer: grantAll{}, Fetcher: fetcher, Recorder: rec})
			if err != nil {
				t.Fatal(err)
			}
			ok := storetest.Queued(t, pool, "ok", 20)
			limited := storetest.Queued(t, pool, "limited", 1)[0]
			job := func(id int64, platform string) *river.Job[queue.FetchArgs] {
				return &river.Job[queue.FetchArgs]{JobRow: &rivertype.JobRow{ID: id, Attempt: 1},
					Args: queue.FetchArgs{SourceID: id, Platform: platform, URL: fmt.Sprintf("https://%s.example/x", platform)}}
			}
			var wg sync.WaitGroup
			errs := make(chan error, len(ok))
			for _, id := range ok {
				wg.Go(func() { errs <- fw.Work(ctx, job(id, "ok")) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := fw.Work(ctx, job(limited, "limited")); err != nil {
				t.Fatal(err)
			}
			if withRecorder {
				// Written behind the jobs: wait for the writes.
				if err := rec.Flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range ok {
				if o := outcome(t, pool, id); o != "ok" {
					t.Fatalf("source %d: outcome %q, want ok", id, o)
				}
			}
			if o := outcome(t, pool, limited); o != "rate_limited" {
				t.Fatalf("rate-limited source: outcome %q", o)
			}
			cds, err := sources.ActiveCooldowns(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			if len(cds) != 1 || cds[0].Platform != "limited" {
				t.Fatalf("cooldowns %+v, want one for platform limited", cds)
			}
			if withRecorder {
				if st := rec.Stats(); st.Records != int64(len(ok)) {
					t.Fatalf("recorder stats %+v: want exactly the %d ok checks", st, len(ok))
				}
			}
		})
	}
}

// A job still fetching when the worker is told to stop finishes within the
// soft stop and its check is written: Run stops the Recorder only after the
// River client. The job is let go only once the worker has logged that it
// stops River (after its loops ended, before River's stop), so it finishes
// during the stop: were the Recorder stopped before River, its check would
// be refused (recorder.ErrStopped) and never written.
func TestRunRecordsChecksOfJobsFinishingAtShutdown(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	pool := testdb.PoolOf(t, url)
	id := storetest.Queued(t, pool, "p", 1)[0]
	if _, err := pool.Exec(context.Background(), `UPDATE fleetpace_source SET queued_at = NULL, queued_job_id = NULL`); err != nil {
		t.Fatal(err)
	}

	started, release, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	fetcher := fetch.FetcherFunc(func(context.Context, fetch.Request) fetch.Result {
		once.Do(func() { close(started) })
		<-release // not ctx: the job goes on after shutdown begins
		defer close(returned)
		return fetch.Result{Outcome: fetch.OK, Status: 200}
	})
	stopping := make(chan struct{})
	logger := slog.New(&signalHandler{msg: "stopping: no new jobs; running fetches may finish", ch: stopping})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	_, done := runWorker(t, ctx, worker.Config{DatabaseURL: url, Fetcher: fetcher, SoftStop: 30 * time.Second, Logger: logger})
	await(t, started, "the job's fetch")
	stop()
	await(t, stopping, "the worker to begin stopping River")
	close(release)
	<-returned
	if err := await(t, done, "the worker to stop"); err != nil {
		t.Fatal(err)
	}
	if o := outcome(t, pool, id); o != "ok" {
		t.Fatalf("check of the job that finished during shutdown: outcome %q, want ok", o)
	}
}

// runWorker runs worker.Run(ctx, cfg) in a goroutine, without startup
// jitter, and waits until it is ready; it returns the HTTP server's address
// (nil without one) and the channel Run's result arrives on.
func runWorker(t *testing.T, ctx context.Context, cfg worker.Config) (net.Addr, <-chan error) {
	t.Helper()
	cfg.Poll.StartupJitter = poller.NoStartupJitter
	ready := make(chan net.Addr, 1)
	cfg.Ready = func(addr net.Addr) { ready <- addr }
	done := make(chan error, 1)
	go func() { done <- worker.Run(ctx, cfg) }()
	select {
	case addr := <-ready:
		return addr, done
	case err := <-done:
		t.Fatalf("worker exited before it was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker not ready within 30 s")
	}
	return nil, done
}

// await returns what arrives on ch, failing the test if nothing does within
// 60 s.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(60 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// signalHandler is a slog handler that closes ch when a record with message
// msg is logged, and drops every record.
type signalHandler struct {
	msg  string
	ch   chan struct{}
	once sync.Once
}

func (h *signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *signalHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *signalHandler) WithGroup(string) slog.Handler            { return h }
func (h *signalHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.ch) })
	}
	return nil
}
