package sources

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	// Cause is the rule that started the cooldown (CauseSlowestPace,
	// CauseRetryAfter, or CauseStop), RetryAfter the Retry-After that came
	// with it (0: none): with the platform's own cooldown and Count they
	// say how its length was decided (Rule).
	Cause      CooldownCause `json:"cause"`
	RetryAfter time.Duration `json:"-"` // JSON: retry_after_s
}

// CooldownCause is the rule that put a platform in cooldown.
type CooldownCause string

// The causes of a cooldown.
const (
	// CauseStop: the fetcher said stop (fetch.RateLimited from a custom
	// fetcher: a quota exhausted, an account suspended).
	CauseStop CooldownCause = ""
	// CauseSlowestPace: the destination pushed back (429, 503) while the
	// platform was already paced as slowly as it may be (the ceiling ÷ its
	// maximum multiplier): slowing down further is not allowed, so the
	// platform stops.
	CauseSlowestPace CooldownCause = "slowest_pace"
	// CauseRetryAfter: a 429 or 503 asked for a Retry-After longer than
	// the fetcher waits out by holding the platform
	// (fetch.HTTPConfig.RateLimitedAfter).
	CauseRetryAfter CooldownCause = "retry_after"
)

// Headline says in a few words why the platform cools down:
// "max multiplier reached", "Retry-After 2h", "the fetcher said stop".
func (c Cooldown) Headline() string {
	switch c.Cause {
	case CauseSlowestPace:
		return "max multiplier reached"
	case CauseRetryAfter:
		return "Retry-After " + HumanDuration(c.RetryAfter)
	}
	return "rate limited"
}

// Rule says in words how the cooldown's length was decided, given the
// platform's own cooldown length: "a 10s Retry-After at the slowest pace →
// the platform's 15m cooldown", "the destination asked for a 2h
// Retry-After → the 2h Retry-After (longer than the platform's 15m
// cooldown), doubled for a repeat within 15m of the last cooldown (×2)".
func (c Cooldown) Rule(platformCooldown time.Duration) string {
	var b strings.Builder
	switch {
	case c.Cause == CauseSlowestPace && c.RetryAfter > 0:
		fmt.Fprintf(&b, "a %s Retry-After came while the platform was paced as slowly as it may be (ceiling ÷ max multiplier)", HumanDuration(c.RetryAfter))
	case c.Cause == CauseSlowestPace:
		b.WriteString("rate pressure came while the platform was paced as slowly as it may be (ceiling ÷ max multiplier)")
	case c.RetryAfter > 0:
		fmt.Fprintf(&b, "the destination asked for a %s Retry-After", HumanDuration(c.RetryAfter))
	default:
		b.WriteString("the fetcher said stop")
	}
	b.WriteString(" → ")
	if c.RetryAfter > platformCooldown {
		fmt.Fprintf(&b, "the %s Retry-After (longer than the platform's %s cooldown)", HumanDuration(c.RetryAfter), HumanDuration(platformCooldown))
	} else {
		fmt.Fprintf(&b, "the platform's %s cooldown", HumanDuration(platformCooldown))
	}
	switch {
	case c.Count == 2:
		fmt.Fprintf(&b, ", doubled for a repeat within %s of the last cooldown (×2)", HumanDuration(platformCooldown))
	case c.Count > 2:
		fmt.Fprintf(&b, ", doubled %d times for %d repeats, each within %s of the last cooldown (×%d)", c.Count-1, c.Count-1,
			HumanDuration(platformCooldown), 1<<min(c.Count-1, 30))
	}
	return b.String()
}

// HumanDuration is d for people, without zero units at the end:
// milliseconds under a second, seconds under an hour, minutes above ("10s",
// "13m30s", "15m", "1h30m").
func HumanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		d = d.Round(time.Second)
	default:
		d = d.Round(time.Minute)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// SetCooldown puts a platform in cooldown after it said stop. The duration is
// max(platform cooldown, retryAfter), doubled for each repeat within one
// cooldown length after the previous ended, capped at 24 h, spread by ±10 %
// according to u (a uniform draw in [0, 1) supplied by the caller's random
// source). Safe when many processes report the same platform at once: one
// row, and an active cooldown is extended, not escalated.
//
// It writes the store's row only: control.CoolDown also holds the
// platform's pacer until the cooldown ends, in the same transaction.
func SetCooldown(ctx context.Context, db Beginner, platform string, retryAfter time.Duration, reason string, u float64) (until time.Time, count int, err error) {
	return SetCooldownFor(ctx, db, platform, CauseStop, retryAfter, reason, u)
}

// SetCooldownFor is SetCooldown recording the rule that started the
// cooldown (Cooldown.Cause), so status can say it.
func SetCooldownFor(ctx context.Context, db Beginner, platform string, cause CooldownCause, retryAfter time.Duration, reason string, u float64) (until time.Time, count int, err error) {
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
	err = tx.QueryRow(ctx, setCooldownSQL, platform, retryAfter.Seconds(), factor, reason, string(cause)).Scan(&until, &count)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, 0, fmt.Errorf("cooldown: platform %q: %w", platform, ErrNotFound)
	}
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("cooldown: set %s: %w", platform, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, 0, fmt.Errorf("cooldown: set %s: %w", platform, err)
	}
	return until, count, nil
}

// ActiveCooldowns lists the platforms cooling down now.
func ActiveCooldowns(ctx context.Context, db DBTX) ([]Cooldown, error) {
	return listCooldowns(ctx, db, activeCooldownsSQL)
}

// CooldownsOf lists the active cooldowns of the named platforms (primary
// key lookups): a page of a dashboard reads its rows only.
func CooldownsOf(ctx context.Context, db DBTX, platforms []string) ([]Cooldown, error) {
	return listCooldowns(ctx, db, cooldownsOfSQL, platforms)
}

func listCooldowns(ctx context.Context, db DBTX, sql string, args ...any) ([]Cooldown, error) {
	out, err := queryRows(ctx, db, scanCooldown, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("cooldown: list: %w", err)
	}
	return out, nil
}

// ClearCooldown ends a platform's cooldown at once and forgets its
// escalation (the next cooldown starts from the platform's own length). It
// returns the cooldown it ended (nil when the platform had none). An
// unknown platform wraps ErrNotFound. It writes the store's rows only:
// control.ClearCooldown also ends the pacer's hold and wakes the snoozed
// fetch jobs, in the same transaction.
func ClearCooldown(ctx context.Context, db Beginner, platform string) (*Cooldown, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("cooldown: clear %s: %w", platform, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if _, err := GetPlatform(ctx, tx, platform); err != nil {
		return nil, fmt.Errorf("cooldown: %w", err)
	}
	cleared, err := queryRows(ctx, tx, scanCooldown, clearCooldownSQL, platform)
	if err != nil {
		return nil, fmt.Errorf("cooldown: clear %s: %w", platform, err)
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
	var retryAfter float64
	err := row.Scan(&c.Platform, &c.Until, &c.Reason, &c.Count, &c.StartedAt, &c.Remaining, &c.Cause, &retryAfter)
	c.RetryAfter = seconds(retryAfter)
	return c, err
}
