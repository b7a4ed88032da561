package pacer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is what States needs from a pool, connection or transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// State is one platform's shared pacer state, for humans (fleetpace status).
type State struct {
	Platform      string  `json:"platform"`
	Rate          float64 `json:"rate_per_sec"`
	Burst         int     `json:"burst"`
	Multiplier    float64 `json:"multiplier"`
	MaxMultiplier float64 `json:"max_multiplier"`
	DecayAfter    int     `json:"decay_after"`
	CleanStreak   int     `json:"clean_streak"`
	// EffectiveRate is Rate / Multiplier.
	EffectiveRate float64 `json:"effective_rate_per_sec"`
	// Hold is how long the Retry-After hold still lasts (0: none).
	Hold time.Duration `json:"hold_ns"`
	// CursorAhead is how far the cursor is ahead of now: the wait a
	// reservation made now would get, before burst.
	CursorAhead time.Duration `json:"cursor_ahead_ns"`
}

// States reads every platform's pacer state, ordered by platform name.
func States(ctx context.Context, q Querier) ([]State, error) {
	rows, err := q.Query(ctx, statesSQL)
	if err != nil {
		return nil, fmt.Errorf("pacer: states: %w", err)
	}
	defer rows.Close()
	var out []State
	for rows.Next() {
		var (
			s           State
			burst, dec  int32
			hold, ahead float64
		)
		if err := rows.Scan(&s.Platform, &s.Rate, &burst, &s.MaxMultiplier, &dec,
			&s.Multiplier, &s.CleanStreak, &hold, &ahead); err != nil {
			return nil, fmt.Errorf("pacer: states: %w", err)
		}
		s.Burst, s.DecayAfter = int(burst), int(dec)
		s.Hold, s.CursorAhead = secondsToDuration(hold), secondsToDuration(ahead)
		s.EffectiveRate = s.Rate / max(s.Multiplier, 1)
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pacer: states: %w", err)
	}
	return out, nil
}

// States reads every platform's pacer state through the pacer's own pool.
func (p *Pacer) States(ctx context.Context) ([]State, error) {
	return States(ctx, p.pool)
}
