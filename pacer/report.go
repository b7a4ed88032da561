package pacer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/fleetpace/fleetpace/ratelimit"
	"github.com/jackc/pgx/v5"
)

// report is one statement's worth of reports of a platform.
type report struct {
	pressure   bool
	answered   int      // answers without pressure carried (clean and neutral)
	clean      int      // of which clean
	fresh      int      // of which to requests reserved since the latest slow-down known
	reservedAt *float64 // database time of the reservation (pressure)
	sentFrom   *float64 // the earliest slot of the answers carried, database time (nil: one unknown)
	sent       *float64 // the spacing the refused request's slot was granted at, seconds (pressure)
	retry      *float64 // Retry-After, seconds (pressure)
	announce   *announcement
	key        string // the key's row, not the platform's ("": the platform's)
}

// refused records what a report of pressure carries of the refusal: the
// Retry-After it asked for, if any, and when the refused request's slot
// was reserved (database time).
func (rep *report) refused(res Reservation, out Feedback) {
	if d := clampDuration(out.RetryAfter); d > 0 {
		s := d.Seconds()
		rep.retry = &s
	}
	if !res.ReservedAt.IsZero() {
		s := timeToEpoch(res.ReservedAt)
		rep.reservedAt = &s
	}
	// The refused request's slot: a learned window reads a refusal inside
	// the window it counted.
	if !res.Slot.IsZero() {
		s := timeToEpoch(res.Slot)
		rep.sentFrom = &s
	}
}

// announcement is what a destination's quota headers imply, in the pacer's
// terms (see spacing).
type announcement struct {
	interval float64  // seconds between requests (0: no spacing implied)
	ttl      float64  // how long it holds, seconds
	hold     *float64 // quota exhausted: hold this long, seconds
	// window is the quota's window (announced, or the longest Reset seen),
	// seconds (0: unknown), and limit its quota (0: unknown). The fleet
	// keeps the longest window any process saw and never paces the quota
	// faster than limit per that window; a slow-down it brings re-spaces as
	// if the requests the fleet sent in the last window had been spaced by
	// it.
	window, limit float64
	// paced: this process's own last announcement still spaced the
	// platform for this quota (see quotaHold).
	paced bool
	// share is the part of limit per window the fleet paces at (shareOf);
	// the report's statement takes it as its t[14].
	share float64
}

// quotaHold is how long this process holds itself for an exhausted quota
// (a's hold; 0 for none), by the rule the report's statement holds the
// fleet by: when the quota was paced already (a.paced: ceil(window /
// spacing) + burst - 1 <= limit, no window of the destination got more
// than its quota but for jitter), the answer came near the window's end
// and a reset in whole seconds is rounded up by up to a second, so the
// hold is a second shorter. Held for the rounded reset, the process that
// read a 1-s window's t=1 lost most of the next window while the fleet
// went on (0.76 of an announced window of 7 per second, each process in
// turn).
func (a *announcement) quotaHold() time.Duration {
	if a == nil || a.hold == nil {
		return 0
	}
	d := secondsToDuration(*a.hold)
	if d <= 0 || d%time.Second != 0 || !a.paced {
		return d
	}
	return d - time.Second
}

// Report tells the pacer how a request reserved by res ended, and what the
// destination announced. Rate pressure slows the fleet down once per
// episode (docs/design.md, "Adaptive pacing"); answers without pressure are
// what the destination accepted, which the fleet measures; an announced
// quota paces the fleet by it. Pressure, an exhausted quota and an
// announcement that slows the platform down are sent at once (and every
// process re-spaces the slots it holds); a Retry-After or an exhausted
// quota holds this process at once, before the report reaches the
// database. Other reports and announcements are gathered for
// Config.CleanBatch and sent together (the result is then Deferred). When
// the database is unreachable the report is dropped (counted) without
// blocking; pressure and holds still slow this process's degraded pacing.
func (p *Pacer) Report(ctx context.Context, platform string, res Reservation, out Feedback) (ReportResult, error) {
	p.reports.Add(1)
	p.release(ctx, res)
	if d := res.overrun(out.Sent); d > 0 {
		p.shiftForOverrun(ctx, platform, d)
	}
	if res.Key != "" && out.scope(res) == ScopeKey {
		return p.reportKey(ctx, platform, res, out)
	}
	rep := report{pressure: out.Kind == Pressure, announce: p.announce(platform, out.Quota, res.sentSpacing())}
	if out.answered() {
		rep.answered = 1
		if out.Kind == Clean {
			rep.clean = 1
		}
		if p.sinceSlowdown(platform, res) {
			rep.fresh = 1
		}
		if !res.Slot.IsZero() {
			s := timeToEpoch(res.Slot)
			rep.sentFrom = &s
		}
	}
	if !rep.pressure && rep.answered == 0 && rep.announce == nil {
		return p.cachedResult(platform), nil
	}
	// Pressure, or an announcement that slows the platform down, goes at
	// once; anything else may wait for the batch.
	slows := rep.pressure || p.slowsDown(platform, rep.announce)
	if !slows && p.cfg.CleanBatch > 0 {
		p.deferReport(platform, rep)
		r := p.cachedResult(platform)
		r.Deferred = true
		return r, nil
	}
	if rep.pressure {
		rep.refused(res, out)
		if res.Interval > 0 && !res.Degraded {
			s := res.interval()
			rep.sent = &s
		}
	}
	// A slow-down: slots kept from a block were spaced for the old pace,
	// clean reports gathered before pressure no longer extend a streak it
	// resets (what they answered still counts), and no slot of this process
	// goes until the report's answer has re-spaced it (closeGate).
	if slows {
		p.mu.Lock()
		p.dropBlock(p.local[platform])
		if pc := p.pending[platform]; pc != nil && rep.pressure {
			pc.clean = 0
		}
		p.mu.Unlock()
		open := p.closeGate(platform)
		defer open()
	}
	if hold := max(holdFor(out), rep.announce.quotaHold()); hold > 0 {
		p.holdLocally(platform, hold)
	}
	r, err := p.send(ctx, platform, rep)
	if err != nil {
		return ReportResult{}, fmt.Errorf("pacer: report %s: %w", platform, err)
	}
	return r, nil
}

// reportKey applies pressure or an announcement that speaks of res's key to
// the key's pace row, at once: its hold (here at once, then fleet-wide) and
// its adaptation are the key's alone. What the answer says of the whole
// platform — that the destination answered — goes to the platform's row as
// any answer does.
func (p *Pacer) reportKey(ctx context.Context, platform string, res Reservation, out Feedback) (ReportResult, error) {
	name := rowName(platform, res.Key)
	rep := report{pressure: out.Kind == Pressure, announce: p.announce(name, out.Quota, 0), key: res.Key}
	if rep.pressure {
		rep.refused(res, out)
		if !res.Degraded {
			p.mu.Lock()
			if st := p.local[name]; st != nil && st.interval > 0 {
				s := st.interval
				rep.sent = &s
			}
			p.mu.Unlock()
		}
	} else if out.answered() {
		// The platform hears of the answer as of any other.
		if _, err := p.Report(ctx, platform, Reservation{Platform: platform, ReservedAt: res.ReservedAt}, Feedback{Kind: out.Kind}); err != nil {
			return ReportResult{}, err
		}
	}
	if hold := max(holdFor(out), rep.announce.quotaHold()); hold > 0 {
		p.holdLocally(name, hold)
	}
	if !rep.pressure && (rep.announce == nil || !p.slowsDown(name, rep.announce)) {
		// Nothing that slows the key down: its announcement waits for one
		// that does (they come with every answer).
		return p.cachedResult(platform), nil
	}
	open := p.closeGate(name)
	defer open()
	r, err := p.send(ctx, platform, rep)
	if err != nil {
		return ReportResult{}, fmt.Errorf("pacer: report %s key: %w", platform, err)
	}
	return r, nil
}

// sinceSlowdown reports whether res was reserved at or after the latest
// slow-down of platform this process knows of: its answer tells what the
// destination accepts at the pace in force.
func (p *Pacer) sinceSlowdown(platform string, res Reservation) bool {
	if res.ReservedAt.IsZero() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	return st == nil || timeToEpoch(res.ReservedAt) >= st.last.at
}

// announce is q in the pacer's terms, or nil if q says nothing usable. It
// remembers the longest Reset the platform announced in the last
// resetMemory, as the window of a quota that announces none, and the
// largest Remaining, as the slack the quota is paced by (shareOf). sent is
// the spacing the answered request's slot was granted at (seconds; 0:
// unknown).
func (p *Pacer) announce(platform string, q ratelimit.Info, sent float64) *announcement {
	if !q.Announced() && !q.HasReset {
		return nil
	}
	now := p.clock.Now()
	// One lock: the spacing in force is read and replaced as one step.
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state(platform)
	if q.HasReset && q.Reset > 0 && (q.Reset >= st.maxReset || now.Sub(st.maxResetAt) > resetMemory) {
		st.maxReset, st.maxResetAt = q.Reset, now
	}
	if q.HasRemaining && q.Remaining >= 0 && !math.IsInf(q.Remaining, 1) &&
		(st.maxRemainingAt.IsZero() || q.Remaining >= st.maxRemaining || now.Sub(st.maxRemainingAt) > resetMemory) {
		st.maxRemaining, st.maxRemainingAt = q.Remaining, now
	}
	window := st.maxReset
	if q.Window == 0 {
		window = wholeWindow(window)
	}
	var slack float64 // unknown: the 3 % margin
	if p.tuning.shareBySlack && !st.maxRemainingAt.IsZero() {
		slack = st.maxRemaining + 1
	}
	interval, ttl, hold := spacing(q, window, slack)
	if interval <= 0 && hold <= 0 {
		return nil
	}
	if q.Window > 0 {
		window = q.Window
	}
	a := &announcement{interval: interval.Seconds(), ttl: ttl.Seconds(), window: window.Seconds(), share: announcedShare}
	if q.Limit > 0 && !math.IsInf(q.Limit, 1) {
		a.limit, a.share = q.Limit, shareOf(min(slack, q.Limit))
	}
	// As the report's statement decides for the fleet: the spacing in
	// force before this answer put no more than the quota in a window —
	// this process's own last announcement, or the spacing the answered
	// request was sent at when that was the quota's (at most its share
	// under it: a fleet paced far under a quota exhausts it only with
	// others, at any point of the window). A worker that sent nothing to
	// the platform for longer than the announcement's time to live (River
	// hands a platform's jobs to whichever process fetches them: seconds,
	// at 8/s among three) has no announcement of its own in force; held by
	// its first answer's rounded reset, it left a second's hole in the
	// fleet's schedule (a strict limiter announcing q=8;w=1 answers
	// Remaining 0 and t=1 to every request).
	quotaPaced := func(spacing float64) bool {
		return spacing > 0 && math.Ceil(a.window/spacing-1e-9)+float64(max(st.burst, 1))-1 <= a.limit
	}
	a.paced = a.limit > 0 && a.window > 0 &&
		(now.Before(st.annUntil) && quotaPaced(st.annInterval) ||
			quotaPaced(sent) && sent <= a.window/(a.limit*announcedShare)*(1+1e-9))
	if interval > 0 {
		st.annInterval, st.annUntil = interval.Seconds(), now.Add(ttl)
	}
	if hold > 0 {
		s := hold.Seconds()
		a.hold = &s
	}
	return a
}

// wholeWindow is the window a quota that announces none has, from the
// longest Reset seen (w): the next whole second when w falls short of it
// by at most a tenth. A fixed window's first answer tells its length less
// the time the request took to be answered and the time since the window
// began (0.953 s of a 1-s window, seen in a test): paced at Limit per
// that, five requests spaced 196 ms fell into one window with a sixth.
// Windows are whole seconds (1 s, a minute, an hour); a Reset further
// short of one is a token bucket's refill time, kept as it is.
func wholeWindow(w time.Duration) time.Duration {
	if w <= 0 || w%time.Second == 0 {
		return w
	}
	up := w.Truncate(time.Second) + time.Second
	if up-w <= up/10 {
		return up
	}
	return w
}

// resetMemory is how long the longest Reset a platform announced stands for
// its quota's window before a shorter one replaces it.
const resetMemory = 5 * time.Minute

// slowsDown reports whether an announcement must be sent at once: it holds
// the fleet, or asks for a spacing larger by more than respaceRatio than
// this process last saw in force.
func (p *Pacer) slowsDown(platform string, a *announcement) bool {
	if a == nil {
		return false
	}
	if a.hold != nil {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.local[platform]
	return st == nil || a.interval > st.interval*respaceRatio
}

// send stores one statement's reports, or drops them when the database is
// unreachable.
func (p *Pacer) send(ctx context.Context, platform string, rep report) (ReportResult, error) {
	shared, probe, _ := p.latch.admit()
	if !shared {
		return p.dropReport(platform, rep), nil
	}
	r, err := retrySlowConnect(ctx, p, func() (ReportResult, error) { return p.reportShared(ctx, platform, rep) })
	if err != nil {
		switch {
		case ctx.Err() != nil:
			p.latch.endProbe(probe)
			return ReportResult{}, ctx.Err()
		case unreachable(err):
			p.fail(probe, err)
			return p.dropReport(platform, rep), nil
		default:
			p.succeed(probe)
			if errors.Is(err, ErrUnknownPlatform) {
				return ReportResult{}, fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
			}
			return ReportResult{}, err
		}
	}
	p.succeed(probe)
	return r, nil
}

// deferReport adds a clean report and its announcement (the latest wins) to
// platform's batch, and starts the batch's timer if it is the first.
func (p *Pacer) deferReport(platform string, rep report) {
	p.deferred.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.pending[platform]
	if pc == nil {
		pc = &pendingClean{}
		p.pending[platform] = pc
	}
	pc.answered += rep.answered
	pc.clean += rep.clean
	pc.fresh += rep.fresh
	if rep.answered > 0 {
		switch {
		case rep.sentFrom == nil:
			pc.slotUnknown = true
		case pc.sentFrom == 0 || *rep.sentFrom < pc.sentFrom:
			pc.sentFrom = *rep.sentFrom
		}
	}
	if rep.announce != nil {
		pc.announce = rep.announce
	}
	if pc.timer == nil && !p.closing {
		p.timers.Add(1)
		pc.timer = p.clock.AfterFunc(p.cfg.CleanBatch, func() {
			defer p.timers.Done()
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.StatementTimeout)
			defer cancel()
			p.flushPlatform(ctx, platform)
		})
	}
}

// Flush sends every platform's pending clean reports now.
func (p *Pacer) Flush(ctx context.Context) {
	p.mu.Lock()
	platforms := make([]string, 0, len(p.pending))
	for name := range p.pending {
		platforms = append(platforms, name)
	}
	p.mu.Unlock()
	for _, name := range platforms {
		p.flushPlatform(ctx, name)
	}
}

// flushPlatform sends platform's pending clean reports in one statement.
func (p *Pacer) flushPlatform(ctx context.Context, platform string) {
	p.mu.Lock()
	pc := p.pending[platform]
	if pc == nil || p.closed {
		p.mu.Unlock()
		return
	}
	rep := report{answered: pc.answered, clean: pc.clean, fresh: pc.fresh, announce: pc.announce}
	if s := pc.sentFrom; s > 0 && !pc.slotUnknown {
		rep.sentFrom = &s
	}
	pc.answered, pc.clean, pc.fresh, pc.announce, pc.sentFrom, pc.slotUnknown = 0, 0, 0, nil, 0, false
	if pc.timer != nil {
		if pc.timer.Stop() { // it will not run: its Done is ours to call
			p.timers.Done()
		}
		pc.timer = nil
	}
	p.mu.Unlock()
	if rep.answered == 0 && rep.announce == nil {
		return
	}
	r, err := p.send(ctx, platform, rep)
	switch {
	case errors.Is(err, ErrUnknownPlatform):
		// Deleted meanwhile: nothing left to report to.
		p.log.Debug("pacer: reports for a platform that no longer exists dropped", "platform", platform, "reports", rep.answered)
	case err != nil:
		p.log.Warn("pacer: clean reports not sent", "platform", platform, "reports", rep.answered, "error", err)
	case r.Relaxed:
		p.log.Info("pacer: clean streak relaxed the backoff multiplier", "platform", platform, "multiplier", r.Multiplier)
	}
}

func (p *Pacer) reportShared(ctx context.Context, platform string, rep report) (ReportResult, error) {
	qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
	defer cancel()
	var (
		r                                                   ReportResult
		effect                                              int16
		streak                                              int32
		holdLeft, eventAt, interval, shift, horizon, holdAt float64
		seq                                                 int64
		announced, quotaHold                                *float64
		ttl                                                 float64
		window, limit                                       *float64
		fleetWindow                                         float64
	)
	if a := rep.announce; a != nil {
		if a.interval > 0 {
			announced, ttl = &a.interval, a.ttl
			if a.window > 0 {
				window = &a.window
			}
			if a.limit > 0 {
				limit = &a.limit
			}
		}
		quotaHold = a.hold
	}
	reason := "Retry-After"
	if quotaHold != nil && rep.retry == nil {
		reason = "quota exhausted"
	}
	tune := p.tune
	if a := rep.announce; a != nil && a.share > 0 && a.share != tune[tuneAnnounced] {
		tune = slices.Clone(tune)
		tune[tuneAnnounced] = a.share
	}
	args := []any{platform, p.stmtNow(), rep.pressure, rep.reservedAt, rep.sent, rep.retry, rep.answered, rep.clean, rep.fresh,
		announced, ttl, quotaHold, reason, window, limit, tune, rep.key, rep.sentFrom}
	for attempt := 0; ; attempt++ {
		err := p.pool.QueryRow(qctx, reportSQL, args...).
			Scan(&r.Multiplier, &r.MaxMultiplier, &streak, &effect, &holdLeft,
				&seq, &eventAt, &interval, &shift, &horizon, &holdAt, &r.Respaced, &fleetWindow, &r.Estimate)
		if errors.Is(err, pgx.ErrNoRows) && attempt == 0 {
			// No pace row, or one without configuration: make it whole, then
			// apply the report to it.
			if rep.key != "" {
				if _, err := p.pool.Exec(qctx, ensureKeyRowSQL, platform, rep.key, p.stmtNow()); err != nil {
					return r, err
				}
				continue
			}
			if _, err := p.pool.Exec(qctx, ensureRowSQL, platform); err != nil {
				return r, err
			}
			if _, err := p.pool.Exec(qctx, syncRowSQL, platform); err != nil {
				return r, err
			}
			continue
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return r, ErrUnknownPlatform
		}
		if err != nil {
			return r, err
		}
		break
	}
	r.CleanStreak = int(streak)
	r.Hold = secondsToDuration(holdLeft)
	r.Increased = effect == effectIncreased
	r.AtMax = effect == effectAtMax
	r.Stale = effect == effectStale
	r.Relaxed = effect == effectRelaxed
	r.Jitter = effect == effectJitter
	r.Quota = effect == effectQuota
	if r.Respaced {
		p.applyEvent(rowName(platform, rep.key), event{seq: seq, at: eventAt, interval: interval, shift: shift, horizon: horizon, hold: holdAt})
	}

	localNow := p.clock.Now()
	p.mu.Lock()
	st := p.state(rowName(platform, rep.key))
	st.mult, st.maxMult = r.Multiplier, r.MaxMultiplier
	if interval > 0 {
		st.interval = interval
	}
	st.hold = maxTime(st.hold, localNow.Add(r.Hold))
	// The longest quota window any process saw: this process's next
	// announcements are spaced by it too.
	if w := secondsToDuration(fleetWindow); w > st.maxReset {
		st.maxReset, st.maxResetAt = w, localNow
	}
	p.mu.Unlock()
	return r, nil
}

// dropReport counts reports the database did not get and applies pressure
// and holds to the local (degraded) pacing only: the multiplier doubles
// locally, whatever the platform's backoff factor.
func (p *Pacer) dropReport(platform string, rep report) ReportResult {
	p.dropped.Add(uint64(max(rep.answered, 1)))
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	r := ReportResult{Dropped: true}
	st := p.local[platform]
	if st == nil {
		return r
	}
	if rep.pressure {
		r.AtMax = st.mult >= st.maxMult
		st.mult = math.Min(st.mult*2, st.maxMult)
		if rep.retry != nil {
			st.hold = maxTime(st.hold, now.Add(secondsToDuration(*rep.retry)))
		}
	}
	if a := rep.announce; a != nil {
		st.interval = math.Max(st.interval, a.interval)
		if a.hold != nil {
			st.hold = maxTime(st.hold, now.Add(secondsToDuration(*a.hold)))
		}
	}
	r.Multiplier, r.MaxMultiplier = st.mult, st.maxMult
	r.Hold = max(st.hold.Sub(now), 0)
	return r
}

func (p *Pacer) cachedResult(platform string) ReportResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.local[platform]; st != nil {
		return ReportResult{Multiplier: st.mult, MaxMultiplier: st.maxMult}
	}
	return ReportResult{}
}
