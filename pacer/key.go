package pacer

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Keys: a platform may limit each key (an account, a token's name, a tenant)
// separately as well as the whole. A keyed request takes its slot from the
// key's pace row and the platform's in one statement (reserveKeySQL), so the
// fleet never sends more than the key's rate + burst for any key nor the
// platform's for all keys together. The key's row lives beside the
// platform's in fleetpace_pace, created on first use (ensureKeyRowSQL) and
// removed when idle (PruneKeys); its adaptation — a 429 for that key, a
// quota it announced — is its own. A process's keyed reservations of one
// platform go out in batches (keybatch.go), so the platform's row is
// locked once per batch.

// MaxKeyLen is the longest key, in bytes.
const MaxKeyLen = 200

// ErrInvalidKey is returned for a key longer than MaxKeyLen or not UTF-8.
var ErrInvalidKey = errors.New("pacer: invalid key")

// rowName is how this process names a pace row in its local state and how
// the database names it in notifications (fleetpace_pace_channel_name):
// "platform", or "platform/hex of the key".
func rowName(platform, key string) string {
	if key == "" {
		return platform
	}
	return platform + "/" + hex.EncodeToString([]byte(key))
}

// isKeyRow reports whether a local state's name is a key's.
func isKeyRow(name string) bool { return strings.Contains(name, "/") }

// ReserveKey is Reserve for a request of platform's key: a slot of the key
// and of the platform both. With key "" it is Reserve. A key's slot is
// never taken from a block; when the key's next slot is later than the
// platform's, nothing is booked and the reservation is denied with Retry
// set (reserve again after Wait: Acquire does).
func (p *Pacer) ReserveKey(ctx context.Context, platform, key string, maxWait time.Duration) (Reservation, error) {
	if key == "" {
		return p.Reserve(ctx, platform, maxWait)
	}
	if len(key) > MaxKeyLen || !utf8.ValidString(key) {
		return Reservation{}, fmt.Errorf("%w: %d bytes (at most %d, UTF-8)", ErrInvalidKey, len(key), MaxKeyLen)
	}
	p.reservations.Add(1)
	maxWait = max(maxWait, 0)
	held, keyHeld := p.heldLocally(platform), p.heldLocally(rowName(platform, key))
	if max(held, keyHeld) > maxWait || keyHeld > held {
		// Held: a key's hold books nothing on the platform's schedule
		// (a slot at the hold's end would make every other key wait
		// behind it); Acquire waits a hold within its bound out and
		// reserves again.
		p.denied.Add(1)
		return Reservation{Platform: platform, Key: key, Wait: max(held, keyHeld)}, nil
	}
	shared, probe, recovering := p.latch.admit()
	if !shared {
		return p.reserveLocal(platform, key, maxWait), nil
	}
	minWait := held
	if probe || recovering {
		// As Reserve: this process's local share first, one at a time.
		p.recoveryMu.Lock()
		defer p.recoveryMu.Unlock()
		var ok bool
		if minWait, ok = p.localShare(platform, probe, maxWait, minWait); !ok {
			return Reservation{Platform: platform, Key: key, Wait: minWait}, nil
		}
	}
	res, err := retrySlowConnect(ctx, p, func() (Reservation, error) {
		return p.reserveKeyShared(ctx, platform, key, maxWait, minWait)
	})
	return p.reserved(ctx, probe, platform, key, maxWait, res, err)
}

// reserveKeyShared runs reserveKeySQL, making the key's row on its first
// use, and catches up with both rows' events.
func (p *Pacer) reserveKeyShared(ctx context.Context, platform, key string, maxWait, minWait time.Duration) (Reservation, error) {
	var (
		at, pFirst, kFirst, freeAt, pI, kI, cursor, rate, maxMult, mult float64
		hold, paused, eventAt, eventShift, eventHorizon, eventInterval  float64
		kRate, kHold, kPaused, lease                                    float64
		granted, full, respace                                          bool
		burst, kBurst                                                   int32
		seq, kSeq                                                       int64
		rt                                                              trip
	)
	for attempt := 0; ; attempt++ {
		var err error
		rt, err = p.reserveKeyRow(ctx, platform,
			[]any{platform, key, maxWait.Seconds(), minWait.Seconds(), p.stmtNow(), p.tune, p.cfg.LeaseTTL.Seconds()},
			[]any{&at, &granted, &pFirst, &kFirst, &full, &freeAt, &pI, &kI,
				&cursor, &rate, &burst, &maxMult, &mult, &seq, &hold, &paused, &eventAt, &eventShift, &eventHorizon, &eventInterval,
				&kRate, &kBurst, &kSeq, &kHold, &kPaused, &lease, &respace})
		if errors.Is(err, pgx.ErrNoRows) && attempt == 0 {
			// The key's first use (or the platform's row is missing).
			qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
			tag, err := p.pool.Exec(qctx, ensureKeyRowSQL, platform, key, p.stmtNow())
			if err == nil && tag.RowsAffected() == 0 {
				_, err = p.pool.Exec(qctx, ensureRowSQL, platform)
				if err == nil {
					_, err = p.pool.Exec(qctx, syncRowSQL, platform)
				}
			}
			cancel()
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "23503" {
				return Reservation{}, ErrUnknownPlatform
			}
			if err != nil {
				return Reservation{}, err
			}
			continue
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return Reservation{}, ErrUnknownPlatform
		}
		if err != nil {
			return Reservation{}, err
		}
		break
	}
	received := p.clock.Now()
	p.observeRTT(rt.rtt)
	p.lastUse.Store(received.UnixNano())
	p.maybeListen()
	res := Reservation{
		Platform: platform, Key: key, Granted: granted,
		Wait:       max(secondsToDuration(pFirst-at), 0),
		Paused:     !granted && math.Max(paused, kPaused) > at,
		ReservedAt: epochToTime(at),
		Slot:       epochToTime(pFirst),
		Multiplier: math.Max(mult, 1),
		Interval:   secondsToDuration(math.Max(pI, kI)),
		maxWait:    maxWait,
		seq:        seq,
		rate:       rate,
		burst:      int(burst),
		spacing:    pI,
		lease:      lease,
	}
	switch {
	case granted:
	case full:
		res.Retry = true
		res.Wait = min(max(secondsToDuration(freeAt-at), 0), time.Second)
	case kFirst > pFirst && !res.Paused && kHold <= at:
		// The key's next slot is later: nothing was booked.
		res.Retry = true
		res.Wait = max(secondsToDuration(kFirst-at), 0)
	case kFirst > pFirst:
		res.Wait = max(secondsToDuration(kFirst-at), 0) // the key is held or paused
	}
	if !granted {
		res.Wait = clampDuration(res.Wait)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.answered(&res, at, rt, pFirst,
		event{seq: seq, at: eventAt, interval: eventInterval, shift: eventShift, horizon: eventHorizon, hold: hold}, received)
	if st.rate == 0 {
		st.rate, st.burst, st.maxMult, st.mult, st.interval = rate, int(burst), maxMult, mult, pI
	}
	st.noRespace = !respace
	// A key's cap makes the platform capped for degraded pacing, which
	// paces the platform alone (reserveLocal); it stays so.
	st.capped = st.capped || lease > 0 || full
	st.keysLimited = st.keysLimited || kRate > 0
	kst := p.state(rowName(platform, key))
	kst.holdEnded(granted, kSeq, kHold, at)
	if kst.last.seq < kSeq {
		p.giveBackKey(kst)
		kst.last = event{seq: kSeq, at: at, hold: kHold}
	}
	kst.rate, kst.burst, kst.interval, kst.noRespace = kRate, int(kBurst), kI, !respace
	// A degraded period starting now continues after this slot, for the
	// platform and the key, and after the row's slots: a keyed process
	// that paced locally from now put its first local slot before the
	// others' (TestDegradedStartsAfterTheRowsSlots/keyed=true).
	due := received.Add(res.Wait)
	p.startDegradedAfter(st, granted, due, received, cursor-at)
	if granted && kRate > 0 {
		kst.tat = maxTime(kst.tat, due.Add(kst.degradedInterval(p.divisor())))
	}
	if !granted && !res.Retry && kFirst > pFirst {
		// Denied for the key's hold or pause: HoldLeft says so.
		kst.hold = maxTime(kst.hold, received.Add(res.Wait))
	}
	return res, nil
}

// giveBackKey gives back every slot callers of a key sleep on: the key
// slowed down or is held (its own 429, its quota), and its slots were
// booked on the platform's schedule too, which a key cannot re-space.
// Call with p.mu held.
func (p *Pacer) giveBackKey(st *localState) {
	for w := range st.waiters {
		if w.givenBack {
			continue
		}
		p.giveBack(w)
	}
}

// AcquireKey is Acquire for a request of platform's key (ReserveKey); key
// "" is Acquire.
//
// A process's callers of one key take turns: while one waits for the key's
// next slot (a Retry: nothing is booked for it), the others queue behind it
// rather than each waiting for the same slot and racing for it; a caller
// that would queue longer than maxWait (the callers ahead × the key's
// spacing) is denied at once with that wait — a River job snoozes instead
// of holding a worker a hot key's queue would keep busy, and other keys'
// jobs get the workers.
func (p *Pacer) AcquireKey(ctx context.Context, platform, key string, maxWait time.Duration) (Reservation, error) {
	if key == "" {
		return p.Acquire(ctx, platform, maxWait)
	}
	k := &keySlotter{p: p, key: key, turn: p.keyTurn(rowName(platform, key))}
	defer k.done()
	return AcquireFrom(ctx, k, p.clock, platform, maxWait)
}

// keyTurn is one key's turnstile in this process: turn is held by the
// caller whose turn it is to reserve; users counts the callers holding or
// waiting for it (under Pacer.mu; the entry goes when it is 0).
type keyTurn struct {
	row   string
	turn  chan struct{}
	users int
	until time.Time     // the caller whose turn it is waits until then (a denial it waits out)
	held  bool          // … for the key's hold (not its next slot)
	avg   time.Duration // how long a turn takes lately (moving average; 0: unknown)
}

// keyTurn returns row's turnstile, counting the caller in.
func (p *Pacer) keyTurn(row string) *keyTurn {
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.turns[row]
	if t == nil {
		t = &keyTurn{row: row, turn: make(chan struct{}, 1)}
		p.turns[row] = t
	}
	t.users++
	return t
}

// keySlotter reserves for one key, in its turn.
type keySlotter struct {
	p     *Pacer
	key   string
	turn  *keyTurn
	held  bool      // this caller holds the turn
	since time.Time // … since then
}

func (k *keySlotter) Reserve(ctx context.Context, platform string, maxWait time.Duration) (Reservation, error) {
	row := rowName(platform, k.key)
	if !k.held {
		if w, behindHold := k.queueWait(row); behindHold {
			// Behind a hold the caller whose turn it is waits out alone:
			// nothing is booked, and a River job would hold a worker for
			// nothing while other keys' jobs wait (it snoozes until the
			// hold ends; Transport waits and asks again).
			k.p.denied.Add(1)
			return Reservation{Platform: platform, Key: k.key, Wait: w, behind: true}, nil
		} else if w > maxWait {
			// A line longer than the bound: back when this caller's wait
			// would fit it (the line drains meanwhile; a job that waited
			// the whole line out would come back with the others at once).
			k.p.denied.Add(1)
			return Reservation{Platform: platform, Key: k.key, Wait: w - maxWait, behind: true}, nil
		}
		select {
		case k.turn.turn <- struct{}{}:
			// Nobody's turn: no timer (a test counting the clock's
			// sleepers would take one for a caller in line).
			k.held, k.since = true, k.p.clock.Now()
		default:
			if res, err := k.await(ctx, row, platform, maxWait); err != nil || !k.held {
				return res, err
			}
		}
	}
	res, err := k.p.ReserveKey(ctx, platform, k.key, maxWait)
	if err == nil && !res.Granted && !res.Paused && res.Wait < maxWait {
		// Denied for a while that Acquire waits out (the key's next slot,
		// its hold, its cap): keep the turn meanwhile.
		k.p.mu.Lock()
		k.turn.until, k.turn.held = k.p.clock.Now().Add(res.Wait), !res.Retry
		k.p.mu.Unlock()
		return res, nil
	}
	k.release() // granted, or denied for longer: the next caller's turn
	return res, err
}

// await waits in line for the turn, at most maxWait: k.held when it came.
func (k *keySlotter) await(ctx context.Context, row, platform string, maxWait time.Duration) (Reservation, error) {
	t := k.p.clock.NewTimer(maxWait)
	defer t.Stop()
	select {
	case k.turn.turn <- struct{}{}:
		k.held, k.since = true, k.p.clock.Now()
		return Reservation{}, nil
	case <-t.Chan():
		k.p.denied.Add(1)
		w, _ := k.queueWait(row)
		return Reservation{Platform: platform, Key: k.key, Wait: max(w-maxWait, 0), behind: true}, nil
	case <-ctx.Done():
		return Reservation{}, fmt.Errorf("pacer: reserve %s key: %w", platform, ctx.Err())
	}
}

// queueWait is how long the callers ahead of this one will take: a turn's
// recent length each (the key's spacing when it paces them, shared with
// other processes' callers; nearly nothing when the platform does), or the
// hold of the one whose turn it is and the others' turns after it (0:
// nobody ahead); and whether this caller would queue behind a hold.
func (k *keySlotter) queueWait(row string) (time.Duration, bool) {
	k.p.mu.Lock()
	defer k.p.mu.Unlock()
	ahead := k.turn.users - 1
	if ahead <= 0 {
		return 0, false
	}
	left := k.turn.until.Sub(k.p.clock.Now())
	if left <= 0 {
		return time.Duration(ahead) * k.turn.avg, false
	}
	per := k.turn.avg
	if st := k.p.local[row]; !k.turn.held && st != nil {
		per = max(per, secondsToDuration(st.interval)) // it waits for the key's next slot: the key paces its callers
	}
	return left + time.Duration(ahead-1)*per, k.turn.held
}

func (k *keySlotter) release() {
	if !k.held {
		return
	}
	k.held = false
	d := k.p.clock.Since(k.since)
	k.p.mu.Lock()
	if k.turn.avg == 0 {
		k.turn.avg = d
	} else {
		k.turn.avg = (7*k.turn.avg + 3*d) / 10
	}
	k.turn.held = false
	k.p.mu.Unlock()
	<-k.turn.turn
}

// done releases the turn if held and counts the caller out.
func (k *keySlotter) done() {
	k.release()
	k.p.mu.Lock()
	defer k.p.mu.Unlock()
	if k.turn.users--; k.turn.users == 0 {
		delete(k.p.turns, k.turn.row)
	}
}

func (k *keySlotter) Sleep(ctx context.Context, res *Reservation) error { return k.p.Sleep(ctx, res) }

func (k *keySlotter) returnLease(ctx context.Context, res Reservation) { k.p.returnLease(ctx, res) }

// release gives back res's lease, if it took one (rows that cap open
// requests), at once: a report waits for no batch to do it. When the
// database is unreachable the lease expires by itself (Config.LeaseTTL).
func (p *Pacer) release(ctx context.Context, res Reservation) {
	if res.lease == 0 {
		return
	}
	if shared, probe, _ := p.latch.admit(); !shared || probe {
		p.latch.endProbe(probe)
		return
	}
	qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
	defer cancel()
	if _, err := p.pool.Exec(qctx, releaseSQL, res.Platform, res.Key, res.lease); err != nil && unreachable(err) {
		p.fail(false, err)
	}
}

// DefaultKeyIdle is how long a key's pace row stays after its last slot,
// hold and lease (PruneKeys): an account polled every few minutes keeps
// its state; ten thousand keys seen once do not stay for ever.
const DefaultKeyIdle = 10 * time.Minute

// PruneKeys removes the pace rows of keys idle for longer than idle — no
// slot granted since, no hold or pause in force, no lease open —, at most
// limit of them; the next request of such a key makes its row again. It
// returns how many it removed. The scan tick calls it.
func PruneKeys(ctx context.Context, db Execer, idle time.Duration, limit int) (int64, error) {
	tag, err := db.Exec(ctx, pruneKeysSQL, idle.Seconds(), limit, statementTime(ctx))
	if err != nil {
		return 0, fmt.Errorf("pacer: prune keys: %w", err)
	}
	return tag.RowsAffected(), nil
}
