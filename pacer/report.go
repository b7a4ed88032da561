package pacer

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// Report tells the pacer how a request reserved by res ended. Rate pressure
// doubles the shared multiplier once per window and resets the fleet-wide
// clean streak; clean responses extend it and halve the multiplier every
// decay_after of them. Pressure is sent at once; clean reports are gathered
// for Config.CleanBatch and sent together (the result is then Deferred).
// When the database is unreachable the report is dropped (counted) without
// blocking; pressure still slows this process's degraded pacing.
func (p *Pacer) Report(ctx context.Context, platform string, res Reservation, out Outcome) (ReportResult, error) {
	p.reports.Add(1)
	if out.Kind != Clean && out.Kind != Pressure {
		return p.cachedResult(platform), nil
	}
	if out.Kind == Clean && p.cfg.CleanBatch > 0 {
		p.deferClean(platform)
		r := p.cachedResult(platform)
		r.Deferred = true
		return r, nil
	}
	var retry *float64
	if out.Kind == Pressure {
		d := out.RetryAfter
		if !out.RetryAt.IsZero() {
			d = max(d, out.RetryAt.Sub(p.clock.Now()))
		}
		if d > 0 {
			s := d.Seconds()
			retry = &s
		}
		p.mu.Lock()
		// Slots kept from a block were spaced for the old multiplier, and
		// clean reports gathered before this pressure no longer extend a
		// streak it resets.
		p.dropBlock(p.local[platform])
		if pc := p.pending[platform]; pc != nil {
			pc.n = 0
		}
		p.mu.Unlock()
	}
	var reservedAt *float64
	if !res.ReservedAt.IsZero() {
		s := timeToEpoch(res.ReservedAt)
		reservedAt = &s
	}
	r, err := p.send(ctx, platform, out, reservedAt, retry, 1)
	if err != nil {
		return ReportResult{}, fmt.Errorf("pacer: report %s: %w", platform, err)
	}
	return r, nil
}

// send stores n reports of one kind, or drops them when the database is
// unreachable.
func (p *Pacer) send(ctx context.Context, platform string, out Outcome, reservedAt, retry *float64, n int) (ReportResult, error) {
	shared, probe, _ := p.latch.admit()
	if !shared {
		return p.dropReport(platform, out, retry, n), nil
	}
	r, err := p.reportShared(ctx, platform, out.Kind == Pressure, reservedAt, retry, n)
	if err != nil {
		switch {
		case ctx.Err() != nil:
			p.latch.endProbe(probe)
			return ReportResult{}, ctx.Err()
		case unreachable(err):
			p.fail(probe, err)
			return p.dropReport(platform, out, retry, n), nil
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

// deferClean adds a clean report to platform's batch, and starts the batch's
// timer if it is the first.
func (p *Pacer) deferClean(platform string) {
	p.deferred.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	pc := p.pending[platform]
	if pc == nil {
		pc = &pendingClean{}
		p.pending[platform] = pc
	}
	pc.n++
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
	n := pc.n
	pc.n = 0
	if pc.timer != nil {
		if pc.timer.Stop() { // it will not run: its Done is ours to call
			p.timers.Done()
		}
		pc.timer = nil
	}
	p.mu.Unlock()
	if n == 0 {
		return
	}
	r, err := p.send(ctx, platform, Outcome{Kind: Clean}, nil, nil, n)
	switch {
	case err != nil:
		p.log.Warn("pacer: clean reports not sent", "platform", platform, "reports", n, "error", err)
	case r.Halved:
		p.log.Info("pacer: clean streak halved the backoff multiplier", "platform", platform, "multiplier", r.Multiplier)
	}
}

func (p *Pacer) reportShared(ctx context.Context, platform string, pressure bool, reservedAt, retry *float64, n int) (ReportResult, error) {
	qctx, cancel := context.WithTimeout(ctx, p.cfg.StatementTimeout)
	defer cancel()
	var (
		r      ReportResult
		effect int16
		streak int32
		hold   float64
	)
	for attempt := 0; ; attempt++ {
		err := p.pool.QueryRow(qctx, reportSQL, platform, pressure, reservedAt, retry, n).
			Scan(&r.Multiplier, &r.MaxMultiplier, &streak, &effect, &hold)
		if errors.Is(err, pgx.ErrNoRows) && attempt == 0 {
			// No pace row yet: create it, then apply the report to it.
			if _, err := p.pool.Exec(qctx, ensureRowSQL, platform); err != nil {
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
	r.Hold = secondsToDuration(hold)
	r.Doubled = effect == effectDoubled
	r.AtMax = effect == effectAtMax
	r.Stale = effect == effectStale
	r.Halved = effect == effectHalved

	localNow := p.clock.Now()
	p.mu.Lock()
	if st := p.local[platform]; st != nil {
		st.mult, st.maxMult = r.Multiplier, r.MaxMultiplier
		st.hold = maxTime(st.hold, localNow.Add(r.Hold))
	}
	p.mu.Unlock()
	return r, nil
}

// dropReport counts reports the database did not get and applies pressure
// to the local (degraded) pacing only.
func (p *Pacer) dropReport(platform string, out Outcome, retry *float64, n int) ReportResult {
	p.dropped.Add(uint64(n))
	p.mu.Lock()
	defer p.mu.Unlock()
	r := ReportResult{Dropped: true}
	st := p.local[platform]
	if st == nil {
		return r
	}
	if out.Kind == Pressure {
		r.AtMax = st.mult >= st.maxMult
		st.mult = math.Min(st.mult*2, st.maxMult)
		if retry != nil {
			st.hold = maxTime(st.hold, p.clock.Now().Add(secondsToDuration(*retry)))
		}
	}
	r.Multiplier, r.MaxMultiplier = st.mult, st.maxMult
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
