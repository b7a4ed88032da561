package pacer

import (
	"context"
	"math"
	"time"
)

// takeFromBlock hands out the next slot kept from a block, if one is neither
// too late nor further away than maxWait. Slots too late for the lateness
// rules (lateTolerance, as Sleep applies them) are discarded: sent now, they
// would crowd the slots after them.
func (p *Pacer) takeFromBlock(platform string, maxWait time.Duration) (Reservation, bool) {
	if p.blockSlots.Load() == 0 {
		return Reservation{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil || len(st.block) == 0 {
		return Reservation{}, false
	}
	now := p.clock.Now()
	for len(st.block) > 0 && now.Sub(st.block[0].at) > p.lateTolerance(st, st.block[0].interval) {
		st.block = st.block[1:]
		p.blockSlots.Add(-1)
		p.blockDiscarded.Add(1)
	}
	if len(st.block) == 0 {
		return Reservation{}, false
	}
	b := st.block[0]
	wait := max(b.at.Sub(now), 0)
	if wait > maxWait {
		return Reservation{}, false
	}
	st.block = st.block[1:]
	p.blockSlots.Add(-1)
	return Reservation{Platform: platform, Granted: true, Wait: wait, ReservedAt: epochToTime(b.reservedAt),
		Slot: epochToTime(b.slot), Multiplier: b.mult, Interval: secondsToDuration(b.interval), FromBlock: true,
		due: b.at, maxWait: maxWait, seq: b.seq, rate: st.rate, burst: st.burst, spacing: b.interval}, true
}

// blockLeader makes the caller the one that takes platform's next block,
// or tells it to wait for the one on its way. Exactly one of wait (closed
// when the block statement has returned) and release (to call when it has)
// is not nil.
func (p *Pacer) blockLeader(platform string) (wait <-chan struct{}, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state(platform)
	if st.fetching != nil {
		return st.fetching, nil
	}
	done := make(chan struct{})
	st.fetching = done
	return nil, func() {
		p.mu.Lock()
		st.fetching = nil
		p.mu.Unlock()
		close(done)
	}
}

// dropBlock discards the slots kept for platform: they were spaced for a
// spacing a slow-down has just made too small. Call with p.mu held.
func (p *Pacer) dropBlock(st *localState) {
	if st == nil {
		return
	}
	p.blockDiscarded.Add(uint64(len(st.block)))
	p.blockSlots.Add(-int64(len(st.block)))
	st.block = nil
}

// observeRTT folds one reservation round trip into the moving average.
func (p *Pacer) observeRTT(d time.Duration) {
	old := p.rtt.Load()
	if old == 0 {
		p.rtt.Store(int64(d))
		return
	}
	p.rtt.Store(old + (int64(d)-old)/8)
}

// lateTolerance is how late after its slot a request on platform's state st
// may still go, at spacing interval (seconds; see tuning.lateTolerance and,
// paced by the destination, tuning.marginLate).
func (p *Pacer) lateTolerance(st *localState, interval float64) time.Duration {
	tol := p.tuning.lateTolerance(st.rate, st.burst, interval)
	if m := p.tuning.marginLate(st.rate, st.burst, interval); m > 0 && m < tol {
		return m
	}
	return tol
}

// blockSize is how many slots the next reservation statement of platform
// takes: one while the platform's interval is longer than a round trip, or
// while this process's callers already sleep on slots further ahead than a
// round trip (the cursor is ahead: a reservation's round trip is hidden in
// the wait its caller has anyway, and a block could only hold slots the
// process cannot hand out in time); otherwise what this process's callers
// use in one round trip — its share of the platform's slots, the fleet's
// being split among the fleet's processes — at most Config.MaxBlock. A slot
// of a block that no caller of this process takes before it is too late is
// lost to the whole fleet (the shared cursor went past it): a block sized
// for the fleet's rate, in each process, lost up to (fleet − 1)/fleet of its
// slots.
func (p *Pacer) blockSize(platform string) int {
	if p.cfg.MaxBlock <= 1 {
		return 1
	}
	rtt := float64(p.rtt.Load()) / float64(time.Second)
	now := p.clock.Now()
	p.mu.Lock()
	st := p.local[platform]
	var interval, ahead float64
	if st != nil {
		interval = st.interval
		for w := range st.waiters {
			ahead = max(ahead, w.due.Sub(now).Seconds())
		}
		if n := len(st.block); n > 0 {
			ahead = max(ahead, st.block[n-1].at.Sub(now).Seconds())
		}
	}
	p.mu.Unlock()
	share := interval * float64(max(p.fleet.Load(), 1))
	if interval <= 0 || rtt <= share || ahead > rtt {
		return 1
	}
	return int(math.Min(math.Ceil(rtt/share), float64(p.cfg.MaxBlock)))
}

// refill takes platform's next block in the background once the block kept
// is down to half a block, so that at a rate where blocks are taken at all
// callers find a slot kept instead of waiting for the round trip (every
// caller that came while a block statement was on its way waited for it:
// one round trip in every block, 10 % of the fetch job's jobs in `bench
// worker`). Only on the plain shared path: not while a probe or a recovery
// books slots one at a time, nor under a hold, a gate or an open-request
// cap (a capped row's slot takes a lease). A refill that fails is dropped:
// the next call that finds the block empty reserves itself and meets the
// error (or the outage) there.
func (p *Pacer) refill(platform string, maxWait time.Duration) {
	if p.cfg.MaxBlock <= 1 || p.noRefill || p.latch.isDown() || p.latch.recovering() {
		return
	}
	n := p.blockSize(platform)
	if n <= 1 {
		return
	}
	p.mu.Lock()
	st := p.local[platform]
	skip := p.closing || st == nil || st.fetching != nil || st.capped || st.gate != nil ||
		len(st.block) > n/2 || st.held.After(p.clock.Now()) || st.hold.After(p.clock.Now())
	if !skip {
		p.refills.Add(1) // under p.mu: Close sets closing under it, then waits
	}
	p.mu.Unlock()
	if skip {
		return
	}
	wait, release := p.blockLeader(platform)
	if wait != nil { // a caller's block statement came first
		p.refills.Done()
		return
	}
	p.refilled.Add(1)
	go func() {
		defer p.refills.Done()
		defer release()
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StatementTimeout)
		defer cancel()
		if _, err := p.reserveShared(ctx, platform, maxWait, 0, n, true); err != nil {
			p.log.Debug("pacer: block refill failed", "platform", platform, "err", err)
		}
	}()
}
