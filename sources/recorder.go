package sources

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrRecorderStopped is returned by Recorder.Record after Stop (or after the
// context given to Start ended), and by Start on a stopped Recorder.
var ErrRecorderStopped = errors.New("sources: recorder stopped")

// DefaultMaxBatch is RecorderConfig.MaxBatch's default.
const DefaultMaxBatch = 256

// RecorderConfig configures a Recorder. The zero value means every default.
type RecorderConfig struct {
	// MaxBatch is the most checks one statement records. Default 256.
	MaxBatch int
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c *RecorderConfig) validate() error {
	if c.MaxBatch < 0 {
		return fmt.Errorf("sources: RecorderConfig.MaxBatch must be ≥ 0, got %d", c.MaxBatch)
	}
	return nil
}

// Recorder records fetch checks with group commit: the checks of concurrent
// callers in one process share one autocommit statement (RecordChecks)
// instead of one round trip and one commit each. It adds no delay: its loop
// takes whatever is queued (at most MaxBatch), writes it, and while that
// statement runs the next batch gathers. With one caller at a time it is one
// statement per check, as RecordCheck is.
//
// A Recorder is started once and stopped once; Stop writes what is already
// queued before it returns.
type Recorder struct {
	pool     *pgxpool.Pool
	maxBatch int
	logger   *slog.Logger

	mu      sync.Mutex
	queue   []*recordRequest
	started bool
	stopped bool // no more requests are accepted

	wake     chan struct{} // a request was queued (capacity 1)
	stopping chan struct{} // closed by Stop
	stopOnce sync.Once
	done     chan struct{} // closed when the loop has exited

	batches, records, skipped atomic.Int64
}

type recordRequest struct {
	ctx  context.Context
	rec  CheckRecord
	done chan error // capacity 1: the loop never blocks on it
}

// NewRecorder builds a Recorder writing through pool. Call Start before Record.
func NewRecorder(pool *pgxpool.Pool, cfg RecorderConfig) (*Recorder, error) {
	if pool == nil {
		return nil, errors.New("sources: NewRecorder: pool is required")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Recorder{
		pool: pool, maxBatch: cfg.MaxBatch, logger: cfg.Logger,
		wake: make(chan struct{}, 1), stopping: make(chan struct{}), done: make(chan struct{}),
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
		return ErrRecorderStopped
	case r.started:
		return errors.New("sources: recorder already started")
	}
	r.started = true
	go r.loop(ctx)
	return nil
}

// Stop stops accepting checks, writes those already queued, and returns once
// the loop has exited. It is safe to call more than once, and before Start.
func (r *Recorder) Stop() {
	r.mu.Lock()
	started := r.started
	r.stopped = true
	r.mu.Unlock()
	r.stopOnce.Do(func() { close(r.stopping) })
	if started {
		<-r.done
	}
}

// Record records one check and returns once the statement that holds it has
// committed, with that statement's error (the same error for every check of
// the batch). It returns ErrRecorderStopped if the Recorder was not started
// or is stopped.
//
// If ctx ends first, Record returns ctx's error at once. A check whose ctx
// has ended by the time its batch is taken is not written; if ctx ends while
// its statement runs, the check may or may not have been written (the
// statement is cancelled only when every caller in the batch has given up).
func (r *Recorder) Record(ctx context.Context, sourceID int64, c Check) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	req := &recordRequest{ctx: ctx, rec: CheckRecord{SourceID: sourceID, Check: c}, done: make(chan error, 1)}
	r.mu.Lock()
	if !r.started || r.stopped {
		r.mu.Unlock()
		return ErrRecorderStopped
	}
	r.queue = append(r.queue, req)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default: // the loop has a wake-up pending already
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RecorderStats counts a Recorder's work since it was built.
type RecorderStats struct {
	Batches int64 // statements run
	Records int64 // checks those statements carried (a duplicate source counts each time)
	Skipped int64 // checks not written because their caller had given up before their batch
	Queued  int   // checks waiting for a batch now (not counting the one being written)
}

// Stats returns the Recorder's counters.
func (r *Recorder) Stats() RecorderStats {
	r.mu.Lock()
	queued := len(r.queue)
	r.mu.Unlock()
	return RecorderStats{Batches: r.batches.Load(), Records: r.records.Load(), Skipped: r.skipped.Load(), Queued: queued}
}

func (r *Recorder) loop(ctx context.Context) {
	defer close(r.done)
	base := context.WithoutCancel(ctx)
	for {
		select {
		case <-r.wake:
		case <-r.stopping:
		case <-ctx.Done():
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
		for {
			batch := r.take()
			if len(batch) == 0 {
				break
			}
			r.flush(base, batch)
		}
		if last {
			return
		}
	}
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
// stuck statement cannot outlive all of its callers (nor keep Stop waiting).
func (r *Recorder) flush(base context.Context, batch []*recordRequest) {
	live := batch[:0]
	for _, q := range batch {
		if q.ctx.Err() != nil {
			r.skipped.Add(1) // its caller has returned already
			continue
		}
		live = append(live, q)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(base)
	defer cancel()
	var waiting atomic.Int64
	waiting.Store(int64(len(live)))
	recs := make([]CheckRecord, len(live))
	unregister := make([]func() bool, len(live))
	for i, q := range live {
		recs[i] = q.rec
		unregister[i] = context.AfterFunc(q.ctx, func() {
			if waiting.Add(-1) == 0 {
				cancel()
			}
		})
	}
	err := RecordChecks(ctx, r.pool, recs)
	for _, f := range unregister {
		f()
	}
	r.batches.Add(1)
	r.records.Add(int64(len(live)))
	if err != nil {
		err = fmt.Errorf("sources: recorder: %w", err)
		r.logger.Debug("recording checks failed", "checks", len(live), "err", err)
	}
	for _, q := range live {
		q.done <- err
	}
}
