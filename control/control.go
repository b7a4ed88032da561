// Package control is what an operator does to a running fleet — pause and
// resume a platform, clear its cooldown, reset its pace, check sources
// now, delete a platform — each operation one
// transaction across the packages that own the state it changes: the
// pacer's row (package pacer), the store (package sources) and the queue
// (package queue, River's jobs). The command line and the dashboard call
// these functions; they state facts in their errors and leave hints (flags,
// commands) to their callers.
package control

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/queue"
	"github.com/fleetpace/fleetpace/scan"
	"github.com/fleetpace/fleetpace/sources"
)

// DB is what the operations need: a pool (or a connection, or a
// transaction, which makes each operation a savepoint).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PauseOptions says how long a pause lasts and why.
type PauseOptions struct {
	// For is how long the pause lasts; it ends by itself after that.
	// Default 0: until Resume.
	For time.Duration
	// Reason is shown by status (and the dashboard) while the pause lasts.
	Reason string
	// Now is the time For counts from. Default: the database's clock (the
	// one every reservation is judged by).
	Now time.Time
}

// Bounds of PauseOptions. A pause longer than MaxPauseFor (a year, the
// longest interval of a source) is a pause until resumed.
const (
	MaxReasonLen = 500 // bytes
	MaxPauseFor  = sources.MaxInterval
)

// Validate reports an invalid field, wrapping sources.ErrInvalid.
func (o PauseOptions) Validate() error {
	switch {
	case o.For < 0 || o.For > MaxPauseFor:
		return &sources.FieldError{Field: "for", Value: o.For.String(), Reason: fmt.Sprintf("must be in (0, %s] (0: until resumed)", MaxPauseFor)}
	case len(o.Reason) > MaxReasonLen:
		return &sources.FieldError{Field: "reason", Value: string([]rune(o.Reason)[:40]) + "…", Reason: fmt.Sprintf("must be at most %d bytes", MaxReasonLen)}
	case !utf8.ValidString(o.Reason) || strings.ContainsRune(o.Reason, 0):
		return &sources.FieldError{Field: "reason", Value: strings.ToValidUTF8(strings.ReplaceAll(o.Reason, "\x00", ""), "\uFFFD"), Reason: "must be UTF-8 text without NUL"}
	}
	return nil
}

// Pause stops every request to platform from every process of the fleet
// until the pause ends (Resume, or PauseOptions.For): reservations are
// denied, slots already granted are given back at once (pacer.Pause), the
// scan queues none of its sources, and its queued fetch jobs snooze without
// using up attempts. The pause is stored with the pacer's state, so it
// survives restarts. It returns when the pause ends (the zero time: until
// resumed). An unknown platform wraps sources.ErrNotFound.
func Pause(ctx context.Context, db DB, platform string, o PauseOptions) (until time.Time, err error) {
	if err := o.Validate(); err != nil {
		return time.Time{}, fmt.Errorf("pause %s: %w", platform, err)
	}
	if o.For > 0 && !o.Now.IsZero() {
		until = o.Now.Add(o.For)
	}
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		if _, err := sources.GetPlatform(ctx, tx, platform); err != nil {
			return err
		}
		if o.For > 0 && o.Now.IsZero() {
			var err error
			until, err = pacer.PauseFor(ctx, tx, platform, o.For, o.Reason)
			return err
		}
		return pacer.Pause(ctx, tx, platform, until, o.Reason)
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("pause %s: %w", platform, err)
	}
	return until, nil
}

// ErrNotPaused is returned by Resume for a platform that is not paused
// (never, or its pause has ended): nothing was changed.
var ErrNotPaused = errors.New("not paused")

// Resume ends platform's pause at once and makes its fetch jobs snoozed
// meanwhile available now, so they run within about a second in every
// process rather than at their snooze's end. It returns how many jobs it
// woke. A platform that is not paused is left alone: the error wraps
// ErrNotPaused.
func Resume(ctx context.Context, db DB, platform string) (woken int64, err error) {
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		if _, err := sources.GetPlatform(ctx, tx, platform); err != nil {
			return err
		}
		states, err := pacer.StatesOf(ctx, tx, []string{platform})
		if err != nil {
			return err
		}
		if len(states) == 0 || (states[0].Paused <= 0 && !states[0].PausedIndefinitely) {
			return ErrNotPaused
		}
		if err := pacer.Resume(ctx, tx, platform); err != nil {
			return err
		}
		woken, err = queue.WakeFetches(ctx, tx, platform)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("resume %s: %w", platform, err)
	}
	return woken, nil
}

// Cleared is what ClearCooldown did.
type Cleared struct {
	// Cooldown is the cooldown it ended; nil if the platform had none (the
	// pacer's hold, if any, was cleared all the same).
	Cooldown *sources.Cooldown
	// Woken is how many snoozed fetch jobs it made available now.
	Woken int64
}

// CoolDown puts platform in cooldown after it said stop
// (sources.SetCooldownFor: the cooldown's length, escalation and jitter)
// and holds its pacer fleet-wide until the cooldown ends (pacer.Hold: a
// later hold in place stays), in one transaction — a savepoint when db is
// one, so the worker writes the check and the cooldown together. A fetch
// job already queued meets the hold in its reservation (denied, snoozed
// until the end) without a query of its own.
func CoolDown(ctx context.Context, db DB, platform string, cause sources.CooldownCause, retryAfter time.Duration, reason string, u float64) (until time.Time, count int, err error) {
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		var err error
		if until, count, err = sources.SetCooldownFor(ctx, tx, platform, cause, retryAfter, reason, u); err != nil {
			return err
		}
		return pacer.Hold(ctx, tx, platform, until, "cooldown: "+reason)
	})
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("cool down %s: %w", platform, err)
	}
	return until, count, nil
}

// ClearCooldown ends platform's cooldown and the pacer's fleet-wide hold
// (the cooldown's, or a Retry-After's: pacer.ClearHold) at once, forgets
// the cooldown's escalation (sources.ClearCooldown), and makes the
// platform's snoozed fetch jobs available now, in one transaction: every
// process fetches the platform again within about a second.
func ClearCooldown(ctx context.Context, db DB, platform string) (Cleared, error) {
	c, err := clearAndWake(ctx, db, platform, func(tx pgx.Tx) error {
		if err := pacer.ClearHold(ctx, tx, platform); err != nil && !errors.Is(err, pacer.ErrUnknownPlatform) {
			return err
		}
		return nil
	})
	if err != nil {
		return Cleared{}, fmt.Errorf("clear cooldown of %s: %w", platform, err)
	}
	return c, nil
}

// Reset puts platform back at its configured pace from a known state, in
// one transaction: its cooldown ends and its escalation is forgotten
// (sources.ClearCooldown), the pacer forgets what adaptation learnt — the
// backoff multiplier or estimate, holds, the quota the destination
// announced (pacer.Reset) — and its snoozed fetch jobs are made available
// now: every process fetches it again within about a second, at its
// ceiling. An operator's pause stays (Resume ends it). It returns the
// cooldown it ended, if any, and how many jobs it woke.
func Reset(ctx context.Context, db DB, platform string) (Cleared, error) {
	c, err := clearAndWake(ctx, db, platform, func(tx pgx.Tx) error {
		return pacer.Reset(ctx, tx, platform)
	})
	if err != nil {
		return Cleared{}, fmt.Errorf("reset %s: %w", platform, err)
	}
	return c, nil
}

// clearAndWake is what ClearCooldown and Reset share, in one transaction:
// platform's cooldown ends and its escalation is forgotten
// (sources.ClearCooldown), pace tells the pacer what to forget, and the
// platform's snoozed fetch jobs are made available now.
func clearAndWake(ctx context.Context, db DB, platform string, pace func(tx pgx.Tx) error) (Cleared, error) {
	var c Cleared
	err := inTx(ctx, db, func(tx pgx.Tx) error {
		var err error
		if c.Cooldown, err = sources.ClearCooldown(ctx, tx, platform); err != nil {
			return err
		}
		if err := pace(tx); err != nil {
			return err
		}
		c.Woken, err = queue.WakeFetches(ctx, tx, platform)
		return err
	})
	return c, err
}

// Checked is what CheckSources and CheckPlatform did.
type Checked struct {
	// Queued is how many sources got a fetch job now (they had none).
	Queued int `json:"queued"`
	// Woken is how many fetch jobs already queued and snoozed (a long
	// pacer wait, a hold, a pause) were made available now.
	Woken int64 `json:"woken"`
	// Disabled is how many of the sources named by id are disabled: not
	// checked (enable them first).
	Disabled int `json:"disabled"`
}

// CheckSources checks the given sources now, as River UI's "run now" or
// Sidekiq's "retry now" would: each enabled source without a fetch job
// gets one now, and a job already queued and snoozed is made available
// now, in one transaction. The jobs still take their slots from the pacer:
// a check now never goes over a platform's pace, and a paused platform's
// jobs wait for its resume. By id, all or nothing: an id that names no
// source checks nothing (an error wrapping sources.ErrNotFound and
// sources.ErrInvalid).
func CheckSources(ctx context.Context, db DB, client *queue.Client, ids []int64) (Checked, error) {
	var c Checked
	err := inTx(ctx, db, func(tx pgx.Tx) error {
		if err := sources.RequireSources(ctx, tx, ids, "nothing checked"); err != nil {
			return err
		}
		jobs, err := sources.QueuedJobs(ctx, tx, ids)
		if err != nil {
			return err
		}
		if c.Woken, err = queue.WakeJobs(ctx, tx, jobs); err != nil {
			return err
		}
		queued, err := scan.EnqueueTx(ctx, tx, client, ids)
		if err != nil {
			return err
		}
		c.Queued = len(queued)
		c.Disabled, err = sources.CountDisabled(ctx, tx, ids)
		return err
	})
	if err != nil {
		return Checked{}, fmt.Errorf("check: %w", err)
	}
	return c, nil
}

// CheckPlatform checks every enabled source of platform now (CheckSources
// for all of them): those without a job get one, its snoozed jobs are made
// available. An unknown platform wraps sources.ErrNotFound.
func CheckPlatform(ctx context.Context, db DB, client *queue.Client, platform string) (Checked, error) {
	var c Checked
	err := inTx(ctx, db, func(tx pgx.Tx) error {
		var err error
		if c.Woken, err = queue.WakeFetches(ctx, tx, platform); err != nil {
			return err
		}
		queued, err := scan.EnqueuePlatformTx(ctx, tx, client, platform)
		c.Queued = len(queued)
		return err
	})
	if err != nil {
		return Checked{}, fmt.Errorf("check %s: %w", platform, err)
	}
	return c, nil
}

// Deleted is what DeletePlatform deleted.
type Deleted struct {
	sources.PlatformDeletion
	// Jobs is how many of its fetch jobs were waiting in the queue (deleted
	// with it; a job running at that moment finishes).
	Jobs int64 `json:"jobs"`
}

// DeletePlatform deletes a platform, its pacer state, cooldown and history,
// and its waiting fetch jobs, in one transaction (sources.DeletePlatform,
// queue.CancelFetches). A platform that still has sources is refused
// (sources.ErrHasSources) unless withSources.
func DeletePlatform(ctx context.Context, db DB, platform string, withSources bool) (Deleted, error) {
	var d Deleted
	err := inTx(ctx, db, func(tx pgx.Tx) error {
		var err error
		if d.PlatformDeletion, err = sources.DeletePlatform(ctx, tx, platform, withSources); err != nil {
			return err
		}
		d.Jobs, err = queue.CancelFetches(ctx, tx, platform)
		return err
	})
	if err != nil {
		return Deleted{}, fmt.Errorf("delete %s: %w", platform, err)
	}
	return d, nil
}

// inTx runs fn in a transaction of its own and commits it.
func inTx(ctx context.Context, db DB, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
