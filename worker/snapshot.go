package worker

import (
	"context"
	"sync"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// snapshot is a value read from the database at most once per period and
// shared by every request that asks meanwhile: one read at a time (so one
// connection at most), the others waiting for it. A failed read is kept
// for the period too, so an unreachable database is asked once per period,
// not once per request. The read runs on a context of its own, bounded by
// timeout: a client that goes away neither cancels it nor leaves its
// cancellation behind as everyone's answer.
type snapshot[T any] struct {
	read    func(context.Context) (T, error)
	every   time.Duration
	timeout time.Duration
	clock   clock.Clock // nil: the real clock

	mu      sync.Mutex
	val     T
	err     error
	at      time.Time     // when val and err were read; zero: never
	reading chan struct{} // closed when the read in progress ends; nil: none
}

// get returns the last value (or error) if it was read less than a period
// ago; else it reads a new one, or waits for the read in progress (or for
// ctx).
func (s *snapshot[T]) get(ctx context.Context) (T, error) {
	c := clock.Or(s.clock)
	for {
		s.mu.Lock()
		if !s.at.IsZero() && c.Since(s.at) < s.every {
			v, err := s.val, s.err
			s.mu.Unlock()
			return v, err
		}
		if wait := s.reading; wait != nil {
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				var zero T
				return zero, ctx.Err()
			}
		}
		done := make(chan struct{})
		s.reading = done
		s.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		v, err := s.read(rctx)
		cancel()
		s.mu.Lock()
		s.val, s.err, s.at, s.reading = v, err, c.Now(), nil
		s.mu.Unlock()
		close(done)
		return v, err
	}
}
