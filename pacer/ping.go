package pacer

import (
	"context"
	"fmt"
	"github.com/fleetpace/fleetpace/redact"
)

// Ping checks that the pacer can reach its database now: one connection
// attempt (or a pooled connection) and one round trip. New does not
// connect, so a wrong role or port otherwise shows only at the first
// reservation, paced locally; call Ping after New to fail at start-up
// instead. While an outage is latched it does not dial, and returns the
// outage's cause. The error's message has passwords removed; errors.Is and
// errors.As see its cause.
func (p *Pacer) Ping(ctx context.Context) error {
	if p.latch.latched() {
		cause := p.outageCause()
		if cause == nil {
			cause = errLatched
		}
		return fmt.Errorf("pacer: database unreachable (no new attempt for up to %s after the last): %w",
			p.cfg.Latch, redact.Error(cause))
	}
	if err := p.pool.Ping(ctx); err != nil {
		return fmt.Errorf("pacer: database unreachable: %w", redact.Error(err))
	}
	return nil
}
