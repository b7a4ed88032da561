package queue

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// WakeHeld makes the fetch jobs of platform (of key, when key is not "")
// that were snoozed for a hold ending at until available now, in due order
// (wakeHeldSQL). It returns how many it woke.
func WakeHeld(ctx context.Context, db DB, platform, key string, until time.Time) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, wakeHeldSQL, Name, FetchArgs{}.Kind(), platform, key, until).Scan(&n, new(bool)); err != nil {
		return 0, fmt.Errorf("queue: wake the held fetches of %s: %w", platform, err)
	}
	return n, nil
}

// Waker wakes the fetch jobs snoozed for a hold (a Retry-After, a
// cooldown, a timed pause) the moment the hold ends. River brings a job
// snoozed past its scheduler's interval (5 s) back only at the
// scheduler's next run, and any snoozed job takes its turn by the time it
// was snoozed to, behind every job queued while it was held: a key held for
// 10 s behind a backlog of other keys came back 15 s after its 429 in a
// loaded run. Every process that snoozes a job for a hold asks for the
// wake; the statement is idempotent, so the fleet's processes may all run
// it.
type Waker struct {
	db     DB
	clock  clock.Clock
	logger *slog.Logger

	mu      sync.Mutex
	pending map[wakeAt]clock.Timer
	stopped bool
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

// wakeAt is one wake: a platform's key (or the platform, key "") at a hold's
// end, rounded up to wakeGranularity.
type wakeAt struct {
	platform, key string
	at            int64
}

// wakeGranularity coalesces wakes: the jobs of one hold ask for its end
// within this of each other.
const wakeGranularity = 100 * time.Millisecond

// wakeTimeout bounds one wake's statement.
const wakeTimeout = 10 * time.Second

// wakeSlack is how far past a hold's end a job snoozed for it may be
// scheduled: the pacer's River middleware lengthens a snooze of up to 5 s
// by up to a tenth to spread the jobs out (riverpace), and River adds the
// time from the job's return to its executor reading the clock, which is
// hundreds of ms on a loaded machine. A wake bounded by the end alone
// leaves those jobs to River's scheduler, behind every job queued during
// the hold. A job woken that was snoozed for a wait of its own just waits
// again.
const wakeSlack = 2 * time.Second

// wakeRetry is how long a wake whose statement failed (the database did
// not answer in time) waits before it tries again, up to wakeTries times.
const (
	wakeRetry = 500 * time.Millisecond
	wakeTries = 5
)

// NewWaker returns a Waker that wakes jobs through db, timed by clk
// (nil: the real clock). Stop it when done.
func NewWaker(db DB, clk clock.Clock, logger *slog.Logger) *Waker {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Waker{db: db, clock: clock.Or(clk), logger: logger, pending: map[wakeAt]clock.Timer{}, ctx: ctx, cancel: cancel}
}

// WakeAt asks for the jobs of platform (of key; "" for the platform's hold)
// snoozed up to until (and wakeSlack after it) to be woken at until. Asks
// for one hold's end coalesce into one wake; a wake the database fails is
// tried again (wakeTries); after Stop it does nothing.
func (w *Waker) WakeAt(platform, key string, until time.Time) {
	until = until.Truncate(wakeGranularity).Add(wakeGranularity)
	k := wakeAt{platform, key, until.UnixNano()}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.pending[k] != nil {
		return
	}
	w.wg.Add(1)
	w.pending[k] = w.clock.AfterFunc(until.Sub(w.clock.Now()), func() {
		defer w.wg.Done()
		w.mu.Lock()
		delete(w.pending, k)
		w.mu.Unlock()
		for try := 1; ; try++ {
			n, err := w.wake(platform, key, until.Add(wakeSlack))
			switch {
			case w.ctx.Err() != nil:
				return
			case err == nil:
				if n > 0 {
					w.logger.Debug("woke the jobs of an ended hold", "platform", platform, "key", key, "jobs", n)
				}
				return
			case try == wakeTries:
				// River's scheduler still brings the jobs back, later.
				w.logger.Warn("could not wake the jobs of an ended hold", "platform", platform, "key", key, "tries", try, "err", err)
				return
			}
			if clock.Sleep(w.ctx, w.clock, wakeRetry) != nil {
				return
			}
		}
	})
}

// wake runs one wake's statement, bounded by wakeTimeout.
func (w *Waker) wake(platform, key string, until time.Time) (int64, error) {
	ctx, cancel := context.WithTimeout(w.ctx, wakeTimeout)
	defer cancel()
	return WakeHeld(ctx, w.db, platform, key, until)
}

// Stop cancels the pending wakes and waits for a running one to end.
func (w *Waker) Stop() {
	w.mu.Lock()
	w.stopped = true
	for k, t := range w.pending {
		if t.Stop() {
			w.wg.Done()
		}
		delete(w.pending, k)
	}
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}
