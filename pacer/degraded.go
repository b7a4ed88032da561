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

// reserveLocal paces one reservation locally at rate / (fleet size + 1). A
// platform whose rate was never seen is denied with a wait of one latch
// period: without a known rate the only safe answer is "not now".
func (p *Pacer) reserveLocal(platform string, maxWait time.Duration) Reservation {
	p.degraded.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	res := Reservation{Platform: platform, Degraded: true}
	st := p.local[platform]
	if st == nil || st.rate <= 0 {
		p.denied.Add(1)
		res.Wait = p.cfg.Latch
		return res
	}
	now := p.clock.Now()
	res.Multiplier = st.mult
	slot := maxTime(now, st.tat, st.hold)
	res.Wait = slot.Sub(now)
	if res.Wait > maxWait {
		p.denied.Add(1)
		res.Wait = clampDuration(res.Wait)
		return res
	}
	st.tat = slot.Add(st.degradedInterval(p.divisor()))
	res.Granted = true
	res.due, res.maxWait = slot, maxWait
	res.rate, res.burst = st.rate, st.burst
	res.Interval = st.degradedInterval(p.divisor())
	p.granted.Add(1)
	return res
}

// localWait is how long this process's local share would make a
// reservation wait now (false if the platform is not cached).
func (p *Pacer) localWait(platform string) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil || st.rate <= 0 {
		return 0, false
	}
	now := p.clock.Now()
	return maxTime(now, st.tat, st.hold).Sub(now), true
}
