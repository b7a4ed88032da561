package pacer

import "time"

// A Retry-After, or a quota the destination says is exhausted (Remaining
// 0 with a Reset), holds the whole fleet once its report reaches the
// database (a round trip, longer while the database is busy). The process
// that received it holds at once: from that instant it sends nothing more to the
// platform until the hold ends: blocks are dropped, new reservations are
// denied without a round trip, and a slot its callers sleep on does not go
// inside the hold. While the report is on its way such a slot waits behind
// the gate (closeGate), and the report's answer moves it past the hold with
// the fleet's other slots; one still inside the hold when the gate opens
// (the report did not land) is given back then. Giving them all back at
// once left holes in the fleet's schedule after the hold: the fleet's other
// slots move past the hold, these came back at the cursor's end, and a
// strict bucket at 8/s lost four requests a refusal. Without a gate (a
// key's hold, a degraded slot) they are given back at once. A platform
// whose re-spacing is off (respace = false: granted slots stand) is not
// held locally either.

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
		if w.givenBack || !w.due.Before(until) || st.gate != nil && w.shared && !isKeyRow(platform) {
			continue
		}
		p.giveBack(w)
	}
}

// heldAt tells whether this process holds w's platform (or its key) itself
// at due. Call with p.mu held.
func (p *Pacer) heldAt(w *waiter, due time.Time) bool {
	if st := p.local[w.platform]; st != nil && st.held.After(due) {
		return true
	}
	if w.key != "" {
		if st := p.local[rowName(w.platform, w.key)]; st != nil && st.held.After(due) {
			return true
		}
	}
	return false
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

// HeldFor is how long platform is still held, paused or backlogged as far
// as this process knows: a hold or a pause (HoldLeft), or, after a
// reservation was denied for a slot beyond its bound, until that slot; 0:
// none of them. riverpace.Config.MaxSleepers acts only then: a platform
// whose jobs wait longer than their bound would otherwise take every
// worker of the process, one sleeper after the other.
func (p *Pacer) HeldFor(platform string) time.Duration {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	if st == nil {
		return 0
	}
	return max(st.hold.Sub(now), st.held.Sub(now), st.far.Sub(now), 0)
}

// HoldLeft is how long platform's key (the platform itself for key "") is
// still held or paused as far as this process knows — a Retry-After it
// received or heard of, a cooldown, an operator's pause; the longer of the
// platform's and the key's. Never a backlog: the worker wakes the jobs
// snoozed for a hold when it ends (queue.Waker), and a job snoozed because
// its slot lay beyond its bound, woken early, would only snooze again ahead
// of every other platform's jobs.
func (p *Pacer) HoldLeft(platform, key string) time.Duration {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	left := time.Duration(0)
	for _, name := range []string{platform, rowName(platform, key)} {
		if st := p.local[name]; st != nil {
			left = max(left, st.hold.Sub(now), st.held.Sub(now))
		}
		if key == "" {
			break
		}
	}
	return left
}

// While a report that slows a platform down is on its way to the database
// — pressure, or an announcement that asks for a slower pace — this process
// sends nothing to the platform: a caller whose slot comes meanwhile waits
// for the report's answer, which re-spaces its slot (applyEvent) or gives
// it back. Without the gate the process kept sending at the old pace for
// the report's round trip: on a loaded machine, 250 ms and four requests at
// 20/s after an answer had said "5 per second", the last one refused. The
// gate opens when the report returns, stored or dropped, so it lasts one
// statement at most (Config.StatementTimeout). Slots of a platform whose
// re-spacing is off stand as granted and are not gated.

// closeGate gates row name (a platform's, or a key's) until the returned
// function is called.
func (p *Pacer) closeGate(name string) (open func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state(name)
	if st.noRespace || p.noGate {
		return func() {}
	}
	if st.gates == 0 {
		st.gate = make(chan struct{})
	}
	st.gates++
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		st.gates--
		if st.gates == 0 {
			close(st.gate)
			st.gate = nil
		}
	}
}

// gateOf is the gate w waits behind at its slot (nil: none). Call with
// p.mu held.
func (p *Pacer) gateOf(w *waiter) chan struct{} {
	if st := p.local[w.platform]; st != nil && st.gate != nil {
		return st.gate
	}
	if w.key != "" {
		if st := p.local[rowName(w.platform, w.key)]; st != nil && st.gate != nil {
			return st.gate
		}
	}
	return nil
}
