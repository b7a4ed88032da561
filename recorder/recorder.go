// Package recorder writes the checks of fetch jobs behind the jobs, with
// group commit: the checks of concurrent jobs in one process share one
// statement of the store (sources.RecordCheckBatch). A worker builds one
// Recorder on a pool of its own (ConfigurePool).
package recorder

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetpace/fleetpace/clock"
	"github.com/fleetpace/fleetpace/internal/dbconn"
	"github.com/fleetpace/fleetpace/sources"
)

// ErrStopped is returned by Recorder.Record after Stop (or after the
// context given to Start ended), and by Start on a stopped Recorder.
var ErrStopped = errors.New("recorder: stopped")

// DefaultMaxBatch is Config.MaxBatch's default.
const DefaultMaxBatch = 256

// Config configures a Recorder. The zero value means every default.
type Config struct {
	// MaxBatch is the most checks one statement records. Default 256.
	MaxBatch int
	// MaxQueued is how many checks Submit leaves waiting before it makes its
	// caller wait for the write like Record does (backpressure when the
	// database is slower than the jobs). Default 4 × MaxBatch.
	MaxQueued int
	// Logger receives failed writes of submitted checks. Default: discard.
	Logger *slog.Logger
	// Worker names the process in the history rows of its checks (a check's
	// own sources.Check.Worker wins). Default: "".
	Worker string
	// NoHistory turns the history rows off: checks are recorded without
	// them (when the scan keeps no history, or to measure their cost).
	NoHistory bool
	// HistoryPause is how long the Recorder writes checks without their
	// history after a history write failed (each failure otherwise costs a
	// second statement per batch). Default DefaultHistoryPause.
	HistoryPause time.Duration
	// OutageRetry is how long submitted checks whose statement failed
	// because the database could not be reached (dbconn.IsUnavailable: an
	// outage, a failover) are kept and written again once it answers,
	// retried every 100 ms, doubling to 1 s: a check fetched during an
	// outage is then not fetched again. Kept beyond it, they are dropped
	// (Stats.Failed; the scan re-queues their sources). Default
	// DefaultOutageRetry; negative: dropped at the first failure.
	OutageRetry time.Duration
	// Linger is how long the Recorder waits for more submitted checks
	// before it writes a batch smaller than MaxBatch. Submit's callers do
	// not wait for their checks, so a batch gathered over a millisecond or
	// two costs them nothing and the database one statement for dozens of
	// checks instead of for a handful (the statement's fixed cost is most
	// of a small batch's: 0.24 ms for one check, 0.51 ms for six, in
	// bench worker). A batch someone waits for (Record, Flush) is written
	// at once. Default DefaultLinger; negative: none.
	Linger time.Duration
	// Clock times HistoryPause, OutageRetry and Linger. Default (nil): the
	// real clock.
	Clock clock.Clock
}

// Defaults of Config.
const (
	DefaultHistoryPause = time.Minute
	DefaultOutageRetry  = 2 * time.Minute
	DefaultLinger       = 2 * time.Millisecond
)

// Bounds of the wait between two writes of checks kept through an outage.
const (
	minOutageWait = 100 * time.Millisecond
	maxOutageWait = time.Second
)

func (c *Config) validate() error {
	if c.MaxBatch < 0 {
		return fmt.Errorf("recorder: Config.MaxBatch must be ≥ 0, got %d", c.MaxBatch)
	}
	if c.MaxQueued < 0 {
		return fmt.Errorf("recorder: Config.MaxQueued must be ≥ 0, got %d", c.MaxQueued)
	}
	if c.HistoryPause < 0 {
		return fmt.Errorf("recorder: Config.HistoryPause must be ≥ 0, got %s", c.HistoryPause)
	}
	if c.Linger > time.Second {
		return fmt.Errorf("recorder: Config.Linger must be at most 1s, got %s", c.Linger)
	}
	return nil
}

// Recorder records fetch checks with group commit: the checks of concurrent
// callers in one process share one autocommit statement (sources.RecordChecks)
// instead of one round trip and one commit each. Its loop takes whatever is
// queued (at most MaxBatch), writes it, and while that statement runs the
// next batch gathers; checks nobody waits for (Submit) are gathered for
// Linger more first. A caller who waits (Record) adds no delay: with one
// such caller at a time it is one statement per check, as
// sources.RecordCheck is. Each check's history row
// is written by the same statement, unless NoHistory.
//
// ConfigurePool sets up its pool: with asyncCommit (what a worker does
// unless --recorder-sync-commit) the last checks' durability is traded for
// speed (a check lost with its commit is recovered like any check the
// Recorder loses, see Submit); without, the server's synchronous_commit
// applies.
//
// A Recorder is started once and stopped once; Stop writes what is already
// queued before it returns, within the bound of its context.
type Recorder struct {
	pool      *pgxpool.Pool
	maxBatch  int
	maxQueued int
	logger    *slog.Logger
	worker    string
	history   bool
	pause     time.Duration
	clock     clock.Clock

	outageRetry time.Duration
	linger      time.Duration
	// historyAfter is when history rows are written again after a failure
	// (zero: now); only the loop uses it.
	historyAfter time.Time

	mu      sync.Mutex
	queue   []*recordRequest
	started bool
	stopped bool // no more requests are accepted

	wake     chan struct{} // a request was queued (capacity 1)
	stopping chan struct{} // closed by Stop
	stopOnce sync.Once
	done     chan struct{} // closed when the loop has exited

	// abort cancels every statement of the loop, current and to come: Stop
	// calls it when its context ends first. Set by Start.
	abort context.CancelFunc
	run   context.Context // the statements' base context, cancelled by abort

	batches, records, skipped, failed, refused, historyFailed atomic.Int64
}

type recordRequest struct {
	ctx    context.Context
	rec    sources.CheckRecord
	done   chan error // capacity 1: the loop never blocks on it; nil for a submitted check
	marker bool       // Flush's marker: no check, only a place in the queue
	kept   time.Time  // a submitted check kept through an outage: when its first write failed
}

// New builds a Recorder writing through pool. Call Start before Record.
func New(pool *pgxpool.Pool, cfg Config) (*Recorder, error) {
	if pool == nil {
		return nil, errors.New("recorder: New: pool is required")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.MaxBatch = cmp.Or(cfg.MaxBatch, DefaultMaxBatch)
	cfg.MaxQueued = cmp.Or(cfg.MaxQueued, 4*cfg.MaxBatch)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.HistoryPause = cmp.Or(cfg.HistoryPause, DefaultHistoryPause)
	cfg.OutageRetry = cmp.Or(cfg.OutageRetry, DefaultOutageRetry)
	cfg.Linger = cmp.Or(cfg.Linger, DefaultLinger)
	return &Recorder{
		pool: pool, maxBatch: cfg.MaxBatch, maxQueued: cfg.MaxQueued, logger: cfg.Logger,
		worker: cfg.Worker, history: !cfg.NoHistory, pause: cfg.HistoryPause, clock: clock.Or(cfg.Clock), outageRetry: cfg.OutageRetry,
		linger: cfg.Linger, wake: make(chan struct{}, 1), stopping: make(chan struct{}), done: make(chan struct{}),
	}, nil
}

// Start starts the recording loop. The loop runs until Stop is called or ctx
// ends (which is a Stop: what is queued is still written). Statements do not
// run under ctx: each runs until it is done or every caller waiting for it
// has given up (see Record). Pass context.WithoutCancel(ctx) to stop the
// Recorder only with Stop, e.g. after the River client whose jobs use it.
func (r *Recorder) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.stopped:
		return ErrStopped
	case r.started:
		return errors.New("recorder: already started")
	}
	r.started = true
	r.run, r.abort = context.WithCancel(context.WithoutCancel(ctx))
	go r.loop(ctx)
	return nil
}

// Stop stops accepting checks, writes those already queued, and returns once
// the loop has exited. It is safe to call more than once, and before Start.
//
// ctx bounds the wait. When it ends first, Stop cancels the statement
// running and the ones still to come, even those holding submitted checks,
// and returns an error wrapping ctx's that says how many checks it gave up
// (counted in Stats.Failed too). Those checks are lost: not written, or, for
// a statement the server was already running, possibly written (the
// connection is dropped, not the statement). A lost check's source stays
// queued for a completed job until the scan's reconciliation releases it
// (after a minute) and it is fetched again.
func (r *Recorder) Stop(ctx context.Context) error {
	r.mu.Lock()
	started := r.started
	r.stopped = true
	r.mu.Unlock()
	r.stopOnce.Do(func() { close(r.stopping) })
	if !started {
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
	}
	failed := r.failed.Load()
	r.abort()
	<-r.done
	return fmt.Errorf("recorder: stop: %w; gave up %d submitted check(s) (the scan re-queues their sources)",
		ctx.Err(), r.failed.Load()-failed)
}

// Record records one check and returns once the statement that holds it has
// committed, with that statement's error (the same error for every check of
// the batch), except that a check the database refused on its own gets its
// own error, wrapping sources.ErrCheckRefused, and the batch's other checks
// none (see sources.RecordChecks: the batch is written again row by row).
// It returns ErrStopped if the Recorder was not started or is stopped.
//
// If ctx ends first, Record returns ctx's error at once. A check whose ctx
// has ended by the time its batch is taken is not written; if ctx ends while
// its statement runs, the check may or may not have been written (the
// statement is cancelled only when every caller in the batch has given up).
func (r *Recorder) Record(ctx context.Context, sourceID int64, c sources.Check) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.wait(ctx, &recordRequest{ctx: ctx, rec: sources.CheckRecord{SourceID: sourceID, Check: c}, done: make(chan error, 1)})
}

// Submit queues a check to be written in the background and returns at once
// (write-behind): the caller does not wait for the statement, and a failed
// statement is logged and counted (Stats.Failed), not returned. While
// MaxQueued checks are already waiting, Submit waits for its write as Record
// does. It returns ErrStopped if the Recorder was not started or is
// stopped.
//
// What a submitted check risks: a process that dies before the statement
// commits loses the check. The source then stays queued for a job that has
// completed, and the scan tick's reconciliation releases it (after a
// minute), so it is fetched again: at least once, as ever.
func (r *Recorder) Submit(ctx context.Context, sourceID int64, c sources.Check) error {
	r.mu.Lock()
	full := len(r.queue) >= r.maxQueued
	r.mu.Unlock()
	if full {
		return r.Record(ctx, sourceID, c)
	}
	return r.enqueue(&recordRequest{ctx: context.WithoutCancel(ctx), rec: sources.CheckRecord{SourceID: sourceID, Check: c}})
}

// Flush returns once every check queued before it has been written (or its
// statement has failed), or when ctx ends.
func (r *Recorder) Flush(ctx context.Context) error {
	return r.wait(ctx, &recordRequest{ctx: ctx, marker: true, done: make(chan error, 1)})
}

// enqueue adds req to the queue and wakes the loop.
func (r *Recorder) enqueue(req *recordRequest) error {
	r.mu.Lock()
	if !r.started || r.stopped {
		r.mu.Unlock()
		return ErrStopped
	}
	r.queue = append(r.queue, req)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default: // the loop has a wake-up pending already
	}
	return nil
}

// wait enqueues req and waits for its statement (or ctx).
func (r *Recorder) wait(ctx context.Context, req *recordRequest) error {
	if err := r.enqueue(req); err != nil {
		return err
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats counts a Recorder's work since it was built.
type Stats struct {
	Batches int64 // statements run
	Records int64 // checks those statements carried (a duplicate source counts each time)
	Skipped int64 // checks not written because their caller had given up before their batch
	Failed  int64 // submitted checks whose statement failed (not written)
	Refused int64 // submitted checks the database refused, recorded as failed checks instead (see sources.RecordChecks)
	Queued  int   // checks waiting for a batch now (not counting the one being written)
	// HistoryFailed counts checks recorded without their history row
	// because the history write failed.
	HistoryFailed int64
}

// Stats returns the Recorder's counters.
func (r *Recorder) Stats() Stats {
	r.mu.Lock()
	queued := len(r.queue)
	r.mu.Unlock()
	return Stats{Batches: r.batches.Load(), Records: r.records.Load(), Skipped: r.skipped.Load(),
		Failed: r.failed.Load(), Refused: r.refused.Load(), Queued: queued, HistoryFailed: r.historyFailed.Load()}
}

func (r *Recorder) loop(ctx context.Context) {
	defer close(r.done)
	defer r.abort() // release the context
	// After an outage kept checks: the wait before writing them again (new
	// checks do not wake the loop meanwhile); 0: nothing kept.
	var wait time.Duration
	for {
		wake, again := r.wake, (<-chan time.Time)(nil)
		var timer clock.Timer
		if wait > 0 {
			timer = r.clock.NewTimer(wait)
			wake, again = nil, timer.Chan()
		}
		select {
		case <-wake:
		case <-again:
		case <-r.stopping:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if wait == 0 {
			r.gather(ctx)
		}
		last := false
		select {
		case <-r.stopping:
			last = true
		default:
			last = ctx.Err() != nil
		}
		if last {
			// No request can be queued after this: the final drain below
			// sees every one that was.
			r.mu.Lock()
			r.stopped = true
			r.mu.Unlock()
		}
		kept := false
		for !kept {
			batch := r.take()
			if len(batch) == 0 {
				break
			}
			kept = r.flush(r.run, batch, !last)
		}
		if last {
			return
		}
		if kept {
			wait = min(max(2*wait, minOutageWait), maxOutageWait)
		} else {
			wait = 0
		}
	}
}

// gather waits up to Linger for more submitted checks while the queue holds
// fewer than MaxBatch and nobody waits for them (see Config.Linger). Stop,
// ctx, a full batch or a waiter ends the wait at once.
func (r *Recorder) gather(ctx context.Context) {
	if r.linger <= 0 || !r.mayGather() {
		return
	}
	t := r.clock.NewTimer(r.linger)
	defer t.Stop()
	for {
		select {
		case <-t.Chan():
			return
		case <-r.stopping:
			return
		case <-ctx.Done():
			return
		case <-r.wake:
			if !r.mayGather() {
				return
			}
		}
	}
}

// mayGather reports whether the queue holds a batch worth waiting for: some
// checks, fewer than MaxBatch, none of them waited for.
func (r *Recorder) mayGather() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) == 0 || len(r.queue) >= r.maxBatch {
		return false
	}
	for _, q := range r.queue {
		if q.done != nil {
			return false
		}
	}
	return true
}

// take removes up to maxBatch requests from the queue, oldest first.
func (r *Recorder) take() []*recordRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := min(len(r.queue), r.maxBatch)
	if n == 0 {
		return nil
	}
	batch := make([]*recordRequest, n)
	copy(batch, r.queue)
	rest := copy(r.queue, r.queue[n:])
	clear(r.queue[rest:]) // drop references for the garbage collector
	r.queue = r.queue[:rest]
	return batch
}

// flush writes one batch in one statement and tells every waiter the result.
// The statement is cancelled if every waiter gives up while it runs, so a
// stuck statement cannot outlive all of its callers; a batch holding a
// submitted check is not cancelled that way (nobody waits for it, and it
// must be written), only by Stop's bound (base ends). When the database
// could not be reached and mayKeep, the batch's submitted checks are put
// back at the head of the queue to be written again (within OutageRetry of
// their first failure), and flush returns true.
func (r *Recorder) flush(base context.Context, batch []*recordRequest, mayKeep bool) (kept bool) {
	var live, markers []*recordRequest
	submitted := 0
	for _, q := range batch {
		switch {
		case q.marker:
			markers = append(markers, q)
		case q.ctx.Err() != nil:
			r.skipped.Add(1) // its caller has returned already
		default:
			live = append(live, q)
			if q.done == nil {
				submitted++
			}
		}
	}
	var err error
	var refused map[int64]*sources.RefusedCheck
	if len(live) > 0 {
		ctx, cancel := context.WithCancel(base)
		defer cancel()
		var waiting atomic.Int64
		waiting.Store(int64(len(live) - submitted))
		recs := make([]sources.CheckRecord, len(live))
		var unregister []func() bool
		for i, q := range live {
			recs[i] = q.rec
			if recs[i].Check.Worker == "" {
				recs[i].Check.Worker = r.worker
			}
			if submitted == 0 {
				unregister = append(unregister, context.AfterFunc(q.ctx, func() {
					if waiting.Add(-1) == 0 {
						cancel()
					}
				}))
			}
		}
		history := r.history && !r.clock.Now().Before(r.historyAfter)
		var rcs []*sources.RefusedCheck
		rcs, err = sources.RecordCheckBatch(ctx, r.pool, recs, history)
		if errors.Is(err, sources.ErrHistoryNotRecorded) {
			// The checks are written: only their history is lost.
			r.historyFailed.Add(int64(len(live)))
			r.historyAfter = r.clock.Now().Add(r.pause)
			r.logger.Warn("fetch history not recorded (the checks are); writing checks without history for a while",
				"checks", len(live), "for", r.pause, "err", err)
			err = nil
		}
		for _, f := range unregister {
			f()
		}
		r.batches.Add(1)
		r.records.Add(int64(len(live)))
		if err != nil && submitted > 0 && mayKeep && r.keep(live, err) {
			kept = true
			submitted = 0 // kept, not failed
		}
		if err != nil {
			err = fmt.Errorf("recorder: %w", err)
			if submitted > 0 {
				r.failed.Add(int64(submitted))
				r.logger.Warn("checks not recorded; the scan re-queues their sources after a minute",
					"checks", submitted, "err", err)
			} else {
				r.logger.Debug("recording checks failed", "checks", len(live), "err", err)
			}
		}
		refused = make(map[int64]*sources.RefusedCheck, len(rcs))
		for _, rc := range rcs {
			refused[rc.SourceID] = rc
			r.logger.Warn("the database refused a check", "source", rc.SourceID, "recorded_as_failed", !rc.Lost, "err", rc.Err)
		}
	}
	for _, q := range live {
		if kept && q.done == nil {
			continue // to be written again
		}
		qerr := err
		if rc := refused[q.rec.SourceID]; rc != nil && err == nil {
			// One refused row: its own error, nobody else's.
			qerr = fmt.Errorf("recorder: %w", rc)
			if q.done == nil && rc.Lost {
				r.failed.Add(1)
			} else if q.done == nil {
				r.refused.Add(1)
			}
		}
		if q.done != nil {
			q.done <- qerr
		}
	}
	for _, q := range markers {
		q.done <- err
	}
	return kept
}

// keep puts the submitted checks of live back at the head of the queue when
// err says the database could not be reached and none has been kept for
// longer than OutageRetry; it reports whether it did.
func (r *Recorder) keep(live []*recordRequest, err error) bool {
	if r.outageRetry < 0 || !dbconn.IsUnavailable(err) {
		return false
	}
	now := r.clock.Now()
	var again []*recordRequest
	for _, q := range live {
		if q.done != nil {
			continue
		}
		if q.kept.IsZero() {
			q.kept = now
		} else if now.Sub(q.kept) > r.outageRetry {
			return false
		}
		again = append(again, q)
	}
	if again[0].kept.Equal(now) {
		r.logger.Warn("database unreachable: keeping checks to write when it answers", "checks", len(again), "for", r.outageRetry, "err", err)
	}
	r.mu.Lock()
	r.queue = append(again, r.queue...)
	r.mu.Unlock()
	return true
}

// ConfigurePool sets the session settings a Recorder's pool should
// have. Without asyncCommit the server's synchronous_commit applies: on a cluster
// with synchronous standbys, a check the Recorder has written is on a
// standby too, and survives a failover to it. asyncCommit sets
// synchronous_commit off for the pool's sessions: a batch's commit then
// waits neither for the disk nor for a standby, which on a database whose
// commits wait for the disk is what lets a batch of checks cost about what
// a River job's own completion costs. A check lost with such a commit (the
// database crashed, or failed over, within a fraction of a second of it)
// is soft state, recovered: it leaves its source queued for a job that has
// completed, and the scan's reconciliation releases it a minute later to
// be fetched again — exactly what happens to a check lost with a worker
// killed before the Recorder wrote it (Submit). Its history row is lost
// with it. Nothing else is written through that pool.
func ConfigurePool(pc *pgxpool.Config, asyncCommit bool) {
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	if asyncCommit {
		pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "fleetpace-recorder"
	}
}
