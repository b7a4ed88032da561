package pacer

import (
	"math"
	"time"
)

// takeFromBlock hands out the next slot kept from a block, if one is neither
// too late nor further away than maxWait. Slots too late are discarded.
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
	for len(st.block) > 0 && now.Sub(st.block[0].at) > p.cfg.MaxLate {
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
		due: b.at, maxWait: maxWait, seq: b.seq}, true
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

// blockSize is how many slots the next reservation statement of platform
// takes: one while the platform's interval is longer than a round trip,
// otherwise enough to cover one round trip, at most Config.MaxBlock.
func (p *Pacer) blockSize(platform string) int {
	if p.cfg.MaxBlock <= 1 {
		return 1
	}
	rtt := float64(p.rtt.Load()) / float64(time.Second)
	p.mu.Lock()
	st := p.local[platform]
	var interval float64
	if st != nil {
		interval = st.interval
	}
	p.mu.Unlock()
	if interval <= 0 || rtt <= interval {
		return 1
	}
	return int(math.Min(math.Ceil(rtt/interval), float64(p.cfg.MaxBlock)))
}
