package pacer

import (
	"context"
	"time"
)

// A granted slot's guarantee: its request leaves by SendBy (the slot plus
// its late tolerance) and reaches the destination within SendSlack of
// that; the schedule is spaced so that every 1-s window then holds at most
// rate + burst. The send-by check runs as the request is written, but a
// process can be paused between the check and the write on a loaded
// machine (two shared cores at a load of 7: a 1-s window of 43 at 40/s +
// burst 2, bound 42). Such a request went out anyway; what can still be
// done is to keep the windows it falls in within the ceiling: the window
// that starts at its late arrival would end on the schedule's slots a
// second later, which it counted without this request. Moving the
// platform's schedule from respaceLead on later by the overrun (the
// cursor, and every granted slot through a re-spacing event) keeps that
// window's count, fleet-wide, as long as the report reaches the others
// within about a second. The write's time is known after it: Feedback.Sent.

// overrunSlack is how much of SendSlack the write may use before its
// request counts as overrun: the rest is the request's carriage and
// reading at the destination.
const overrunSlack = SendSlack / 2

// overrun is how far past its guarantee a request written at sent (local
// clock) may have reached the destination: sent past SendBy + overrunSlack
// (0: within it, or no send-by bound).
func (r Reservation) overrun(sent time.Time) time.Duration {
	if sent.IsZero() || r.SendBy.IsZero() || r.Degraded {
		return 0
	}
	return max(sent.Sub(r.SendBy.Add(overrunSlack)), 0)
}

// shiftForOverrun moves platform's shared schedule later by d after a
// request of it went d past its guarantee (see above), and applies the
// event here at once. A failure is logged, not returned: the request has
// been sent and its answer must still be reported.
func (p *Pacer) shiftForOverrun(ctx context.Context, platform string, d time.Duration) {
	p.overruns.Add(1)
	if shared, _, _ := p.latch.admit(); !shared {
		return // degraded: the local pacing has no shared schedule to move
	}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StatementTimeout)
	defer cancel()
	var ev event
	err := p.pool.QueryRow(qctx, overrunSQL, platform, d.Seconds(), p.stmtNow()).
		Scan(&ev.seq, &ev.at, &ev.interval, &ev.shift, &ev.horizon, &ev.hold)
	if err != nil {
		p.log.Warn("pacer: schedule not moved after a late write", "platform", platform, "overrun", d, "error", err)
		return
	}
	p.log.Debug("pacer: a request was written past its guarantee; the schedule moved later", "platform", platform, "overrun", d)
	p.applyEvent(platform, ev)
}
