package pacer

import "time"

// A Retry-After, or a quota the destination says is exhausted (Remaining
// 0 with a Reset), holds the whole fleet once its report reaches the
// database (a round trip, longer while the database is busy). The process
// that received it holds at once: from that instant it sends nothing more to the
// platform until the hold ends — the slots its callers sleep on are given
// back (they reserve again and are denied), blocks are dropped, and new
// reservations are denied without a round trip. A platform whose
// re-spacing is off (respace = false: granted slots stand) is not held
// locally either.

// holdFor is how long f asks the fleet to hold from now: a pressure's
// Retry-After (always honoured), at most MaxHold.
func holdFor(f Feedback) time.Duration {
	if f.Kind != Pressure {
		return 0
	}
	return clampDuration(f.RetryAfter)
}

// holdLocally holds platform in this process for d from now.
func (p *Pacer) holdLocally(platform string, d time.Duration) {
	now := p.clock.Now()
	until := now.Add(d)
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state(platform)
	if st.noRespace {
		return
	}
	st.held = maxTime(st.held, until)
	st.hold = maxTime(st.hold, until) // degraded pacing honours it too
	p.dropBlock(st)
	for w := range st.waiters {
		if w.givenBack || !w.due.Before(until) {
			continue
		}
		w.givenBack = true
		p.givenBack.Add(1)
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// heldLocally is how long this process still holds platform itself (0:
// not held).
func (p *Pacer) heldLocally(platform string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil || st.held.IsZero() {
		return 0
	}
	return max(st.held.Sub(p.clock.Now()), 0)
}

// HeldFor is how long platform is still held or paused as far as this
// process knows — a Retry-After it received or heard of, a cooldown, an
// operator's pause; 0: not held. riverpace.Config.MaxSleepers acts only
// while a platform is held.
func (p *Pacer) HeldFor(platform string) time.Duration {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil {
		return 0
	}
	return max(st.hold.Sub(now), st.held.Sub(now), 0)
}
