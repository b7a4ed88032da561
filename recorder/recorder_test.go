package recorder_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/internal/clocktest"
	"github.com/fleetpace/fleetpace/internal/pgembed"
	"github.com/fleetpace/fleetpace/internal/storetest"
	"github.com/fleetpace/fleetpace/internal/testdb"
	"github.com/fleetpace/fleetpace/recorder"
	"github.com/fleetpace/fleetpace/sources"
)

func TestRecorderConfig(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	if _, err := recorder.New(pool, recorder.Config{MaxBatch: -1}); err == nil || !strings.Contains(err.Error(), "MaxBatch") {
		t.Fatalf("MaxBatch -1: err = %v, want one naming MaxBatch", err)
	}
	if _, err := recorder.New(nil, recorder.Config{}); err == nil {
		t.Fatal("nil pool accepted")
	}
	r, err := recorder.New(pool, recorder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Record(context.Background(), 1, sources.Check{Outcome: "ok"}); !errors.Is(err, recorder.ErrStopped) {
		t.Fatalf("Record before Start: %v, want ErrStopped", err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err == nil {
		t.Fatal("second Start accepted")
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(context.Background()); err != nil { // idempotent
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); !errors.Is(err, recorder.ErrStopped) {
		t.Fatalf("Start after Stop: %v, want ErrStopped", err)
	}
}

type fixture struct {
	ctx  context.Context
	pool *pgxpool.Pool
	rec  *recorder.Recorder
}

// setup starts a Recorder with cfg on a database of the test's own.
func setup(t *testing.T, cfg recorder.Config) *fixture {
	t.Helper()
	f := &fixture{ctx: context.Background(), pool: testdb.Pool(t)}
	rec, err := recorder.New(f.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	f.rec = rec
	return f
}

// sources makes n sources on platform p, each queued for the job of its
// id.
func (f *fixture) sources(t *testing.T, n int) []int64 { return storetest.Queued(t, f.pool, "p", n) }

// checked counts the sources (of ids) whose check landed.
func (f *fixture) checked(t *testing.T, ids []int64) int { return storetest.Checked(t, f.pool, ids) }

// eventually polls cond every 5 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// lockWaiter returns the pid of the recorder's statement once it waits for a
// row lock in this test's database. (pg_stat_activity keeps only the first
// 1 kB of a query: match its start.)
func (f *fixture) lockWaiter(t *testing.T) int {
	t.Helper()
	var pid int
	eventually(t, "the recorder's statement to wait for a row lock", func() bool {
		err := f.pool.QueryRow(f.ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE fleetpace_source%'`).Scan(&pid)
		return err == nil
	})
	return pid
}

// queueBehindLock records the checks of ids with the first one's statement
// blocked on a row lock and the others queued behind it, until release is
// called; waits are the Record calls' results.
func (f *fixture) queueBehindLock(t *testing.T, ids []int64) (release func(), waits []<-chan error) {
	t.Helper()
	release = f.lockRows(t, ids[0])
	first := f.recordAsync(f.ctx, ids[0])
	f.lockWaiter(t)
	for _, id := range ids[1:] {
		waits = append(waits, f.recordAsync(f.ctx, id))
	}
	eventually(t, fmt.Sprintf("%d queued checks", len(ids)-1), func() bool { return f.rec.Stats().Queued == len(ids)-1 })
	return release, append(waits, first)
}

// lockRows locks the given sources in a transaction until release is called.
func (f *fixture) lockRows(t *testing.T, ids ...int64) (release func()) {
	t.Helper()
	tx, err := f.pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `SELECT 1 FROM fleetpace_source WHERE id = ANY($1) FOR UPDATE`, ids); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Commit(f.ctx) }) }
	t.Cleanup(release)
	return release
}

// recordAsync calls Record in a goroutine; the error arrives on the channel.
func (f *fixture) recordAsync(ctx context.Context, id int64) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f.rec.Record(ctx, id, sources.Check{Outcome: "ok", Status: 200}) }()
	return ch
}

// 200 concurrent Record calls all land, committed, in far fewer statements
// than 200: one per call would be 200 batches.
func TestRecorderGroupsConcurrentRecords(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{})
	ids := f.sources(t, 200)
	start := make(chan struct{})
	errs := make(chan error, len(ids))
	for _, id := range ids {
		go func() {
			<-start
			errs <- f.rec.Record(f.ctx, id, sources.Check{Outcome: "ok", Status: 200})
		}()
	}
	close(start)
	for range ids {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := f.checked(t, ids); n != len(ids) {
		t.Fatalf("%d of %d checks landed", n, len(ids))
	}
	st := f.rec.Stats()
	t.Logf("stats: %+v", st)
	if st.Records != int64(len(ids)) || st.Batches >= st.Records/2 {
		t.Fatalf("stats %+v: want %d records in fewer than %d statements", st, len(ids), len(ids)/2)
	}
}

// MaxBatch bounds a statement: 10 checks queued behind a blocked statement
// go out in batches of at most 3.
func TestRecorderMaxBatch(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{MaxBatch: 3})
	ids := f.sources(t, 11)
	release, waits := f.queueBehindLock(t, ids)
	release()
	for _, w := range waits {
		if err := <-w; err != nil {
			t.Fatal(err)
		}
	}
	if n := f.checked(t, ids); n != len(ids) {
		t.Fatalf("%d of %d checks landed", n, len(ids))
	}
	if st := f.rec.Stats(); st.Batches != 1+4 { // {0}, then 3+3+3+1
		t.Fatalf("stats %+v: want 5 statements", st)
	}
}

// Stop writes the checks already queued before it returns; Record after
// Stop fails with ErrStopped and writes nothing.
func TestRecorderStopFlushesQueued(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{})
	ids := f.sources(t, 12)
	queued, late := ids[:11], ids[11]
	release, waits := f.queueBehindLock(t, queued)

	stopped := make(chan struct{})
	go func() {
		if err := f.rec.Stop(f.ctx); err != nil {
			t.Error(err)
		}
		close(stopped)
	}()
	eventually(t, "Record to be refused", func() bool {
		// A probe before Stop took effect is queued, gives up, and is
		// skipped when the final batch is taken.
		ctx, cancel := context.WithTimeout(f.ctx, 10*time.Millisecond)
		defer cancel()
		return errors.Is(f.rec.Record(ctx, late, sources.Check{Outcome: "ok"}), recorder.ErrStopped)
	})
	select {
	case <-stopped:
		t.Fatal("Stop returned while its loop was still writing")
	default:
	}
	release()
	<-stopped
	for _, w := range waits {
		if err := <-w; err != nil {
			t.Fatal(err)
		}
	}
	if n := f.checked(t, queued); n != len(queued) {
		t.Fatalf("%d of %d queued checks landed", n, len(queued))
	}
	if n := f.checked(t, []int64{late}); n != 0 {
		t.Fatal("a check refused after Stop was written")
	}
	if err := f.rec.Record(f.ctx, late, sources.Check{Outcome: "ok"}); !errors.Is(err, recorder.ErrStopped) {
		t.Fatalf("Record after Stop: %v, want ErrStopped", err)
	}
}

// When the statement fails, every caller whose check was in it gets the
// error, and none of the batch is written.
func TestRecorderStatementErrorReachesEveryWaiter(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{})
	ids := f.sources(t, 9)
	f.lockRows(t, ids[0], ids[1])
	first := f.recordAsync(f.ctx, ids[0])
	pid := f.lockWaiter(t)
	var waits []<-chan error
	for _, id := range ids[1:] { // ids[1] is locked too: the second batch waits
		waits = append(waits, f.recordAsync(f.ctx, id))
	}
	eventually(t, "8 queued checks", func() bool { return f.rec.Stats().Queued == 8 })
	cancelBackend := func(pid int) {
		t.Helper()
		if _, err := f.pool.Exec(f.ctx, `SELECT pg_cancel_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
	}
	isCancelled := func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "57014" // query_canceled
	}
	cancelBackend(pid)
	if err := <-first; !isCancelled(err) {
		t.Fatalf("first batch: err = %v, want query_canceled", err)
	}
	eventually(t, "the second batch to wait for a lock", func() bool { return f.rec.Stats().Queued == 0 })
	cancelBackend(f.lockWaiter(t))
	for i, w := range waits {
		if err := <-w; !isCancelled(err) {
			t.Fatalf("waiter %d of the second batch: err = %v, want query_canceled", i, err)
		}
	}
	if st := f.rec.Stats(); st.Batches != 2 || st.Records != 9 {
		t.Fatalf("stats %+v: want 9 checks in 2 statements", st)
	}
	if n := f.checked(t, ids); n != 0 {
		t.Fatalf("%d checks of failed statements were written", n)
	}
}

// closedPoolRecorder returns a started Recorder whose pool is closed: every
// statement fails.
func closedPoolRecorder(t *testing.T) *recorder.Recorder {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := recorder.New(pool, recorder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	pool.Close()
	return rec
}

// A closed pool: the statement fails and Record returns its error (it does
// not hang).
func TestRecorderClosedPool(t *testing.T) {
	t.Parallel()
	rec := closedPoolRecorder(t)
	err := rec.Record(context.Background(), 1, sources.Check{Outcome: "ok"})
	if err == nil || errors.Is(err, recorder.ErrStopped) {
		t.Fatalf("Record on a closed pool: %v, want the statement's error", err)
	}
}

// A caller that gives up before its batch is taken is not written; a
// statement whose every caller gave up is cancelled, freeing the loop.
func TestRecorderCallerGivesUp(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{})
	ids := f.sources(t, 3)
	blocked, skipped, after := ids[0], ids[1], ids[2]
	f.lockRows(t, blocked)

	blockedCtx, giveUpBlocked := context.WithCancel(f.ctx)
	defer giveUpBlocked()
	first := f.recordAsync(blockedCtx, blocked)
	f.lockWaiter(t)
	skipCtx, giveUpSkipped := context.WithCancel(f.ctx)
	second := f.recordAsync(skipCtx, skipped)
	eventually(t, "1 queued check", func() bool { return f.rec.Stats().Queued == 1 })
	giveUpSkipped()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("Record after its ctx ended: %v, want context.Canceled", err)
	}
	// The only caller of the blocked statement gives up: the statement is
	// cancelled, and the loop goes on (the row lock is still held).
	giveUpBlocked()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("blocked Record after its ctx ended: %v, want context.Canceled", err)
	}
	if err := f.rec.Record(f.ctx, after, sources.Check{Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	if n := f.checked(t, []int64{skipped, after}); n != 1 {
		t.Fatalf("%d of {skipped, after} written, want only after", n)
	}
	if st := f.rec.Stats(); st.Skipped != 1 {
		t.Fatalf("stats %+v: want 1 skipped", st)
	}
}

// Submit writes behind its caller: it returns while the statement that will
// hold its check is still blocked, the checks of many callers share
// statements, and Flush returns once all of them have landed.
func TestRecorderSubmitWritesBehind(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{})
	ids := f.sources(t, 50)
	release := f.lockRows(t, ids[0])
	for _, id := range ids {
		if err := f.rec.Submit(f.ctx, id, sources.Check{Outcome: "ok", Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	f.lockWaiter(t) // the first statement is blocked, and every Submit has returned
	if n := f.checked(t, ids); n != 0 {
		t.Fatalf("%d checks landed through a locked row", n)
	}
	release()
	if err := f.rec.Flush(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.checked(t, ids); n != len(ids) {
		t.Fatalf("after Flush: %d of %d checks landed", n, len(ids))
	}
	if st := f.rec.Stats(); st.Records != 50 || st.Batches > 10 || st.Failed != 0 {
		t.Fatalf("stats %+v: want 50 checks in a few statements", st)
	}
}

// While MaxQueued checks wait, Submit waits for its write like Record: the
// database's pace, not the jobs', bounds the queue.
func TestRecorderSubmitBackpressure(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{MaxQueued: 5})
	ids := f.sources(t, 7)
	release := f.lockRows(t, ids[0])
	if err := f.rec.Submit(f.ctx, ids[0], sources.Check{Outcome: "ok", Status: 200}); err != nil {
		t.Fatal(err)
	}
	f.lockWaiter(t)
	for _, id := range ids[1:6] {
		if err := f.rec.Submit(f.ctx, id, sources.Check{Outcome: "ok", Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(f.ctx, 300*time.Millisecond)
	defer cancel()
	if err := f.rec.Submit(ctx, ids[6], sources.Check{Outcome: "ok", Status: 200}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Submit with 5 checks queued: %v, want it to wait (and time out)", err)
	}
	release()
	if err := f.rec.Flush(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.checked(t, ids[:6]); n != 6 {
		t.Fatalf("%d of the 6 submitted checks landed", n)
	}
}

// A failed statement of submitted checks reaches nobody's return value: it
// is counted, and Flush reports it.
func TestRecorderSubmitFailureCounted(t *testing.T) {
	t.Parallel()
	rec := closedPoolRecorder(t)
	for id := range int64(3) {
		if err := rec.Submit(context.Background(), id+1, sources.Check{Outcome: "ok"}); err != nil {
			t.Fatalf("Submit: %v, want nil (written behind)", err)
		}
	}
	_ = rec.Flush(context.Background()) // the last statement's error, if it rode with it
	if st := rec.Stats(); st.Failed != 3 {
		t.Fatalf("stats %+v: want 3 failed checks", st)
	}
}

// Stop is bounded by its context: when the bound has passed while a
// statement of submitted checks waits for a lock, Stop gives it up and the
// rest, says how many checks it gave up, and returns without waiting for
// the lock. Unbounded (the Recorder before Stop took a context), it waited
// for as long as the lock was held.
func TestRecorderStopBounded(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{})
	ids := f.sources(t, 5)
	f.lockRows(t, ids[0]) // released when the test ends
	for _, id := range ids {
		if err := f.rec.Submit(f.ctx, id, sources.Check{Outcome: "ok", Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	f.lockWaiter(t) // the statement holding the first check waits for the lock
	ctx, cancel := context.WithCancel(f.ctx)
	cancel() // the bound has passed
	done := make(chan error, 1)
	go func() { done <- f.rec.Stop(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "gave up 5 submitted check(s)") {
			t.Fatalf("Stop past its bound = %v, want context.Canceled and 5 lost checks", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Stop waited for a blocked statement past its bound")
	}
	if st := f.rec.Stats(); st.Failed != 5 {
		t.Fatalf("stats %+v: want the 5 lost checks counted as failed", st)
	}
}

// A Recorder's pool honours the server's synchronous_commit (here the
// database's own, remote_apply, as a cluster with a synchronous standby
// might have it) unless told otherwise; asked for async commits, its
// sessions commit with synchronous_commit off.
func TestRecorderPoolHonoursSynchronousCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	admin := testdb.PoolOf(t, url)
	if _, err := admin.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = remote_apply', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		async bool
		want  string
	}{{false, "remote_apply"}, {true, "off"}} {
		pc, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		recorder.ConfigurePool(pc, tc.async)
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got)
		pool.Close()
		if err != nil || got != tc.want {
			t.Errorf("recorder pool (async %v): synchronous_commit %q %v, want %q", tc.async, got, err, tc.want)
		}
	}
}

// Submitted checks whose statement fails because the database is down (a
// restart, a failover) are kept and written once it answers again: none
// is lost, none counted failed. With OutageRetry negative they are dropped
// at the first failure.
func TestRecorderKeepsChecksThroughAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := testdb.Private(t, pgembed.Config{})
	pool, err := pgxpool.New(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	f := &fixture{ctx: ctx, pool: pool}
	ids := f.sources(t, 6)
	keeping, err := recorder.New(pool, recorder.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dropping, err := recorder.New(pool, recorder.Config{OutageRetry: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []*recorder.Recorder{keeping, dropping} {
		if err := rec.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rec.Stop(context.Background()) })
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		rec := keeping
		if i >= 3 {
			rec = dropping
		}
		if err := rec.Submit(ctx, id, sources.Check{Outcome: "ok", Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the keeping recorder tried and kept its checks; the other dropped its own", func() bool {
		k, d := keeping.Stats(), dropping.Stats()
		return k.Batches >= 2 && k.Queued == 3 && k.Failed == 0 && d.Failed == 3
	})
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the kept checks written once the database is back", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM fleetpace_source WHERE id = ANY($1) AND last_outcome = 'ok' AND queued_at IS NULL`,
			ids[:3]).Scan(&n)
		return err == nil && n == 3
	})
	if st := keeping.Stats(); st.Failed != 0 || st.Queued != 0 {
		t.Fatalf("keeping recorder after the outage: %+v, want nothing failed or left", st)
	}
	if n := f.checked(t, ids[3:]); n != 0 {
		t.Fatalf("%d checks of the dropping recorder landed", n)
	}
}

// benchDB is a fresh database with n sources, and a pool big enough for
// every benchmark goroutine to have a connection (as the worker's pool has:
// concurrency + 5). Each run gets its own: a source update also writes the
// due index (not a HOT update), so runs on one table would slow down one
// after the other until a vacuum.
func benchDB(b *testing.B, n int) (*pgxpool.Pool, []int64) {
	b.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testdb.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 15
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := sources.SetPlatform(ctx, pool, sources.Platform{Name: "p", RatePerSec: 10}); err != nil {
		b.Fatal(err)
	}
	rows, err := pool.Query(ctx, `INSERT INTO fleetpace_source (platform, url)
		SELECT 'p', 'https://p.example/' || i FROM generate_series(1, $1) i RETURNING id`, n)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE fleetpace_source`); err != nil {
		b.Fatal(err)
	}
	return pool, ids
}

var benchCheck = sources.Check{Outcome: "ok", Status: 200, ETag: `"e"`, ContentHash: "h"}

// BenchmarkRecordConcurrent: 10 goroutines record checks (each on sources of
// its own), directly (one statement each) or through a Recorder (shared
// statements). Reports records/s.
func BenchmarkRecordConcurrent(b *testing.B) {
	const goroutines, perGoroutine = 10, 1000
	run := func(b *testing.B, record func(ctx context.Context, id int64) error, ids []int64) {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, goroutines)
		b.ResetTimer()
		start := time.Now()
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				own := ids[g*perGoroutine : (g+1)*perGoroutine]
				for i := 0; next.Add(1) <= int64(b.N); i++ {
					if err := record(context.Background(), own[i%len(own)]); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
		select {
		case err := <-errs:
			b.Fatal(err)
		default:
		}
	}
	b.Run("RecordCheck", func(b *testing.B) {
		pool, ids := benchDB(b, goroutines*perGoroutine)
		run(b, func(ctx context.Context, id int64) error { return sources.RecordCheck(ctx, pool, id, benchCheck) }, ids)
	})
	b.Run("Recorder", func(b *testing.B) {
		pool, ids := benchDB(b, goroutines*perGoroutine)
		rec, err := recorder.New(pool, recorder.Config{})
		if err != nil {
			b.Fatal(err)
		}
		if err := rec.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		defer rec.Stop(context.Background()) //nolint:errcheck // benchmark cleanup
		run(b, func(ctx context.Context, id int64) error { return rec.Record(ctx, id, benchCheck) }, ids)
		st := rec.Stats()
		b.ReportMetric(float64(st.Records)/float64(max(st.Batches, 1)), "records/batch")
	})
}

// BenchmarkRecordSingle: one check at a time, with the single-row statement
// (RecordCheck) or a batch of one (RecordChecks).
func BenchmarkRecordSingle(b *testing.B) {
	ctx := context.Background()
	b.Run("RecordCheck", func(b *testing.B) {
		pool, ids := benchDB(b, 10000)
		for i := 0; b.Loop(); i++ {
			if err := sources.RecordCheck(ctx, pool, ids[i%len(ids)], benchCheck); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("RecordChecks1", func(b *testing.B) {
		pool, ids := benchDB(b, 10000)
		for i := 0; b.Loop(); i++ {
			if err := sources.RecordChecks(ctx, pool, []sources.CheckRecord{{SourceID: ids[i%len(ids)], Check: benchCheck}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Through the Recorder: each caller gets its own row's result, and a
// submitted check the database refuses is counted as refused, not failed.
func TestRecorderRefusedRow(t *testing.T) {
	t.Parallel()
	f := setup(t, recorder.Config{})
	storetest.RefuseETag(t, f.pool)
	ids := f.sources(t, 6)
	release := f.lockRows(t, ids...) // every check waits, so they share batches
	var waits []<-chan error
	for i, id := range ids[:5] {
		etag := `"fine"`
		if i == 2 {
			etag = `"boom"`
		}
		ch := make(chan error, 1)
		go func() { ch <- f.rec.Record(f.ctx, id, sources.Check{Outcome: "ok", Status: 200, ETag: etag}) }()
		waits = append(waits, ch)
	}
	if err := f.rec.Submit(f.ctx, ids[5], sources.Check{Outcome: "ok", ETag: `"boom"`}); err != nil {
		t.Fatal(err)
	}
	f.lockWaiter(t)
	release()
	for i, w := range waits {
		err := <-w
		if i == 2 && !errors.Is(err, sources.ErrCheckRefused) {
			t.Errorf("refused row: Record = %v, want ErrCheckRefused", err)
		}
		if i != 2 && err != nil {
			t.Errorf("row %d: Record = %v, want nil (another row was refused)", i, err)
		}
	}
	if err := f.rec.Flush(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.checked(t, ids); n != 4 {
		t.Fatalf("%d checks landed as ok, want the 4 good ones", n)
	}
	if st := f.rec.Stats(); st.Refused != 1 || st.Failed != 0 {
		t.Fatalf("stats %+v: want the submitted refused check counted as refused", st)
	}
}

// The Recorder stamps its worker on the history rows, or writes none with
// NoHistory.
func TestRecorderHistory(t *testing.T) {
	t.Parallel()
	for _, noHistory := range []bool{false, true} {
		f := setup(t, recorder.Config{Worker: "host-1-abcd", NoHistory: noHistory})
		ids := f.sources(t, 3)
		for _, id := range ids {
			if err := f.rec.Submit(f.ctx, id, sources.Check{Outcome: "ok", Status: 200}); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.rec.Flush(f.ctx); err != nil {
			t.Fatal(err)
		}
		var n, stamped int
		if err := f.pool.QueryRow(f.ctx, `SELECT count(*), count(*) FILTER (WHERE worker = 'host-1-abcd') FROM fleetpace_check`).Scan(&n, &stamped); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: 3, true: 0}[noHistory]; n != want || stamped != want {
			t.Fatalf("NoHistory %v: %d history rows (%d stamped), want %d", noHistory, n, stamped, want)
		}
		if got := f.checked(t, ids); got != 3 {
			t.Fatalf("NoHistory %v: %d checks written, want 3", noHistory, got)
		}
	}
}

// A history write that fails never loses the check: the Recorder counts
// it, reports success to its callers and writes the next batches without
// history for HistoryPause.
func TestRecorderHistoryFailure(t *testing.T) {
	t.Parallel()
	ctx, pool := context.Background(), testdb.Pool(t)
	more := storetest.Queued(t, pool, "p", 3)
	storetest.BreakHistory(t, pool)
	clk := clocktest.New()
	rec, err := recorder.New(pool, recorder.Config{Clock: clk, HistoryPause: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer rec.Stop(context.Background()) //nolint:errcheck // test cleanup
	if err := rec.Record(ctx, more[0], sources.Check{Outcome: "ok"}); err != nil {
		t.Fatalf("Record with a broken history: %v, want nil (the check is written)", err)
	}
	if st := rec.Stats(); st.HistoryFailed != 1 || storetest.Checked(t, pool, more[:1]) != 1 {
		t.Fatalf("stats %+v: want 1 history failure and the check written", st)
	}
	storetest.Exec(t, pool, `ALTER TABLE fleetpace_check DROP CONSTRAINT test_broken`)
	if err := rec.Record(ctx, more[1], sources.Check{Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	if n := storetest.HistoryRows(t, pool, more[1]); n != 0 {
		t.Fatalf("within HistoryPause the Recorder wrote %d history rows, want none", n)
	}
	clk.Advance(time.Minute)
	if err := rec.Record(ctx, more[2], sources.Check{Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	if n := storetest.HistoryRows(t, pool, more[2]); n != 1 {
		t.Fatalf("after HistoryPause the Recorder wrote %d history rows, want 1", n)
	}
}

// Submitted checks are gathered for Linger before they are written: five
// submitted one after another go out in one statement once the linger
// ends (on a fake clock: nothing is written before it moves), and a caller
// that waits (Record) ends the linger at once. With Linger negative (the
// control), a submitted check is written without the clock moving.
func TestRecorderLingerGathersSubmittedChecks(t *testing.T) {
	t.Parallel()
	clk := clocktest.New()
	f := setup(t, recorder.Config{Clock: clk})
	ids := f.sources(t, 7)
	if err := f.rec.Submit(f.ctx, ids[0], sources.Check{Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	clocktest.WaitSleepers(t, clk, 1) // the loop lingers
	for _, id := range ids[1:5] {
		if err := f.rec.Submit(f.ctx, id, sources.Check{Outcome: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	if st := f.rec.Stats(); st.Batches != 0 || f.checked(t, ids) != 0 {
		t.Fatalf("stats %+v: written before the linger ended", st)
	}
	clk.Advance(recorder.DefaultLinger)
	eventually(t, "the five checks", func() bool { return f.rec.Stats().Records == 5 })
	if st := f.rec.Stats(); st.Batches != 1 || f.checked(t, ids[:5]) != 5 {
		t.Fatalf("stats %+v: want the five checks in one statement", st)
	}

	// A caller who waits is not kept waiting by a linger.
	if err := f.rec.Submit(f.ctx, ids[5], sources.Check{Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	clocktest.WaitSleepers(t, clk, 1)
	if err := f.rec.Record(f.ctx, ids[6], sources.Check{Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the seventh check counted", func() bool { return f.rec.Stats().Records == 7 })
	if st := f.rec.Stats(); st.Batches != 2 {
		t.Fatalf("stats %+v: want the submitted and the recorded check in a second statement", st)
	}

	// The control: no linger, no waiting for the clock.
	g := setup(t, recorder.Config{Clock: clocktest.New(), Linger: -1})
	more := g.sources(t, 1)
	if err := g.rec.Submit(g.ctx, more[0], sources.Check{Outcome: "ok"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the check written without lingering", func() bool { return g.checked(t, more) == 1 })
}
