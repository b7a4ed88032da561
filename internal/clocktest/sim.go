package clocktest

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Sim is a discrete-event clock for simulations: a fleet of goroutines
// (callers of a pacer, a destination) that sleep on it runs minutes of
// virtual time in seconds. Run advances the clock to the earliest pending
// timer whenever every goroutine of the simulation waits on one — each of
// Participants goroutines holding exactly one pending timer — so time moves
// only while nothing is left to do at the current instant. It implements
// clock.Clock (tickers are not supported).
//
// A goroutine woken by another's action (a channel, not a timer) while its
// own timer is still pending is seen as waiting: Run lets every goroutine
// settle for Settle (real time) before it advances, so such a goroutine acts
// at the instant it was woken, almost always. Simulations assert with room
// for the exception.
type Sim struct {
	mu      sync.Mutex
	now     time.Time
	timers  simHeap
	seq     uint64
	changed chan struct{} // capacity 1: a timer was added, stopped or fired

	// Settle is how long (real time) the number of pending timers must stay
	// unchanged before Run advances. Default 300 µs.
	Settle time.Duration
}

// NewSim returns a Sim at New's instant.
func NewSim() *Sim {
	return &Sim{now: New().Now(), changed: make(chan struct{}, 1), Settle: 300 * time.Microsecond}
}

type simTimer struct {
	sim   *Sim
	at    time.Time
	seq   uint64
	idx   int // in the heap; -1 when not pending
	c     chan time.Time
	fn    func()
	fired bool
}

type simHeap []*simTimer

func (h simHeap) Len() int { return len(h) }
func (h simHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h simHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].idx = i; h[j].idx = j }
func (h *simHeap) Push(x any)   { t := x.(*simTimer); t.idx = len(*h); *h = append(*h, t) }
func (h *simHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	t.idx = -1
	return t
}

func (s *Sim) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Now returns the virtual time.
func (s *Sim) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

// Since is Now().Sub(t).
func (s *Sim) Since(t time.Time) time.Duration { return s.Now().Sub(t) }

// Until is t.Sub(Now()).
func (s *Sim) Until(t time.Time) time.Duration { return t.Sub(s.Now()) }

// NewTimer makes a timer firing d from now (at once when d ≤ 0).
func (s *Sim) NewTimer(d time.Duration) clockwork.Timer { return s.add(d, nil) }

// AfterFunc runs f in its own goroutine d from now.
func (s *Sim) AfterFunc(d time.Duration, f func()) clockwork.Timer { return s.add(d, f) }

// After is NewTimer(d).Chan().
func (s *Sim) After(d time.Duration) <-chan time.Time { return s.NewTimer(d).Chan() }

// Sleep sleeps d of virtual time.
func (s *Sim) Sleep(d time.Duration) { <-s.NewTimer(d).Chan() }

// NewTicker is not supported: a simulation's participants sleep on timers.
func (s *Sim) NewTicker(time.Duration) clockwork.Ticker {
	panic("clocktest: Sim does not support tickers")
}

func (s *Sim) add(d time.Duration, f func()) *simTimer {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	t := &simTimer{sim: s, at: s.now.Add(d), seq: s.seq, idx: -1, c: make(chan time.Time, 1), fn: f}
	if d <= 0 {
		t.fire(s.now)
		return t
	}
	heap.Push(&s.timers, t)
	s.signal()
	return t
}

// fire delivers t; call with s.mu held.
func (t *simTimer) fire(now time.Time) {
	t.fired = true
	if t.fn != nil {
		go t.fn()
		return
	}
	select {
	case t.c <- now:
	default:
	}
}

func (t *simTimer) Chan() <-chan time.Time { return t.c }

func (t *simTimer) Stop() bool {
	s := t.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.idx < 0 {
		return false
	}
	heap.Remove(&s.timers, t.idx)
	s.signal()
	return true
}

func (t *simTimer) Reset(d time.Duration) bool {
	s := t.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	was := t.idx >= 0
	if was {
		heap.Remove(&s.timers, t.idx)
	}
	s.seq++
	t.at, t.seq, t.fired = s.now.Add(d), s.seq, false
	if d <= 0 {
		t.fire(s.now)
	} else {
		heap.Push(&s.timers, t)
	}
	s.signal()
	return was
}

// Pending is how many timers are pending.
func (s *Sim) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.timers)
}

// Run drives the simulation until ctx ends or virtual time reaches end:
// whenever participants() timers are pending (every goroutine of the
// simulation waits) and have been for Settle, it advances the clock to the
// earliest one and fires every timer due then. participants is asked
// again each time (goroutines come and go).
func (s *Sim) Run(ctx context.Context, end time.Time, participants func() int) error {
	settle := s.Settle
	if settle <= 0 {
		settle = 300 * time.Microsecond
	}
	t := time.NewTimer(settle)
	defer t.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := s.Pending()
		if n < participants() || n == 0 {
			select {
			case <-s.changed:
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		// Every participant waits: let anything woken by a channel settle.
		t.Reset(settle)
		select {
		case <-s.changed:
			continue
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		s.mu.Lock()
		if len(s.timers) == 0 {
			s.mu.Unlock()
			continue
		}
		next := s.timers[0].at
		if !next.Before(end) {
			s.now = end
			s.mu.Unlock()
			return nil
		}
		if next.After(s.now) {
			s.now = next
		}
		for len(s.timers) > 0 && !s.timers[0].at.After(s.now) {
			heap.Pop(&s.timers).(*simTimer).fire(s.now)
		}
		s.mu.Unlock()
	}
}
