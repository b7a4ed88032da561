// Package status assembles what `fleetpace status` and the worker's /status
// endpoint show: every platform with its limits, shared pacer state, active
// cooldown, and queued, due and staleness figures, plus the live workers.
package status

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// Platform is one platform's row of the report.
type Platform struct {
	sources.Platform
	Pace     *pacer.State           `json:"pace,omitempty"` // nil until the platform's first reservation
	Cooldown *sources.Cooldown      `json:"cooldown,omitempty"`
	Counts   sources.PlatformCounts `json:"counts"`
}

// Report is the whole status.
type Report struct {
	At        time.Time  `json:"at"`
	Platforms []Platform `json:"platforms"`
	Workers   int        `json:"live_workers"`
}

// LiveWindow is how recently a worker must have sent a heartbeat to count as
// live.
const LiveWindow = 15 * time.Second

// Read builds the report, reading everything in one repeatable-read
// transaction so the numbers agree with each other.
func Read(ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}) (*Report, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	platforms, err := sources.ListPlatforms(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	paces, err := pacer.States(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	cooldowns, err := sources.ActiveCooldowns(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	counts, err := sources.Counts(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	rep := &Report{}
	if err := tx.QueryRow(ctx, liveWorkersSQL, LiveWindow.Seconds()).Scan(&rep.At, &rep.Workers); err != nil {
		return nil, fmt.Errorf("status: workers: %w", err)
	}
	for _, p := range platforms {
		row := Platform{Platform: p}
		for i := range paces {
			if paces[i].Platform == p.Name {
				row.Pace = &paces[i]
			}
		}
		for i := range cooldowns {
			if cooldowns[i].Platform == p.Name {
				row.Cooldown = &cooldowns[i]
			}
		}
		for _, c := range counts {
			if c.Platform == p.Name {
				row.Counts = c
			}
		}
		rep.Platforms = append(rep.Platforms, row)
	}
	return rep, nil
}

const liveWorkersSQL = `
SELECT now(), count(*) FROM fleetpace_worker
WHERE seen_at > now() - make_interval(secs => $1)`
