package pacer

import (
	"math"
	"time"
)

// degradedInterval is the local spacing while the database is unreachable:
// the last spacing seen (multiplier / rate, or the announced one), times
// the divisor.
func (st *localState) degradedInterval(div float64) time.Duration {
	return secondsToDuration(math.Max(st.interval, math.Max(st.mult, 1)/st.rate) * div)
}

// reserveLocal paces one reservation locally at rate / (fleet size + 1),
// and a keyed one (key not "") at its key's rate / (fleet size + 1) too. A
// platform whose rate was never seen is denied with a wait of one latch
// period: without a known rate the only safe answer is "not now"; so is a
// key never seen of a platform that limits its keys. So is a platform that
// caps its open requests (max_in_flight, its own or a key's): the leases
// the other processes hold are counted in the database alone, and a
// process pacing locally beside them put 9 requests open at a cap of 4 in
// a fresh-clone run (TestMaxInFlightFleetAndKill). A slot
// further ahead than the latch's horizon (half a period) is not booked: the
// reservation is denied with the wait until it comes within it (Acquire
// and Wait sleep and ask again), so a process's local slots end within a
// horizon of its last local grant, which bounds how long another process
// that has reached the database again must honour its local share (see
// latch).
func (p *Pacer) reserveLocal(platform, key string, maxWait time.Duration) Reservation {
	p.degraded.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	res := Reservation{Platform: platform, Key: key, Degraded: true}
	st := p.local[platform]
	rows := []*localState{st}
	if st != nil && key != "" {
		switch kst := p.local[rowName(platform, key)]; {
		case kst != nil && kst.rate > 0:
			rows = append(rows, kst)
		case kst == nil && st.keysLimited:
			st = nil // its rate is not known
		}
	}
	if st == nil || st.rate <= 0 || st.capped {
		p.denied.Add(1)
		res.Wait = p.cfg.Latch
		return res
	}
	now := p.clock.Now()
	res.Multiplier = st.mult
	slot := maxTime(now, st.tat, st.hold, st.sharedEnd)
	for _, r := range rows[1:] {
		slot = maxTime(slot, r.tat, r.hold)
	}
	res.Wait = slot.Sub(now)
	if res.Wait > maxWait {
		p.denied.Add(1)
		res.Wait = clampDuration(res.Wait)
		return res
	}
	if h := p.latch.horizon(); res.Wait > h {
		p.denied.Add(1)
		res.Wait -= h
		return res
	}
	for _, r := range rows {
		d := r.degradedInterval(p.divisor())
		r.tat = slot.Add(d)
		res.Interval = max(res.Interval, d)
	}
	res.Granted = true
	res.due, res.maxWait = slot, maxWait
	res.rate, res.burst = st.rate, st.burst
	p.granted.Add(1)
	return res
}

// takeLocalShare books this process's next local slot on platform for a
// reservation made while it honours its local share after an outage (a
// probe, or while recovering) and returns how long until it, at most limit
// (false: the platform's rate is not known). The slot is booked before the
// shared reservation is made, so concurrent callers get successive local
// slots rather than all the same one; a wait beyond maxWait books nothing
// (the caller is denied).
func (p *Pacer) takeLocalShare(platform string, maxWait, limit time.Duration) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil || st.rate <= 0 {
		return 0, false
	}
	now := p.clock.Now()
	slot := maxTime(now, st.tat, st.hold)
	w := min(slot.Sub(now), limit)
	if w <= maxWait {
		st.tat = slot.Add(st.degradedInterval(p.divisor()))
	}
	return w, true
}
