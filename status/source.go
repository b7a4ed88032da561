package status

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/fetch"
	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// SourceReport is one source as `fleetpace sources show` and the dashboard
// show it: its settings and state, when it is next checked and what holds
// it back, and its recent checks.
type SourceReport struct {
	At      time.Time              `json:"at"` // the database's time of the read
	Source  sources.Source         `json:"source"`
	History []sources.HistoryEntry `json:"history"` // newest first
	// NextCheck is when the source is next due to be queued: its due time,
	// or later if its platform is cooling down or paused until then. Zero
	// while the platform is paused until resumed, or the source disabled.
	NextCheck time.Time `json:"next_check"`
	// HeldBy says what holds the source back now ("" if nothing): "disabled",
	// "queued", "paused" (a queued source's job waits for the pause too),
	// "cooldown".
	HeldBy string `json:"held_by,omitempty"`
	// Cooldown is its platform's active cooldown, if any.
	Cooldown *sources.Cooldown `json:"cooldown,omitempty"`
	// Pace is its platform's pacer state (pause, hold, effective rate).
	Pace pacer.State `json:"pace"`
	// State is what its platform is doing now, in words (Conditions).
	State []Condition `json:"platform_state"`
	// LastAnswer is its newest check in the history (nil: none recorded):
	// the time, outcome, status and reason of the last answer whatever it
	// was, where Source.LastCheckedAt is the time of the last check that
	// counted (a 429 does not).
	LastAnswer *sources.HistoryEntry `json:"last_answer,omitempty"`
}

// ReadSource reads one source by reference (id or URL, sources.Lookup) with
// its last historyLimit checks (0: sources.DefaultHistoryLimit), in one
// repeatable-read transaction. Errors are sources.Lookup's (ErrNotFound,
// ErrAmbiguous, ErrInvalid) or the database's.
func ReadSource(ctx context.Context, db DB, ref string, historyLimit int) (*SourceReport, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	rep := &SourceReport{}
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&rep.At); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	if rep.Source, err = sources.Lookup(ctx, tx, ref); err != nil {
		return nil, err
	}
	if rep.History, err = sources.History(ctx, tx, rep.Source.ID, historyLimit); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	cooldowns, err := sources.ActiveCooldowns(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	for i := range cooldowns {
		if cooldowns[i].Platform == rep.Source.Platform {
			rep.Cooldown = &cooldowns[i]
		}
	}
	paces, err := pacer.StatesOf(ctx, tx, []string{rep.Source.Platform})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	if len(paces) == 1 {
		rep.Pace = paces[0]
	}
	if len(rep.History) > 0 {
		rep.LastAnswer = &rep.History[0]
	}
	platform, err := sources.GetPlatform(ctx, tx, rep.Source.Platform)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	activity, err := sources.Activity(ctx, tx, sources.ActivityQuery{Platform: platform.Name, Window: RecentWindow})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	recent := Recent{Window: RecentWindow, Checks: map[fetch.Outcome]int64{}}
	for _, a := range activity {
		recent.Checks[a.Outcome] += a.Checks
	}
	workers, err := fleet.Live(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	rep.State = Conditions(platform, rep.Pace, rep.Cooldown, recent, InFlight(workers)[platform.Name])
	s := rep.Source
	rep.NextCheck = s.DueAt
	switch {
	case !s.Enabled:
		rep.HeldBy, rep.NextCheck = "disabled", time.Time{}
	case s.QueuedAt != nil && !rep.Pace.PausedIndefinitely && rep.Pace.Paused <= 0:
		rep.HeldBy = "queued"
	case rep.Pace.PausedIndefinitely:
		rep.HeldBy, rep.NextCheck = "paused", time.Time{}
	case rep.Pace.Paused > 0:
		rep.HeldBy = "paused"
		rep.NextCheck = later(rep.NextCheck, rep.At.Add(rep.Pace.Paused))
		if rep.Cooldown != nil {
			rep.NextCheck = later(rep.NextCheck, rep.Cooldown.Until)
		}
	case rep.Cooldown != nil:
		rep.HeldBy = "cooldown"
		rep.NextCheck = later(rep.NextCheck, rep.Cooldown.Until)
	}
	return rep, nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
