package pacer

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is what States needs from a pool, connection or transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// What decides a platform's pace now (State.PacedBy), most constraining
// first.
const (
	PacedByPause     = "paused"    // an operator paused it
	PacedByHold      = "hold"      // a fleet-wide hold: Retry-After, an exhausted quota, a cooldown
	PacedByAnnounced = "announced" // the destination's announced rate-limit headers
	PacedByWindow    = "window"    // a fixed window learned from the destination's refusals
	PacedByBackoff   = "backoff"   // adaptation, after rate pressure: the estimate of the destination's limit, or the multiplier
	PacedByCeiling   = "ceiling"   // the configured rate, unconstrained
)

// State is one platform's shared pacer state, for humans (fleetpace status,
// /status, the dashboard). JSON keys carry their unit (_s: seconds,
// _per_sec: requests per second).
type State struct {
	Platform       string
	Rate           float64 // configured ceiling, requests/s
	Burst          int
	MaxMultiplier  float64
	DecayAfter     int
	BackoffFactor  float64
	RecoveryFactor float64
	Probe          bool
	UseHeaders     bool
	Respace        bool
	// Adapt is how the platform adapts to pressure: "estimate" or
	// "multiplier" (sources.AdaptEstimate, sources.AdaptMultiplier).
	Adapt string
	// Multiplier is the ceiling over the pace adaptation asks for now (1:
	// the ceiling).
	Multiplier  float64
	CleanStreak int
	// Estimate is the destination's limit as the fleet last measured it,
	// requests/s ("estimate" adaptation; 0: none).
	Estimate float64
	// PressureMultiplier is the multiplier where the last pressure episode
	// began (0: none remembered).
	PressureMultiplier float64
	// Hold is how long the fleet-wide hold still lasts (0: none), and why.
	Hold       time.Duration
	HoldReason string
	// Paused is how long the operator's pause still lasts (0: not paused;
	// PausedIndefinitely: until resumed), and why.
	Paused             time.Duration
	PausedIndefinitely bool
	PauseReason        string
	// AnnouncedRate is the rate the destination's headers allow now
	// (requests/s; 0: none in force), for AnnouncedFor more.
	AnnouncedRate float64
	AnnouncedFor  time.Duration
	// EffectiveRate is the rate the fleet paces at (the ceiling, slowed by
	// adaptation or the announced rate, whichever is slower); PacedBy says
	// what decides it now (PacedByPause … PacedByCeiling).
	EffectiveRate float64
	PacedBy       string
	// CursorAhead is how far the cursor is ahead of now: the wait a
	// reservation made now would get, before burst.
	CursorAhead time.Duration
	// Slowdowns counts the platform's slow-downs (events) so far.
	Slowdowns int64
	// Window is the fixed window the fleet learned from the destination's
	// refusals (0: none in force), and WindowQuota the requests it sends in
	// each: each window's quota goes at the ceiling, then the fleet holds
	// until the window's end.
	Window      time.Duration
	WindowQuota int
}

// stateJSON is State as JSON: durations in seconds, under keys that say so.
type stateJSON struct {
	Platform           string  `json:"platform"`
	Rate               float64 `json:"rate_per_sec"`
	Burst              int     `json:"burst"`
	MaxMultiplier      float64 `json:"max_multiplier"`
	DecayAfter         int     `json:"decay_after"`
	BackoffFactor      float64 `json:"backoff_factor"`
	RecoveryFactor     float64 `json:"recovery_factor"`
	Probe              bool    `json:"probe"`
	UseHeaders         bool    `json:"use_headers"`
	Respace            bool    `json:"respace"`
	Adapt              string  `json:"adapt"`
	Multiplier         float64 `json:"multiplier"`
	CleanStreak        int     `json:"clean_streak"`
	Estimate           float64 `json:"estimate_per_sec"`
	PressureMultiplier float64 `json:"pressure_multiplier"`
	Hold               float64 `json:"hold_s"`
	HoldReason         string  `json:"hold_reason,omitempty"`
	Paused             float64 `json:"paused_s"`
	PausedIndefinitely bool    `json:"paused_indefinitely"`
	PauseReason        string  `json:"pause_reason,omitempty"`
	AnnouncedRate      float64 `json:"announced_rate_per_sec"`
	AnnouncedFor       float64 `json:"announced_for_s"`
	EffectiveRate      float64 `json:"effective_rate_per_sec"`
	PacedBy            string  `json:"paced_by"`
	CursorAhead        float64 `json:"cursor_ahead_s"`
	Slowdowns          int64   `json:"slowdowns"`
	Window             float64 `json:"window_s"`
	WindowQuota        int     `json:"window_quota"`
}

// MarshalJSON writes durations as seconds under keys that say so.
func (s State) MarshalJSON() ([]byte, error) {
	return json.Marshal(stateJSON{s.Platform, s.Rate, s.Burst, s.MaxMultiplier, s.DecayAfter, s.BackoffFactor,
		s.RecoveryFactor, s.Probe, s.UseHeaders, s.Respace, s.Adapt, s.Multiplier, s.CleanStreak, s.Estimate,
		s.PressureMultiplier, s.Hold.Seconds(), s.HoldReason, s.Paused.Seconds(), s.PausedIndefinitely, s.PauseReason,
		s.AnnouncedRate, s.AnnouncedFor.Seconds(), s.EffectiveRate, s.PacedBy, s.CursorAhead.Seconds(), s.Slowdowns,
		s.Window.Seconds(), s.WindowQuota})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *State) UnmarshalJSON(b []byte) error {
	var j stateJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = State{j.Platform, j.Rate, j.Burst, j.MaxMultiplier, j.DecayAfter, j.BackoffFactor, j.RecoveryFactor,
		j.Probe, j.UseHeaders, j.Respace, j.Adapt, j.Multiplier, j.CleanStreak, j.Estimate, j.PressureMultiplier,
		secondsToDuration(j.Hold), j.HoldReason, secondsToDuration(j.Paused), j.PausedIndefinitely, j.PauseReason,
		j.AnnouncedRate, secondsToDuration(j.AnnouncedFor), j.EffectiveRate, j.PacedBy,
		secondsToDuration(j.CursorAhead), j.Slowdowns, secondsToDuration(j.Window), j.WindowQuota}
	return nil
}

// States reads every platform's pacer state, ordered by platform name.
func States(ctx context.Context, q Querier) ([]State, error) {
	return states(ctx, q, statesSQL, statementTime(ctx), humanTuning)
}

// StatesOf reads the pacer state of the named platforms (those that exist),
// ordered by name: a page of a dashboard reads its rows only.
func StatesOf(ctx context.Context, q Querier, platforms []string) ([]State, error) {
	return states(ctx, q, statesOfSQL, statementTime(ctx), humanTuning, platforms)
}

func states(ctx context.Context, q Querier, sql string, args ...any) ([]State, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("pacer: states: %w", err)
	}
	defer rows.Close()
	var out []State
	for rows.Next() {
		var (
			s                                 State
			burst, dec                        int32
			hold, paused, annI, annFor, ahead float64
			window                            float64
			quota                             int32
		)
		if err := rows.Scan(&s.Platform, &s.Rate, &burst, &s.MaxMultiplier, &dec,
			&s.BackoffFactor, &s.RecoveryFactor, &s.Probe, &s.UseHeaders, &s.Respace,
			&s.Multiplier, &s.CleanStreak, &s.PressureMultiplier, &s.Adapt, &s.Estimate,
			&hold, &s.HoldReason, &paused, &s.PauseReason, &annI, &annFor, &ahead, &s.Slowdowns, &window, &quota); err != nil {
			return nil, fmt.Errorf("pacer: states: %w", err)
		}
		s.Burst, s.DecayAfter = int(burst), int(dec)
		s.Hold, s.CursorAhead = secondsToDuration(hold), secondsToDuration(ahead)
		s.PausedIndefinitely = math.IsInf(paused, 1)
		s.Paused = clampDuration(secondsToDuration(paused))
		if s.Hold == 0 {
			s.HoldReason = ""
		}
		base := math.Inf(1) // no configuration copied yet: nothing is granted
		if s.Rate > 0 {
			base = max(s.Multiplier, 1) / s.Rate
		}
		interval := base
		if annI > 0 {
			s.AnnouncedRate, s.AnnouncedFor = 1/annI, secondsToDuration(annFor)
			interval = math.Max(base, annI)
		}
		if window > 0 && quota > 0 && annI == 0 {
			// The window's quota at the ceiling, then a hold to its end:
			// in the long run, quota per window.
			s.Window, s.WindowQuota = secondsToDuration(window), int(quota)
			interval = window / float64(quota)
		}
		s.EffectiveRate = 1 / interval
		switch {
		case s.Paused > 0:
			s.PacedBy = PacedByPause
		case s.Hold > 0:
			s.PacedBy = PacedByHold
		case annI > base:
			s.PacedBy = PacedByAnnounced
		case s.Window > 0:
			s.PacedBy = PacedByWindow
		case s.Multiplier > 1.0001:
			s.PacedBy = PacedByBackoff
		default:
			s.PacedBy = PacedByCeiling
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pacer: states: %w", err)
	}
	return out, nil
}

// States reads every platform's pacer state through the pacer's own pool
// (on the pacer's clock when Config.TimeFromClock).
func (p *Pacer) States(ctx context.Context) ([]State, error) {
	return States(p.withTime(ctx), p.pool)
}

// humanTuning is the tuning States reads the pace in force with: its
// adaptive part is every pacer's.
var humanTuning = defaultTuning(DefaultLateBudget).array()
