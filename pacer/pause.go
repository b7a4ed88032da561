package pacer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Execer is what the operations on a platform's pace row need: a pool, a
// connection or a transaction (then the change, and its notification, take
// effect at commit).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Pause stops every request to platform from any process until until (the
// zero time: until Resume), for reason. Slots already granted are given
// back (their callers reserve again and are denied while the pause lasts:
// a River job snoozes), and reservations are denied with Paused set. The
// pause is stored in the platform's pace row, so it survives restarts.
// Returns ErrUnknownPlatform if the platform has no pace row.
func Pause(ctx context.Context, db Execer, platform string, until time.Time, reason string) error {
	at := math.Inf(1)
	if !until.IsZero() {
		at = timeToEpoch(until)
	}
	tag, err := db.Exec(ctx, pauseSQL, platform, at, reason, 0.0, statementTime(ctx))
	if err != nil {
		return fmt.Errorf("pacer: pause %s: %w", platform, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
	}
	return nil
}

// RowQuerier is what PauseFor needs: a pool, a connection or a
// transaction.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PauseFor is Pause for d from now by the database's clock — the clock
// every reservation is judged by, whatever the caller's clock says — and
// returns when the pause ends.
func PauseFor(ctx context.Context, db RowQuerier, platform string, d time.Duration, reason string) (time.Time, error) {
	if d <= 0 {
		return time.Time{}, fmt.Errorf("pacer: pause %s: the duration must be positive (got %s)", platform, d)
	}
	var (
		until float64
		sent  bool
	)
	err := db.QueryRow(ctx, pauseSQL, platform, 0.0, reason, d.Seconds(), statementTime(ctx)).Scan(&until, &sent)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("pacer: pause %s: %w", platform, err)
	}
	return epochToTime(until), nil
}

// Resume ends platform's pause at once. Jobs snoozed by the pause run at
// their snooze's end unless the caller reschedules them (the CLI does).
func Resume(ctx context.Context, db Execer, platform string) error {
	return execOne(ctx, db, "resume", resumeSQL, platform)
}

// Hold holds platform fleet-wide until at least until, for reason: every
// reservation before then, in any process, is denied with a wait that ends
// at until (a fetch job snoozes until then), and slots already granted are
// re-spaced past it (given back when that is beyond their max wait). A
// later hold already in place stays. It is one statement on the platform's
// pace row, so it runs in the caller's transaction when db is one (package
// sources holds the pacer in the transaction that writes a cooldown; the
// notification then goes out at commit). A platform without a pace row is
// left alone.
func Hold(ctx context.Context, db Execer, platform string, until time.Time, reason string) error {
	if _, err := db.Exec(ctx, holdSQL, platform, until, reason, statementTime(ctx)); err != nil {
		return fmt.Errorf("pacer: hold %s: %w", platform, err)
	}
	return nil
}

// ClearHold ends platform's fleet-wide hold (a Retry-After, an exhausted
// quota, a cooldown) and its backoff at once: the next reservation goes
// now, at the configured pace (or a quota the destination announced), and
// slots granted for after the hold are given back (their callers reserve
// again).
func ClearHold(ctx context.Context, db Execer, platform string) error {
	return execOne(ctx, db, "clear hold of", clearHoldSQL, platform, statementTime(ctx))
}

// Reset puts platform's pace back to a known state: no hold, no backoff
// (multiplier 1, no estimate), nothing announced by the destination,
// nothing learnt about what it accepts; the next reservation goes now, at
// the configured pace, as on a platform just created. Slots granted before
// are given back (their callers reserve again). An operator's pause stays
// (Resume ends it). It is two statements on the platform's pace row (what
// adaptation learnt is forgotten, then ClearHold): run it in a transaction
// (db one) for both to take effect at once. Returns ErrUnknownPlatform if
// the platform has no pace row.
func Reset(ctx context.Context, db Execer, platform string) error {
	if err := execOne(ctx, db, "reset", forgetSQL, platform); err != nil {
		return err
	}
	return execOne(ctx, db, "reset", clearHoldSQL, platform, statementTime(ctx))
}

func execOne(ctx context.Context, db Execer, what, sql, platform string, args ...any) error {
	tag, err := db.Exec(ctx, sql, append([]any{platform}, args...)...)
	if err != nil {
		return fmt.Errorf("pacer: %s %s: %w", what, platform, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", ErrUnknownPlatform, platform)
	}
	return nil
}
