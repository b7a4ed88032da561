package pacer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fleetpace/fleetpace/clock"
)

// ErrGivenBack is returned by Sleep when the fleet slowed down while the
// caller waited for its slot and the re-spaced slot lies further away than
// the max wait it reserved with: the slot is given back. Reserve again
// later (a River job snoozes).
var ErrGivenBack = errors.New("pacer: slot given back after a slow-down")

// ErrLate is returned by Sleep when the caller woke up later after its slot
// than the ceiling allows (Config.LateBudget; a slow reply, a loaded
// machine, a GC pause, a suspended VM). Sending late would crowd the slots that follow it into
// one second: give the slot up and reserve again. The slot is still the
// caller's, and res says how late it is (Late), so a caller that has given
// up slots several times in a row may use it anyway (Wait does, on the
// third).
var ErrLate = errors.New("pacer: woke too late for the slot")

// waiter is a granted slot a caller is sleeping until.
type waiter struct {
	platform   string
	key        string    // the key's row also holds the slot ("": none)
	shared     bool      // from the shared row (degraded slots are not re-spaced)
	mapped     bool      // shared, reserved (not built by hand), on the database's clock: due is slot mapped by the clock offset
	slot       float64   // database time of the slot
	interval   float64   // spacing it was granted at (seconds)
	reservedAt float64   // database time of the reservation or of the last re-spacing
	seq        int64     // the platform's event sequence it has seen
	due        time.Time // local-clock time of the slot
	maxWait    time.Duration
	givenBack  bool
	wake       chan struct{} // capacity 1: a re-spacing moved due
}

// Sleep waits until res's slot. While it waits, a slow-down of the platform
// seen anywhere in the fleet — rate pressure, a destination's announced
// limit, a hold, a pause — moves the slot later with the new spacing, as the
// shared cursor moved (see docs/design.md, "Immediate reaction"), and Sleep
// waits for the new time; res is updated (Slot, ReservedAt, Interval, Wait).
// It returns ErrGivenBack if the slot moved beyond the max wait res was
// reserved with, ErrLate if the caller woke too late for it, or ctx's error.
func (p *Pacer) Sleep(ctx context.Context, res *Reservation) error {
	if !res.Granted {
		return fmt.Errorf("pacer: sleep %s: the reservation was not granted", res.Platform)
	}
	w := &waiter{
		platform: res.Platform, key: res.Key, shared: !res.Degraded,
		slot: timeToEpoch(res.Slot), interval: res.interval(), reservedAt: timeToEpoch(res.ReservedAt),
		seq: res.seq, due: res.due, maxWait: res.maxWait,
		wake: make(chan struct{}, 1),
	}
	if w.due.IsZero() { // built by hand, not by Reserve
		w.due = p.clock.Now().Add(res.Wait)
	} else {
		// With Config.TimeFromClock the statements read this clock: there
		// is no offset to follow, and the reservation's mapping stands.
		w.mapped = w.shared && !p.cfg.TimeFromClock
	}
	p.register(w)
	defer p.unregister(w)
	for {
		p.mu.Lock()
		if w.mapped {
			// The slot in local time with the newest clock bracket, the one
			// the lateness below counts with: a bracket that narrowed since
			// the reservation (its first round trip was slow) would leave
			// the slot mapped later than it may truly be, and the request
			// sent that much past its tolerance (a 1-s window of 43 at 40/s
			// + burst 2).
			w.due = p.offset.local(w.slot)
		}
		due, gone, gate := w.due, w.givenBack, p.gateOf(w)
		d := due.Sub(p.clock.Now())
		if !gone && d <= 0 && gate == nil && p.heldAt(w, due) {
			// A hold this process received, and no answer moved the slot
			// past it (holdLocally).
			p.giveBack(w)
			gone = true
		}
		p.mu.Unlock()
		if gone {
			return fmt.Errorf("pacer: sleep %s: %w", res.Platform, ErrGivenBack)
		}
		if d <= 0 && gate == nil {
			break
		}
		if d <= 0 {
			// A report that slows the platform down is on its way: its answer
			// moves this slot or gives it back (closeGate).
			p.gated.Add(1)
			select {
			case <-ctx.Done():
				return fmt.Errorf("pacer: sleep %s: %w", res.Platform, ctx.Err())
			case <-gate:
			case <-w.wake:
			}
			continue
		}
		t := p.clock.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pacer: sleep %s: %w", res.Platform, ctx.Err())
		case <-w.wake:
			t.Stop()
		case <-t.Chan():
		}
	}
	p.mu.Lock()
	res.Slot, res.ReservedAt = epochToTime(w.slot), epochToTime(w.reservedAt)
	res.Interval, res.spacing = secondsToDuration(w.interval), w.interval
	interval, due := w.interval, w.due
	var unsure time.Duration
	if w.mapped {
		due = p.offset.local(w.slot)
		unsure = p.offset.uncertainty()
	}
	p.mu.Unlock()
	// Lateness counts from the slot's time in the database, mapped to the
	// local clock (clockOffset) at the latest it can be, plus how much
	// earlier it may truly be: a slow reply delays the send as much as a
	// slow wake-up. The schedule was spaced for requests up to the late
	// budget late (tuning.lateTolerance): later than that, the request would
	// put more than rate + burst into one of the destination's seconds.
	late := max(p.clock.Now().Sub(due), 0)
	res.Late = late + unsure
	// (The spacing in seconds: a Duration rounds 1 ns spacings away.)
	tolerance := p.tuning.lateTolerance(res.rate, res.burst, interval)
	// Paced by the destination, a request later than the margin leaves
	// reaches a strict limiter too soon after the one before it
	// (tuning.lateMargin).
	margin := p.tuning.marginLate(res.rate, res.burst, interval)
	res.SendBy = time.Time{}
	if res.Late > tolerance || (margin > 0 && late > margin) {
		p.late.Add(1)
		return fmt.Errorf("pacer: sleep %s: %w (%s late)", res.Platform, ErrLate, res.Late.Round(time.Millisecond))
	}
	res.SendBy = due.Add(tolerance - unsure)
	if margin > 0 {
		res.SendBy = minTime(res.SendBy, due.Add(margin))
	}
	return nil
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (p *Pacer) register(w *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state(w.platform)
	if st.waiters == nil {
		st.waiters = map[*waiter]struct{}{}
	}
	st.waiters[w] = struct{}{}
	if w.shared && st.last.seq > w.seq {
		// A slow-down came between the reservation and now.
		p.respace(w, st.last, p.clock.Now())
	}
	if w.key != "" {
		kst := p.state(rowName(w.platform, w.key))
		if kst.waiters == nil {
			kst.waiters = map[*waiter]struct{}{}
		}
		kst.waiters[w] = struct{}{}
	}
}

func (p *Pacer) unregister(w *waiter) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.local[w.platform]; st != nil {
		delete(st.waiters, w)
	}
	if w.key != "" {
		if st := p.local[rowName(w.platform, w.key)]; st != nil {
			delete(st.waiters, w)
		}
	}
}

// event is a slow-down of a platform: the shared row's state right after it.
type event struct {
	seq      int64
	at       float64 // database time of the slow-down
	interval float64 // effective spacing after it, seconds
	shift    float64 // seconds every stretched slot moves later (+Inf: paused; give every slot back)
	horizon  float64 // a slot moved later than this (database time) is given back (+Inf: none)
	hold     float64 // the later of the hold and the pause after it (database time)
}

// applyEvent brings this process in line with a slow-down it learnt of (its
// own report, a notification, or a reservation that found a newer
// sequence): slots kept from blocks are given back, and every waiter of the
// platform is re-spaced. Events are applied once each, in any order (an
// older one than the last applied is ignored).
func (p *Pacer) applyEvent(platform string, ev event) {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state(platform)
	if ev.seq <= st.last.seq {
		return
	}
	p.events.Add(1)
	st.last = ev
	p.dropBlock(st) // spaced for less, or (ClearHold) placed after a hold that is gone
	if ev.hold <= ev.at && math.IsInf(ev.shift, 1) {
		// An operator cleared the fleet-wide hold (every slot given back,
		// no hold in force): neither here. Another event without a hold
		// (another process's slow-down or late write) leaves this process's
		// own Retry-After, whose report may still be on its way
		// (TestOwnHoldOutlivesOtherEvents).
		st.held, st.hold = time.Time{}, time.Time{}
	}
	if isKeyRow(platform) {
		// A key's slots are booked on its platform's schedule too: they are
		// given back, not re-spaced.
		p.giveBackKey(st)
		if ev.hold > ev.at {
			st.held = maxTime(st.held, now.Add(secondsToDuration(ev.hold-ev.at)))
		}
		return
	}
	if ev.interval > 0 {
		st.interval = ev.interval
	}
	// The hold in local time: the notification arrives moments after the
	// event, so measure from now.
	if ev.hold > ev.at {
		st.hold = maxTime(st.hold, now.Add(secondsToDuration(ev.hold-ev.at)))
	}
	n := 0
	for w := range st.waiters {
		if w.shared {
			n++
			p.respace(w, ev, now)
		}
	}
	p.log.Debug("pacer: slow-down", "platform", platform, "seq", ev.seq, "interval_s", ev.interval, "shift_s", ev.shift,
		"horizon_s", ev.horizon-ev.at, "waiters", n)
}

// respace moves one waiter's slot after a slow-down, as reportSQL moved the
// shared cursor: a slot due more than respaceLead after the event has its
// distance from that pivot stretched by the ratio of the new spacing to the
// one it was granted at, then moves later by the event's shift (what puts
// the fleet's earliest granted slot at the hold); one that would still fall
// inside the hold is given back. A slot due before the pivot goes as it is;
// nothing moves earlier. Call with p.mu held.
func (p *Pacer) respace(w *waiter, ev event, now time.Time) {
	if ev.seq <= w.seq {
		return
	}
	missed := ev.seq > w.seq+1
	w.seq = ev.seq
	pivot := ev.at + respaceLead.Seconds()
	if w.slot <= pivot {
		return
	}
	if missed {
		// An earlier slow-down never reached this slot: the fleet moved its
		// slots twice, this one would move once, and could land beside
		// another. Reserving again puts it at the cursor, where it belongs.
		p.giveBack(w)
		return
	}
	ratio := 1.0
	if w.interval > 0 && ev.interval > w.interval {
		ratio = ev.interval / w.interval
	}
	slot := pivot + (w.slot-pivot)*ratio + ev.shift
	if w.slot < ev.hold && slot < ev.hold {
		// The shift puts the earliest slot on the schedule's grid at the
		// hold's end; one granted within the burst's tolerance lies off
		// that grid, a little earlier, and would land inside the hold.
		// Reserving again puts it after the hold.
		p.giveBack(w)
		return
	}
	moved := slot > w.slot
	if moved {
		w.due = w.due.Add(secondsToDuration(slot - w.slot))
		w.slot, w.reservedAt = slot, ev.at // a 429 for it now speaks of the new spacing
		w.interval = math.Max(w.interval, ev.interval)
		p.respaced.Add(1)
	}
	// At or past the horizon the database no longer counts the slot (the
	// cursor ends a spacing after the horizon at most, and at the hold's
	// end where the hold reaches the horizon), moved or not: it is given
	// back.
	gone := w.due.Sub(now) > w.maxWait || w.slot >= ev.horizon
	if gone {
		w.givenBack = true
		p.givenBack.Add(1)
	}
	if moved || gone {
		w.wakeUp()
	}
}

// giveBack gives w's slot back: its caller wakes and reserves again. Call
// with p.mu held.
func (p *Pacer) giveBack(w *waiter) {
	w.givenBack = true
	p.givenBack.Add(1)
	w.wakeUp()
}

// wakeUp wakes w's caller to look at its slot again.
func (w *waiter) wakeUp() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// afterSleep says what a caller of Sleep on s does with its error: done,
// with the slot used (nil) or a final error; or not done, to reserve again
// after a slot given back or missed. late counts the slots missed in a
// row: the third is used all the same (a machine that is late every time
// must still make progress). A slot not used gives its open-request lease
// back at once (a platform that caps open requests would otherwise count
// it open until Config.LeaseTTL, and deny the next reservation for it).
func afterSleep(ctx context.Context, s Slotter, res Reservation, err error, late *int) (done bool, _ error) {
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrLate):
		*late++
		done, err = *late >= 3, nil
	case errors.Is(err, ErrGivenBack):
	default:
		done = true
	}
	if !done || err != nil {
		if l, ok := s.(leaseReturner); ok {
			l.returnLease(ctx, res)
		}
	}
	return done, err
}

// leaseReturner is a Slotter whose slots may hold an open-request lease
// (*Pacer, a key's slotter).
type leaseReturner interface {
	returnLease(ctx context.Context, res Reservation)
}

// returnLease gives back the lease of a slot its caller does not use, even
// when ctx is done.
func (p *Pacer) returnLease(ctx context.Context, res Reservation) {
	p.release(context.WithoutCancel(ctx), res)
}

// Wait reserves a slot on platform and sleeps until it, reserving again
// when a slot is given back, or missed (the third late slot in a row is
// used: a machine that is late every time must still make progress).
// Reservations denied in degraded mode (no rate known yet) are retried after
// their wait.
func (p *Pacer) Wait(ctx context.Context, platform string) (Reservation, error) {
	late := 0
	for {
		r, err := p.Reserve(ctx, platform, MaxHold)
		if err != nil {
			return r, err
		}
		if !r.Granted {
			if err := clock.Sleep(ctx, p.clock, r.Wait); err != nil {
				return r, fmt.Errorf("pacer: wait %s: %w", platform, err)
			}
			continue
		}
		if done, err := afterSleep(ctx, p, r, p.Sleep(ctx, &r), &late); done {
			return r, err
		}
	}
}
