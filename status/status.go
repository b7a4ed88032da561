// Package status assembles what `fleetpace status`, the worker's /status
// endpoint and its fleet-wide metrics show: every platform with its limits,
// shared pacer state, active cooldown, and queued, due and staleness
// figures, plus the live workers.
package status

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetpace/fleetpace/fleet"
	"github.com/fleetpace/fleetpace/pacer"
	"github.com/fleetpace/fleetpace/sources"
)

// Platform is one platform's row of the report.
type Platform struct {
	sources.Platform
	Pace     pacer.State            `json:"pace"` // every platform has a pace row
	Cooldown *sources.Cooldown      `json:"cooldown,omitempty"`
	Counts   sources.PlatformCounts `json:"counts"`
}

// Report is the whole status.
type Report struct {
	At        time.Time      `json:"at"` // the database's time of the read
	Platforms []Platform     `json:"platforms"`
	Workers   int            `json:"live_workers"`
	Fleet     []fleet.Worker `json:"workers"` // the live workers, longest running first
}

// DB is what Read needs: a pool or a connection.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Read builds the report, reading everything in one repeatable-read
// transaction so the numbers agree with each other. It runs the per-source
// counts and staleness (sources.Counts), a scan of every source: Cache
// shares one read between frequent callers.
func Read(ctx context.Context, db DB) (*Report, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only
	rep := &Report{}
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&rep.At); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
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
	if rep.Fleet, err = fleet.Live(ctx, tx); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	rep.Workers = len(rep.Fleet)
	pace := make(map[string]pacer.State, len(paces))
	for _, s := range paces {
		pace[s.Platform] = s
	}
	count := make(map[string]sources.PlatformCounts, len(counts))
	for _, c := range counts {
		count[c.Platform] = c
	}
	cooldown := make(map[string]*sources.Cooldown, len(cooldowns))
	for i := range cooldowns {
		cooldown[cooldowns[i].Platform] = &cooldowns[i]
	}
	for _, p := range platforms {
		rep.Platforms = append(rep.Platforms, Platform{Platform: p, Pace: pace[p.Name], Cooldown: cooldown[p.Name], Counts: count[p.Name]})
	}
	return rep, nil
}
