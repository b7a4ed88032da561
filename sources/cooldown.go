package sources

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/pacer"
)

// CooldownJitter is the spread of a cooldown's expiry (±10 %), so a fleet
// does not come back to a platform in one burst.
const CooldownJitter = 0.10

// MaxCooldown caps every cooldown.
const MaxCooldown = 24 * time.Hour

// Cooldown is a platform's active pause.
type Cooldown struct {
	Platform  string        `json:"platform"`
	Until     time.Time     `json:"until"`
	Remaining time.Duration `json:"-"` // JSON: remaining_s
	Reason    string        `json:"reason"`
	Count     int           `json:"count"` // escalation level: 1, 2, 3… (duration doubles each)
	StartedAt time.Time     `json:"started_at"`
}

// SetCooldown puts a platform in cooldown after it said stop. The duration is
// max(platform cooldown, retryAfter), doubled for each repeat within one
// cooldown length after the previous ended, capped at 24 h, spread by ±10 %
// according to u (a uniform draw in [0, 1) supplied by the caller's random
// source). Safe when many processes report the same platform at once: one
// row, and an active cooldown is extended, not escalated.
//
// The cooldown is also a fleet-wide hold of the platform's pacer (pacer.Hold,
// in the same transaction: a savepoint when db is a transaction), so a fetch
// job already queued meets it in its reservation (denied, snoozed until the
// end) without a query of its own.
func SetCooldown(ctx context.Context, db Beginner, platform string, retryAfter time.Duration, reason string, u float64) (until time.Time, count int, err error) {
	if retryAfter < 0 {
		retryAfter = 0
	}
	if retryAfter > MaxCooldown {
		retryAfter = MaxCooldown
	}
	factor := 1 + CooldownJitter*(2*u-1)
	tx, err := db.Begin(ctx)
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("cooldown: set %s: %w", platform, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	err = tx.QueryRow(ctx, setCooldownSQL, platform, retryAfter.Seconds(), factor, reason).Scan(&until, &count)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, 0, fmt.Errorf("cooldown: platform %q: %w", platform, ErrNotFound)
	}
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("cooldown: set %s: %w", platform, err)
	}
	if err := pacer.Hold(ctx, tx, platform, until, "cooldown: "+reason); err != nil {
		return time.Time{}, 0, fmt.Errorf("cooldown: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, 0, fmt.Errorf("cooldown: set %s: %w", platform, err)
	}
	return until, count, nil
}

// ActiveCooldowns lists the platforms cooling down now.
func ActiveCooldowns(ctx context.Context, db DBTX) ([]Cooldown, error) {
	rows, err := db.Query(ctx, activeCooldownsSQL)
	if err != nil {
		return nil, fmt.Errorf("cooldown: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanCooldown)
	if err != nil {
		return nil, fmt.Errorf("cooldown: list: %w", err)
	}
	return out, nil
}

// ClearCooldown ends a platform's cooldown at once and forgets its
// escalation (the next cooldown starts from the platform's own length), and
// ends the pacer's fleet-wide hold of the platform (pacer.ClearHold: the
// cooldown's, or a Retry-After's), in one transaction, so every process
// may reserve again at once. It returns the cooldown it ended (nil when the
// platform had none: the hold is cleared anyway). An unknown platform wraps
// ErrNotFound. Fetch jobs snoozed until the cooldown's end run then unless
// the caller reschedules them (control.ClearCooldown does).
func ClearCooldown(ctx context.Context, db Beginner, platform string) (*Cooldown, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("cooldown: clear %s: %w", platform, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := GetPlatform(ctx, tx, platform); err != nil {
		return nil, fmt.Errorf("cooldown: %w", err)
	}
	rows, err := tx.Query(ctx, clearCooldownSQL, platform)
	if err != nil {
		return nil, fmt.Errorf("cooldown: clear %s: %w", platform, err)
	}
	cleared, err := pgx.CollectRows(rows, scanCooldown)
	if err != nil {
		return nil, fmt.Errorf("cooldown: clear %s: %w", platform, err)
	}
	if err := pacer.ClearHold(ctx, tx, platform); err != nil && !errors.Is(err, pacer.ErrUnknownPlatform) {
		return nil, fmt.Errorf("cooldown: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("cooldown: clear %s: %w", platform, err)
	}
	if len(cleared) == 0 {
		return nil, nil
	}
	return &cleared[0], nil
}

func scanCooldown(row pgx.CollectableRow) (Cooldown, error) {
	var c Cooldown
	err := row.Scan(&c.Platform, &c.Until, &c.Reason, &c.Count, &c.StartedAt, &c.Remaining)
	return c, err
}
