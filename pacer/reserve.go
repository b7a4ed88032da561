package pacer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Reserve asks for a slot on platform, waiting at most maxWait for it. A
// granted reservation tells the caller how long to sleep before its request;
// a denied one reserved nothing and tells it when to come back. When the
// database is unreachable Reserve still answers (degraded, paced locally) and
// returns no error; errors are ErrUnknownPlatform, the caller's context, or a
// database error that is not an outage (e.g. a missing schema).
func (p *Pacer) Reserve(ctx context.Context, platform string, maxWait time.Duration) (Reservation, error) {
	p.reservations.Add(1)
	if maxWait < 0 {
		maxWait = 0
	}
	// A Retry-After this process received holds it at once; the fleet-wide
	// hold follows. The row books a slot after it.
	held := p.heldLocally(platform)
	if held > maxWait {
		p.denied.Add(1)
		return Reservation{Platform: platform, Wait: held, Multiplier: p.cachedResult(platform).Multiplier}, nil
	}
	if held == 0 {
		if res, ok := p.takeFromBlock(platform, maxWait); ok {
			p.granted.Add(1)
			p.fromBlock.Add(1)
			p.refill(platform, maxWait)
			return res, nil
		}
	}
	shared, probe, recovering := p.latch.admit()
	if !shared {
		return p.reserveLocal(platform, "", maxWait), nil
	}

	minWait := held
	n := 1
	if probe || recovering {
		// One at a time, so the row books this process's local slots in
		// their order (it only moves forward: a later slot booked first
		// would push the earlier ones onto the row's faster pace).
		p.recoveryMu.Lock()
		defer p.recoveryMu.Unlock()
		// After an outage other processes may still grant local slots for
		// up to one latch period, each at most a horizon ahead; honour this
		// process's local share too (its next local slot, booked now), so
		// the sum stays under the ceiling. The shared row books the later
		// slot — but never later than the end of that recovery period: from
		// then on no local slot is left anywhere and the row spaces every
		// slot (a row booked a local backlog ahead would hold the whole
		// fleet back behind it).
		var ok bool
		if minWait, ok = p.localShare(platform, probe, maxWait, minWait); !ok {
			return Reservation{Platform: platform, Wait: minWait}, nil
		}
	} else if held == 0 {
		n = p.blockSize(platform)
	}
	if n > 1 {
		// One block statement at a time per platform: callers that come
		// while one is on its way take from the block it brings. Blocks
		// fetched side by side by concurrent callers hold more slots than
		// the process hands out before they are late, and the rest are
		// lost to the whole fleet.
		wait, release := p.blockLeader(platform)
		if wait != nil {
			select {
			case <-wait:
			case <-ctx.Done():
				p.latch.endProbe(probe)
				return Reservation{}, fmt.Errorf("pacer: reserve %s: %w", platform, ctx.Err())
			}
			if res, ok := p.takeFromBlock(platform, maxWait); ok {
				p.latch.endProbe(probe)
				p.granted.Add(1)
				p.fromBlock.Add(1)
				p.refill(platform, maxWait)
				return res, nil
			}
		} else {
			defer release()
		}
	}

	res, err := retrySlowConnect(ctx, p, func() (Reservation, error) {
		return p.reserveShared(ctx, platform, maxWait, minWait, n, false)
	})
	return p.reserved(ctx, probe, platform, "", maxWait, res, err)
}

// localShare is the wait this process's own local share asks for while it
// recovers from an outage (takeLocalShare), at least minWait; false: it is
// beyond maxWait and the reservation is denied with that wait. Call with
// p.recoveryMu held.
func (p *Pacer) localShare(platform string, probe bool, maxWait, minWait time.Duration) (time.Duration, bool) {
	w, ok := p.takeLocalShare(platform, maxWait, p.latch.recoverLeft(probe))
	if !ok {
		return minWait, true
	}
	if w > maxWait {
		p.latch.endProbe(probe)
		p.denied.Add(1)
		return w, false
	}
	return max(minWait, w), true
}

// reserved settles a shared reservation's outcome (key "": the platform's
// own): an unreachable database paces it locally, a latch probe ends, the
// counters count it.
func (p *Pacer) reserved(ctx context.Context, probe bool, platform, key string, maxWait time.Duration, res Reservation, err error) (Reservation, error) {
	if err != nil {
		switch {
		case ctx.Err() != nil:
			p.latch.endProbe(probe)
			return Reservation{}, fmt.Errorf("pacer: reserve %s: %w", platform, ctx.Err())
		case unreachable(err):
			p.fail(probe, err)
			return p.reserveLocal(platform, key, maxWait), nil
		default:
			p.succeed(probe)
			if errors.Is(err, ErrUnknownPlatform) {
				return Reservation{}, fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
			}
			if key != "" {
				return Reservation{}, fmt.Errorf("pacer: reserve %s key: %w", platform, err)
			}
			return Reservation{}, fmt.Errorf("pacer: reserve %s: %w", platform, err)
		}
	}
	p.succeed(probe)
	if res.Granted {
		p.granted.Add(1)
	} else {
		p.denied.Add(1)
	}
	return res, nil
}

// reserveShared runs reserveSQL for up to n slots, keeps the slots after the
// first for later calls (the first too when keepFirst: a refill's), catches
// up with slow-downs it missed, and updates the degraded-mode cache.
func (p *Pacer) reserveShared(ctx context.Context, platform string, maxWait, minWait time.Duration, n int, keepFirst bool) (Reservation, error) {
	var (
		at, first, interval, cursor, rate, maxMult, mult, hold, paused float64
		eventAt, eventShift, eventHorizon, tau, eventInterval          float64
		lease, freeAt                                                  float64
		count, burst                                                   int32
		seq                                                            int64
		respace                                                        bool
		rt                                                             trip
		received                                                       time.Time
	)
	for attempt := 0; ; attempt++ {
		var err error
		rt, err = p.queryRow(ctx, reserveSQL, []any{platform, maxWait.Seconds(), minWait.Seconds(), n, p.stmtNow(), p.tune,
			p.cfg.LeaseTTL.Seconds()},
			&at, &count, &first, &interval, &cursor, &rate, &burst, &maxMult, &mult, &seq, &hold, &paused,
			&eventAt, &eventShift, &eventHorizon, &tau, &eventInterval, &lease, &freeAt, &respace)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23503" { // foreign_key_violation
			return Reservation{}, ErrUnknownPlatform
		}
		if err != nil {
			return Reservation{}, err
		}
		received = p.clock.Now()
		p.observeRTT(rt.rtt)
		if rate > 0 {
			break
		}
		// The pace row was missing and has just been created without the
		// platform's configuration: copy it and reserve again.
		if attempt > 0 {
			return Reservation{}, fmt.Errorf("pacer: pace row of %q has no rate", platform)
		}
		qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
		_, err = p.pool.Exec(qctx, syncRowSQL, platform)
		cancel()
		if err != nil {
			return Reservation{}, err
		}
	}
	p.lastUse.Store(received.UnixNano())
	p.maybeListen()
	localNow := received
	mult = math.Max(mult, 1)
	res := Reservation{
		Platform:   platform,
		Granted:    count > 0,
		Wait:       max(secondsToDuration(first-at), 0),
		Paused:     count == 0 && paused > at,
		ReservedAt: epochToTime(at),
		Slot:       epochToTime(first),
		Multiplier: mult,
		Interval:   secondsToDuration(interval),
		maxWait:    maxWait,
		seq:        seq,
		rate:       rate,
		burst:      int(burst),
		spacing:    interval,
		lease:      lease,
	}
	if !res.Granted && freeAt > 0 {
		// Its open requests are at their cap: back when a lease ends, at
		// the latest in a second (one is given back as soon as its request
		// is answered).
		res.Retry = true
		res.Wait = min(max(secondsToDuration(freeAt-at), 0), time.Second)
	}
	if !res.Granted {
		res.Wait = clampDuration(res.Wait)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.answered(&res, at, rt, first,
		event{seq: seq, at: eventAt, interval: eventInterval, shift: eventShift, horizon: eventHorizon, hold: hold}, localNow)
	// Slots of a block granted before a slow-down this process already
	// applied were spaced for less: keep none of them.
	keepBlock := st.last.seq <= seq
	st.rate, st.burst, st.maxMult, st.mult, st.interval = rate, int(burst), maxMult, mult, interval
	st.noRespace = !respace
	if res.Granted {
		st.capped = lease > 0 // a capped row's slot always takes a lease
	} else if freeAt > 0 {
		st.capped = true // denied at the cap
	}
	if !res.Granted {
		// Backlogged until the slot (HeldFor); held, only when denied for a
		// hold or a pause (HoldLeft), and a degraded period starting now
		// must not go earlier (after a slot beyond maxWait, sharedEnd keeps
		// it later).
		st.far = maxTime(st.far, localNow.Add(res.Wait))
		if hold > at {
			st.hold = maxTime(st.hold, localNow.Add(clampDuration(secondsToDuration(hold-at))))
		}
	}
	// Slot 0 is first (when nothing was granted, the earliest one there is);
	// slot k of a block is max(first, cursor - tau - (count - k)·interval).
	base := cursor - tau - float64(count)*interval
	last := res.Wait
	if keepFirst && res.Granted && keepBlock {
		st.block = append(st.block, blockSlot{at: p.offset.local(first), slot: first, reservedAt: at,
			mult: mult, interval: interval, seq: seq, maxWait: maxWait})
		p.blockSlots.Add(1)
	}
	for k := 1; k < int(count) && keepBlock; k++ {
		slot := math.Max(first, base+float64(k)*interval)
		st.block = append(st.block, blockSlot{at: p.offset.local(slot), slot: slot, reservedAt: at,
			mult: mult, interval: interval, seq: seq, maxWait: maxWait})
		p.blockSlots.Add(1)
		last = secondsToDuration(slot - at)
	}
	if count > 1 || keepFirst {
		// Blocks taken concurrently by two calls (or a refill's) may interleave.
		slices.SortFunc(st.block, func(a, b blockSlot) int { return a.at.Compare(b.at) })
	}
	// A degraded period starting now goes after this block, and after every
	// slot the row had granted (its cursor), and as many more as were then
	// ahead of now: other processes may reserve after this
	// one last reached the row, until the database goes. A process that
	// paced locally from its own last slot on, while slots the row had
	// granted the others still went out, put 22 requests in a 1-s window
	// under a bound of 21 (TestDegradedProcessesKeepTheCeiling, under load).
	// (As of the latest reservation: a pause's cursor may be long past.)
	p.startDegradedAfter(st, res.Granted, localNow.Add(last), localNow, cursor-at)
	return res, nil
}

// startDegradedAfter sets where a degraded period starting now may begin
// for st: after its latest slot due (when granted: a degraded period
// continues from this block) and after every slot the row had granted,
// and as many more (lead: how far the row's cursor was ahead of the
// database's time; see reserveShared). Call with p.mu held.
func (p *Pacer) startDegradedAfter(st *localState, granted bool, due, now time.Time, lead float64) {
	if granted {
		st.tat = maxTime(st.tat, due.Add(st.degradedInterval(p.divisor())))
	}
	st.sharedEnd = now.Add(2 * secondsToDuration(max(lead, 0)))
}

// answered takes in a reservation's answer: the clock offset its round
// trip brackets, the local time of its first slot (res's due) and a
// slow-down it found (catchUp). It returns the platform's local state. Call
// with p.mu held.
func (p *Pacer) answered(res *Reservation, at float64, rt trip, first float64, ev event, now time.Time) *localState {
	p.offset.observe(at, p.sentAt(rt), rt.received)
	res.due = p.offset.local(first)
	st := p.state(res.Platform)
	p.catchUp(st, ev, now)
	st.holdEnded(res.Granted, ev.seq, ev.hold, at)
	return st
}

// holdEnded ends the fleet-wide hold this process heard of when a granted
// reservation found its row holding nothing at its time and no event newer
// than the row's is known here: the hold or pause is over (Resume sends no
// event; a notification may be missed). The process's own Retry-After
// (held) stands. Kept, a pause heard of left the platform without blocks
// (refill skips a held one) and held for ever in degraded pacing after a
// resume. Call with p.mu held.
func (st *localState) holdEnded(granted bool, seq int64, hold, at float64) {
	if granted && st.last.seq <= seq && hold <= at {
		st.hold = st.held
	}
}

// catchUp applies ev, a slow-down a reservation found that this process
// has not heard of yet (no listener, or its notification still on the
// way), as the notification would: blocks dropped, waiters re-spaced. (If
// several were missed, the slots the earlier ones would have moved are
// given back: respace.) Call with p.mu held.
func (p *Pacer) catchUp(st *localState, ev event, now time.Time) {
	if st.last.seq >= ev.seq {
		return
	}
	if st.rate > 0 {
		p.events.Add(1)
		p.dropBlock(st)
		for w := range st.waiters {
			if w.shared {
				p.respace(w, ev, now)
			}
		}
	}
	st.last = ev
}

// queryRow runs one statement of the hot path on a connection of the
// pacer's pool, bounded by Config.StatementTimeout through the connection's
// deadline: a timeout context costs a timer and a context watcher per call,
// several per cent of a reservation. ctx bounds the acquisition only (a new
// connection is bounded by Config.ConnectTimeout); once sent, the statement
// runs to its end or to the deadline, which closes the connection. It
// returns the statement's round trip (trip), from after the connection was
// acquired: blocks are sized by network time, not by a queue for the pool.
func (p *Pacer) queryRow(ctx context.Context, sql string, args []any, dest ...any) (trip, error) {
	c, err := p.pool.Acquire(ctx)
	if err != nil {
		return trip{}, err
	}
	defer c.Release()
	nc := c.Conn().PgConn().Conn()
	tr := p.startTrip()
	if err := nc.SetDeadline(time.Now().Add(p.cfg.StatementTimeout)); err != nil {
		return trip{}, err
	}
	err = c.QueryRow(context.Background(), sql, args...).Scan(dest...)
	tr.end(p.clock)
	_ = nc.SetDeadline(time.Time{}) // a closed connection's error does not matter
	return tr, err
}
